package adminserve

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
)

// CookieName is the cookie that carries the token for the status page.
const CookieName = "nstance_admin_token"

// TokenParam is the query parameter of the URL that opens the status page
// once: GET /?token=... sets the cookie and redirects to /.
const TokenParam = "token"

// MaxBody bounds every request body (1 MiB).
const MaxBody = 1 << 20

// Options configure Handler.
type Options struct {
	// Token is the credential every request must carry. Required.
	Token string
	// AllowedHosts are host names (or host:port) a request's Host may name
	// besides localhost and IP addresses (--allowed-host).
	AllowedHosts []string
	// Log receives one line per refused request (never the token).
	Log logr.Logger
}

// Handler serves next behind the checks, in this order: Host (421), Origin
// and Sec-Fetch-Site (403), token (401), Content-Type of a body (415). A
// body is bounded to MaxBody. GET /?token=TOKEN sets an HttpOnly,
// SameSite=Strict cookie and redirects to /, so the token leaves the
// address bar; API clients send Authorization: Bearer TOKEN.
func Handler(o Options, next http.Handler) (http.Handler, error) {
	if len(o.Token) < minTokenLen {
		return nil, fmt.Errorf("serve token: at least %d characters are required", minTokenLen)
	}
	hosts := map[string]bool{}
	for _, h := range o.AllowedHosts {
		h = strings.ToLower(strings.TrimSpace(h))
		if h == "" || strings.ContainsAny(h, "/ @?#") {
			return nil, fmt.Errorf("--allowed-host %q: want a host name or host:port", h)
		}
		hosts[h] = true
	}
	return &guard{sum: sha256.Sum256([]byte(o.Token)), hosts: hosts, log: o.Log, next: next}, nil
}

type guard struct {
	sum   [32]byte
	hosts map[string]bool
	log   logr.Logger
	next  http.Handler
}

// WriteError writes {"error": msg} with code.
func WriteError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

func (g *guard) refuse(w http.ResponseWriter, r *http.Request, code int, msg string) {
	g.log.Info("refused a request", "method", r.Method, "path", r.URL.Path, "host", r.Host, "origin", r.Header.Get("Origin"), "remote", r.RemoteAddr, "status", code, "reason", msg)
	WriteError(w, code, msg)
}

func (g *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	if !g.hostAllowed(r.Host) {
		g.refuse(w, r, http.StatusMisdirectedRequest, fmt.Sprintf("Host %q is not served here: use localhost or an IP address, or start serve with --allowed-host NAME", r.Host))
		return
	}
	if origin := r.Header.Get("Origin"); origin != "" && origin != g.selfOrigin(r) {
		g.refuse(w, r, http.StatusForbidden, fmt.Sprintf("Origin %q is not this server's own (%s): requests from other sites are refused", origin, g.selfOrigin(r)))
		return
	}
	if site := r.Header.Get("Sec-Fetch-Site"); (site == "cross-site" || site == "same-site") && !(r.Method == http.MethodGet && r.Header.Get("Sec-Fetch-Mode") == "navigate") {
		g.refuse(w, r, http.StatusForbidden, "Sec-Fetch-Site "+site+": requests from other sites are refused")
		return
	}
	if r.Method == http.MethodGet && r.URL.Path == "/" && r.URL.Query().Has(TokenParam) {
		g.openPage(w, r)
		return
	}
	if !g.authorized(r) {
		h.Set("WWW-Authenticate", `Bearer realm="nstance-admin serve"`)
		g.refuse(w, r, http.StatusUnauthorized, "a credential is required: send Authorization: Bearer <token> (the token is in serve's token file), or open the status page with the URL serve printed when it created the token (/?token=...)")
		return
	}
	if r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
		mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || mt != "application/json" {
			g.refuse(w, r, http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Type %q: a body must be application/json", r.Header.Get("Content-Type")))
			return
		}
		if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
			g.refuse(w, r, http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Type %q: JSON must be UTF-8", r.Header.Get("Content-Type")))
			return
		}
		if r.ContentLength > MaxBody {
			g.refuse(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("body of %d bytes: at most %d bytes are accepted", r.ContentLength, MaxBody))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, MaxBody)
	}
	g.next.ServeHTTP(w, r)
}

// openPage checks the token of GET /?token=..., sets the cookie and
// redirects to / (the token does not stay in the address bar or history).
func (g *guard) openPage(w http.ResponseWriter, r *http.Request) {
	if !g.valid(r.URL.Query().Get(TokenParam)) {
		g.refuse(w, r, http.StatusUnauthorized, "the token in the URL is not this server's: open the URL serve printed when it created the token, or read it from serve's token file")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: r.URL.Query().Get(TokenParam), Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func (g *guard) authorized(r *http.Request) bool {
	if auth := r.Header.Get("Authorization"); auth != "" {
		scheme, tok, ok := strings.Cut(auth, " ")
		return ok && strings.EqualFold(scheme, "Bearer") && g.valid(strings.TrimSpace(tok))
	}
	c, err := r.Cookie(CookieName)
	return err == nil && g.valid(c.Value)
}

// valid compares in constant time (over digests, so the length does not
// show either).
func (g *guard) valid(tok string) bool {
	sum := sha256.Sum256([]byte(tok))
	return tok != "" && subtle.ConstantTimeCompare(sum[:], g.sum[:]) == 1
}

func (g *guard) selfOrigin(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + strings.ToLower(r.Host)
}

// hostAllowed: a DNS rebinding attack needs a name the attacker controls,
// so the Host may name localhost, an IP address, or an allowed name (any
// port, so that port forwarding works; an allowed host:port must match
// exactly).
func (g *guard) hostAllowed(hostport string) bool {
	hostport = strings.ToLower(hostport)
	if hostport == "" {
		return false
	}
	if g.hosts[hostport] {
		return true
	}
	host := hostport
	if h, port, err := net.SplitHostPort(hostport); err == nil {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return false
		}
		host = h
	} else if strings.Contains(hostport, ":") {
		// Only a bare IPv6 address has colons and no port.
		if net.ParseIP(hostport) == nil {
			return false
		}
	}
	if host == "localhost" || g.hosts[host] {
		return true
	}
	return net.ParseIP(host) != nil
}

// JSONErrors serves mux, answering what mux itself would refuse (no route:
// 404; a route without this method: 405 with Allow; a path to clean: its
// redirect) with a JSON error instead of mux's text.
func JSONErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		rec := &statusOnly{header: http.Header{}, code: http.StatusNotFound}
		mux.ServeHTTP(rec, r)
		for _, k := range []string{"Allow", "Location"} {
			if v := rec.header.Get(k); v != "" {
				w.Header().Set(k, v)
			}
		}
		WriteError(w, rec.code, fmt.Sprintf("%s %s: %s", r.Method, r.URL.Path, strings.ToLower(http.StatusText(rec.code))))
	})
}

// statusOnly keeps the status and headers a handler writes, dropping its body.
type statusOnly struct {
	header http.Header
	code   int
	wrote  bool
}

func (s *statusOnly) Header() http.Header { return s.header }
func (s *statusOnly) Write(b []byte) (int, error) {
	s.wrote = true
	return len(b), nil
}
func (s *statusOnly) WriteHeader(code int) {
	if !s.wrote {
		s.code, s.wrote = code, true
	}
}
