package chaos

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// resetProxy is an HTTP proxy in front of dev-s3. It forwards every request;
// for the first `resets` PUTs whose path matches, it waits for dev-s3's
// answer (the write is committed) and then resets the client's TCP
// connection instead of relaying it: a reply lost on the network.
type resetProxy struct {
	upstream string
	match    string
	left     atomic.Int32
	// resets counts the replies dropped, conflicts the 412s dev-s3 gave to
	// matching PUTs (the SDK's retry of a committed create).
	resets, conflicts atomic.Int32
	client            *http.Client
	URL               string
}

func startResetProxy(t *testing.T, upstream, match string, resets int) *resetProxy {
	t.Helper()
	p := &resetProxy{upstream: upstream, match: match, client: &http.Client{
		Transport:     &http.Transport{DisableCompression: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
	p.left.Store(int32(resets))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	p.URL = "http://" + ln.Addr().String()
	return p
}

func (p *resetProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, p.upstream+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	out.Host = r.Host
	out.ContentLength = int64(len(body))
	resp, err := p.client.Do(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	respBody, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	matching := r.Method == http.MethodPut && strings.Contains(r.URL.Path, p.match)
	if matching && resp.StatusCode == http.StatusPreconditionFailed {
		p.conflicts.Add(1)
	}
	if matching && p.left.Add(-1) >= 0 {
		p.resets.Add(1)
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			if tc, ok := conn.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // close with RST
			}
			_ = conn.Close()
			return
		}
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(respBody)
}
