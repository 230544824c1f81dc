// Package devguard keeps web pages away from the development servers
// (dev-s3, dev-k8s). A page the developer opens in a browser can send
// requests to 127.0.0.1; two things stop it from reading or changing what
// these servers hold:
//
//   - No CORS: the servers send no Access-Control-* headers and refuse every
//     OPTIONS request (a preflight), so a page of another origin can neither
//     read an answer nor send anything but a "simple" request.
//   - No cross-origin requests at all: CORS aside, a page can send "simple"
//     requests (an HTML form's multipart POST, which gofakes3 turns into a
//     PutObject) to any origin without asking. A request that a browser
//     marks as coming from another page (Sec-Fetch-Site cross-site or
//     same-site, i.e. another origin, whatever the port) or, from a browser
//     that sends no Sec-Fetch-Site, whose Origin is not the server's own is
//     refused with 403. Programs (SDKs, the aws
//     CLI, kubectl) send neither header; a URL typed into the browser is
//     "Sec-Fetch-Site: none" and works.
//   - A Host allow-list against DNS rebinding: a page served from a name the
//     attacker controls (evil.test) can re-point that name to 127.0.0.1 and
//     then make same-origin requests, which carry "Host: evil.test:<port>".
//     Such requests are refused with 421 Misdirected Request before anything
//     is read or written.
//
// Allowed Host values: any IP address literal (a browser sends one only to
// the address it names, so a rebound name can never produce it; this covers
// a listener on 0.0.0.0 or :: reached through any of the machine's
// addresses, or through a forwarded port), "localhost" (browsers resolve it
// to loopback themselves), a request without Host (HTTP/1.0; browsers always
// send one), and the names given in Options.AllowedHosts. The port is not
// compared for IP literals and localhost: rebinding needs a name, whatever
// the port.
package devguard

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// Options configures a Guard.
type Options struct {
	// Server names the server in refusals ("dev-s3").
	Server string
	// Flag names the option that adds allowed names, for the refusal
	// message ("--allowed-host").
	Flag string
	// AllowedHosts are the extra names clients use: "name" (any port) or
	// "name:port" (that port only). IP literals and localhost need no entry.
	AllowedHosts []string
}

// Guard checks requests before a development server handles them.
type Guard struct {
	opts  Options
	names []allowedName
}

type allowedName struct {
	host string // lower case
	port string // empty: any
}

// New validates the allowed names.
func New(opts Options) (*Guard, error) {
	g := &Guard{opts: opts}
	for _, h := range opts.AllowedHosts {
		n, err := parseAllowed(h)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", opts.Flag, h, err)
		}
		g.names = append(g.names, n)
	}
	return g, nil
}

// parseAllowed reads "name" or "name:port".
func parseAllowed(s string) (allowedName, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return allowedName{}, fmt.Errorf("empty host name")
	}
	if strings.ContainsAny(s, "/@?# ") {
		return allowedName{}, fmt.Errorf("want a host name or host:port, not a URL")
	}
	host, port := s, ""
	if h, p, err := net.SplitHostPort(s); err == nil {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return allowedName{}, fmt.Errorf("port %q is not a number from 1 to 65535", p)
		}
		host, port = h, p
	}
	host = strings.Trim(host, "[]")
	if host == "" {
		return allowedName{}, fmt.Errorf("empty host name")
	}
	return allowedName{host: strings.ToLower(host), port: port}, nil
}

// Allowed reports whether a request's Host value names this server (see the
// package comment).
func (g *Guard) Allowed(hostHeader string) bool {
	if hostHeader == "" {
		return true
	}
	host, port := hostHeader, ""
	if h, p, err := net.SplitHostPort(hostHeader); err == nil {
		host, port = h, p
	} else if strings.HasPrefix(hostHeader, "[") && strings.HasSuffix(hostHeader, "]") {
		host = hostHeader[1 : len(hostHeader)-1]
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	host = strings.ToLower(host)
	if host == "localhost" {
		return true
	}
	for _, n := range g.names {
		if n.host == host && (n.port == "" || n.port == port) {
			return true
		}
	}
	return false
}

// Wrap refuses, before next sees them, requests whose Host is not allowed
// (421), requests from another origin's web page (403) and OPTIONS requests
// (403: CORS preflights are never granted).
func (g *Guard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.Allowed(r.Host) {
			refuse(w, http.StatusMisdirectedRequest, fmt.Sprintf(
				"%s: refused: Host %q is not an address of this server (allowed: IP addresses, localhost and the names given with %s); a web page using a re-pointed (DNS rebinding) name would send it",
				g.opts.Server, r.Host, g.opts.Flag))
			return
		}
		if why := foreignPage(r); why != "" {
			refuse(w, http.StatusForbidden, fmt.Sprintf(
				"%s: refused: a request from another web page (%s): cross-origin requests from web pages are not served", g.opts.Server, why))
			return
		}
		if r.Method == http.MethodOptions {
			refuse(w, http.StatusForbidden, fmt.Sprintf(
				"%s: refused: OPTIONS (CORS preflight): cross-origin requests from web pages are not served", g.opts.Server))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// foreignPage says why r comes from a web page of another origin, or "".
// Sec-Fetch-Site, which a page cannot set, decides when present (so a
// same-origin page behind a proxy such as kubectl proxy, whose Origin names
// the proxy, still works); without it (older browsers) a foreign Origin
// does.
func foreignPage(r *http.Request) string {
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "cross-site", "same-site":
		return "Sec-Fetch-Site: " + site
	case "same-origin", "none":
		return ""
	}
	if o := r.Header.Get("Origin"); o != "" && !strings.EqualFold(o, "http://"+r.Host) && !strings.EqualFold(o, "https://"+r.Host) {
		return "Origin: " + o
	}
	return ""
}

func refuse(w http.ResponseWriter, status int, msg string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Connection", "close")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(msg + "\n"))
}

// StripCORS removes every Access-Control-* header next sets on its
// responses (gofakes3 grants every origin by itself).
func StripCORS(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := &noCORSWriter{ResponseWriter: w}
		next.ServeHTTP(n, r)
		// A handler that writes nothing has its header sent after it
		// returns.
		if !n.sent {
			n.strip()
		}
	})
}

// noCORSWriter deletes Access-Control-* headers when the header is sent.
type noCORSWriter struct {
	http.ResponseWriter
	sent bool
}

func (n *noCORSWriter) strip() {
	h := n.ResponseWriter.Header()
	for k := range h {
		if len(k) >= len(corsPrefix) && strings.EqualFold(k[:len(corsPrefix)], corsPrefix) {
			delete(h, k)
		}
	}
}

const corsPrefix = "Access-Control-"

func (n *noCORSWriter) WriteHeader(code int) {
	n.strip()
	if code >= 200 {
		n.sent = true
	}
	n.ResponseWriter.WriteHeader(code)
}

func (n *noCORSWriter) Write(p []byte) (int, error) {
	if !n.sent {
		n.strip()
		n.sent = true
	}
	return n.ResponseWriter.Write(p)
}

func (n *noCORSWriter) Flush() {
	if !n.sent {
		n.strip()
		n.sent = true
	}
	if f, ok := n.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (n *noCORSWriter) Unwrap() http.ResponseWriter { return n.ResponseWriter }
