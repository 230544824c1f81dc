package devguard

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestAllowed(t *testing.T) {
	g, err := New(Options{Server: "dev-x", Flag: "--allowed-host", AllowedHosts: []string{"devbox.lan", "s3.devbox.lan:8989", "[fd00::1]"}})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{
		"":                     true,
		"127.0.0.1:8989":       true,
		"127.0.0.1":            true,
		"10.1.2.3:1":           true, // any IP literal: a listener on 0.0.0.0
		"[::1]:8989":           true,
		"[::1]":                true,
		"localhost:8989":       true,
		"LocalHost:1234":       true,
		"localhost":            true,
		"devbox.lan:8989":      true,
		"DEVBOX.lan":           true,
		"s3.devbox.lan:8989":   true,
		"s3.devbox.lan:9999":   false, // the entry names its port
		"s3.devbox.lan":        false,
		"evil.test:8989":       false,
		"evil.test":            false,
		"localhost.evil.test":  false,
		"127.0.0.1.evil.test":  false,
		"foo.localhost:8989":   false,
		"localhost.:8989":      false,
		"0x7f.1:8989":          false,
		"devbox.lan.evil.test": false,
	} {
		if got := g.Allowed(host); got != want {
			t.Errorf("Allowed(%q) = %v, want %v", host, got, want)
		}
	}
}

func TestNewRefusesBadNames(t *testing.T) {
	for _, h := range []string{"", " ", "http://devbox.lan", "devbox.lan/x", "devbox.lan:0", "devbox.lan:http", "devbox.lan:70000", ":8989"} {
		_, err := New(Options{Flag: "--allowed-host", AllowedHosts: []string{h}})
		if err == nil {
			t.Errorf("New accepted %q", h)
			continue
		}
		if !strings.Contains(err.Error(), "--allowed-host") {
			t.Errorf("error for %q does not name the flag: %v", h, err)
		}
	}
}

func TestWrap(t *testing.T) {
	g, err := New(Options{Server: "dev-x", Flag: "--allowed-host"})
	if err != nil {
		t.Fatal(err)
	}
	called := 0
	h := g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { called++; w.WriteHeader(http.StatusNoContent) }))
	do := func(method, host string, hdr map[string]string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, "http://127.0.0.1:8989/dev/config/dev-1.jsonc", nil)
		r.Host = host
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	if w := do(http.MethodPut, "evil.test:8989", nil); w.Code != http.StatusMisdirectedRequest || !strings.Contains(w.Body.String(), `Host "evil.test:8989"`) || !strings.Contains(w.Body.String(), "--allowed-host") {
		t.Errorf("rebinding Host: %d %q", w.Code, w.Body.String())
	}
	if w := do(http.MethodOptions, "127.0.0.1:8989", map[string]string{"Origin": "http://evil.test", "Access-Control-Request-Method": "PUT"}); w.Code != http.StatusForbidden || len(corsOf(w.Header())) > 0 {
		t.Errorf("preflight: %d %v", w.Code, w.Header())
	}
	for _, hdr := range []map[string]string{
		{"Origin": "http://evil.test"},
		{"Origin": "null"},
		{"Origin": "http://127.0.0.1:3000"},
		{"Sec-Fetch-Site": "cross-site"},
		{"Sec-Fetch-Site": "same-site"}, // another port of the same host
	} {
		if w := do(http.MethodPost, "127.0.0.1:8989", hdr); w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "another web page") {
			t.Errorf("request with %v: %d %q", hdr, w.Code, w.Body.String())
		}
	}
	if called != 0 {
		t.Fatalf("the handler ran for a refused request")
	}
	for _, hdr := range []map[string]string{
		{"Origin": "http://127.0.0.1:8989", "Sec-Fetch-Site": "same-origin"},
		{"Sec-Fetch-Site": "none"}, // typed into the address bar
		// A same-origin page behind a proxy (kubectl proxy): Origin names
		// the proxy, Sec-Fetch-Site decides.
		{"Origin": "http://127.0.0.1:8001", "Sec-Fetch-Site": "same-origin"},
	} {
		if w := do(http.MethodGet, "127.0.0.1:8989", hdr); w.Code != http.StatusNoContent {
			t.Errorf("request with %v: %d %q", hdr, w.Code, w.Body.String())
		}
	}
	called = 0
	if w := do(http.MethodGet, "127.0.0.1:8989", nil); w.Code != http.StatusNoContent || called != 1 {
		t.Errorf("allowed request: %d, handler called %d times", w.Code, called)
	}
}

func TestStripCORS(t *testing.T) {
	h := StripCORS(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Access-Control-Allow-Origin", "*")
		w.Header()["access-control-allow-methods"] = []string{"PUT"}
		w.Header().Set("ETag", `"x"`)
		_, _ = w.Write([]byte("body"))
		w.Header().Set("Access-Control-Expose-Headers", "ETag") // too late: not sent
	}))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	res := w.Result()
	if c := corsOf(res.Header); len(c) > 0 {
		t.Errorf("CORS headers sent: %v", c)
	}
	if res.Header.Get("ETag") != `"x"` || w.Body.String() != "body" {
		t.Errorf("other headers or body lost: %v %q", res.Header, w.Body.String())
	}
	// A handler that returns without writing.
	h = StripCORS(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Header().Set("Access-Control-Allow-Origin", "*") }))
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPut, "/", nil))
	if c := corsOf(w.Result().Header); len(c) > 0 {
		t.Errorf("CORS headers sent by a handler that wrote nothing: %v", c)
	}
	if _, ok := (&noCORSWriter{ResponseWriter: w}).Unwrap().(http.Flusher); !ok {
		t.Errorf("Unwrap does not reach the Flusher")
	}
}

func corsOf(h http.Header) []string {
	var out []string
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "access-control-") {
			out = append(out, k)
		}
	}
	return out
}
