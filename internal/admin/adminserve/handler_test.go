package adminserve_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/admin/adminserve"
)

const token = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFG"

// backend answers 200 "ok" and records whether it ran and what body it read.
type backend struct {
	ran  bool
	body string
	err  error
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.ran = true
	raw, err := io.ReadAll(r.Body)
	b.body, b.err = string(raw), err
	_, _ = w.Write([]byte("ok"))
}

func guarded(t *testing.T, hosts ...string) (http.Handler, *backend) {
	t.Helper()
	b := &backend{}
	h, err := adminserve.Handler(adminserve.Options{Token: token, AllowedHosts: hosts}, b)
	require.NoError(t, err)
	return h, b
}

type req struct {
	method, target, host, body string
	hdr                        map[string]string
}

func (q req) do(h http.Handler) *httptest.ResponseRecorder {
	method := q.method
	if method == "" {
		method = "GET"
	}
	var body io.Reader
	if q.body != "" {
		body = strings.NewReader(q.body)
	}
	r := httptest.NewRequest(method, q.target, body)
	r.Host = "127.0.0.1:8980"
	if q.host != "" {
		r.Host = q.host
	}
	if q.host == "-" {
		r.Host = ""
	}
	for k, v := range q.hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func auth(extra ...string) map[string]string {
	m := map[string]string{"Authorization": "Bearer " + token}
	for i := 0; i+1 < len(extra); i += 2 {
		m[extra[i]] = extra[i+1]
	}
	return m
}

func requireJSONError(t *testing.T, w *httptest.ResponseRecorder, code int, contains string) {
	t.Helper()
	require.Equal(t, code, w.Code, w.Body.String())
	require.Equal(t, "application/json", w.Header().Get("Content-Type"))
	var v struct{ Error string }
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &v), w.Body.String())
	require.Contains(t, v.Error, contains)
}

func TestTokenRequired(t *testing.T) {
	h, b := guarded(t)
	for name, hdr := range map[string]map[string]string{
		"none":          nil,
		"wrong bearer":  {"Authorization": "Bearer " + token[:len(token)-1] + "X"},
		"prefix":        {"Authorization": "Bearer " + token[:10]},
		"longer":        {"Authorization": "Bearer " + token + "X"},
		"basic":         {"Authorization": "Basic " + token},
		"empty bearer":  {"Authorization": "Bearer "},
		"wrong cookie":  {"Cookie": adminserve.CookieName + "=nope"},
		"token as user": {"Cookie": "other=" + token},
	} {
		t.Run(name, func(t *testing.T) {
			for _, path := range []string{"/", "/v1/status", "/v1/status/events", "/v1/shards", "/v1/shards/dev-1/groups/g/scale"} {
				w := req{target: path, hdr: hdr}.do(h)
				requireJSONError(t, w, http.StatusUnauthorized, "credential")
				require.Contains(t, w.Header().Get("WWW-Authenticate"), "Bearer")
			}
			require.False(t, b.ran)
		})
	}
	require.Equal(t, http.StatusOK, req{target: "/v1/shards", hdr: auth()}.do(h).Code)
	require.Equal(t, http.StatusOK, req{target: "/v1/shards", hdr: map[string]string{"Authorization": "bearer " + token}}.do(h).Code)
	require.Equal(t, http.StatusOK, req{target: "/", hdr: map[string]string{"Cookie": adminserve.CookieName + "=" + token}}.do(h).Code)
	// The query token opens only the page, not the API.
	requireJSONError(t, req{target: "/v1/shards?token=" + token}.do(h), http.StatusUnauthorized, "credential")
}

func TestTokenURLSetsCookie(t *testing.T) {
	h, b := guarded(t)
	w := req{target: "/?token=" + token}.do(h)
	require.Equal(t, http.StatusSeeOther, w.Code)
	require.Equal(t, "/", w.Header().Get("Location"), "the token leaves the address bar")
	require.False(t, b.ran)
	cookies := (&http.Response{Header: w.Header()}).Cookies()
	require.Len(t, cookies, 1)
	c := cookies[0]
	require.Equal(t, adminserve.CookieName, c.Name)
	require.Equal(t, token, c.Value)
	require.True(t, c.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, c.SameSite)
	require.Equal(t, "/", c.Path)

	w = req{target: "/?token=wrong"}.do(h)
	requireJSONError(t, w, http.StatusUnauthorized, "not this server's")
	require.Empty(t, w.Header().Values("Set-Cookie"))
}

func TestHostChecked(t *testing.T) {
	h, b := guarded(t, "admin.example", "proxy.example:8443")
	for _, host := range []string{"evil.test:8980", "evil.test", "127.0.0.1.evil.test:8980", "localhost.evil.test:8980", "-",
		"proxy.example:9999", "admin.example.evil:8980", "a:b:c", "[::1", "localhost:8980@evil"} {
		w := req{target: "/v1/shards", host: host, hdr: auth()}.do(h)
		requireJSONError(t, w, http.StatusMisdirectedRequest, "is not served here")
	}
	require.False(t, b.ran)
	for _, host := range []string{"127.0.0.1:8980", "localhost:8980", "LOCALHOST:8980", "localhost", "[::1]:8980", "::1", "10.1.2.3:9000",
		"admin.example", "admin.example:8980", "Admin.Example:1", "proxy.example:8443"} {
		w := req{target: "/v1/shards", host: host, hdr: auth()}.do(h)
		require.Equal(t, http.StatusOK, w.Code, "Host %q: %s", host, w.Body.String())
	}
	_, err := adminserve.Handler(adminserve.Options{Token: token, AllowedHosts: []string{"http://x"}}, &backend{})
	require.ErrorContains(t, err, "--allowed-host")
	_, err = adminserve.Handler(adminserve.Options{Token: "short"}, &backend{})
	require.Error(t, err)
}

func TestOriginChecked(t *testing.T) {
	h, b := guarded(t)
	for _, hdr := range []map[string]string{
		auth("Origin", "http://evil.test"),
		auth("Origin", "null"),
		auth("Origin", "https://127.0.0.1:8980"),
		auth("Origin", "http://127.0.0.1:8981"),
		auth("Origin", "http://localhost:8980"),
		auth("Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "cors"),
		auth("Sec-Fetch-Site", "same-site", "Sec-Fetch-Mode", "no-cors"),
		{"Cookie": adminserve.CookieName + "=" + token, "Origin": "http://evil.test", "Content-Type": "text/plain"},
	} {
		w := req{method: "POST", target: "/v1/shards/dev-1/groups/g/scale", body: `{"size":0}`, hdr: hdr}.do(h)
		requireJSONError(t, w, http.StatusForbidden, "other sites")
	}
	require.False(t, b.ran)
	w := req{method: "POST", target: "/v1/shards/dev-1/groups/g/scale", body: `{"size":0}`,
		hdr: auth("Origin", "http://127.0.0.1:8980", "Sec-Fetch-Site", "same-origin", "Content-Type", "application/json")}.do(h)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	// A link from another site to the page is a navigation: no cookie comes
	// with it (SameSite=Strict), so it gets 401, not 403.
	w = req{target: "/", hdr: map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}}.do(h)
	require.Equal(t, http.StatusUnauthorized, w.Code)
}

func TestBodyMustBeJSON(t *testing.T) {
	h, b := guarded(t)
	for _, ct := range []string{"", "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
		"application/json; charset=latin1", "application/jsonx", "application/json,text/plain"} {
		w := req{method: "POST", target: "/v1/shards/dev-1/groups/g/scale", body: `{"size":0}`, hdr: auth("Content-Type", ct)}.do(h)
		requireJSONError(t, w, http.StatusUnsupportedMediaType, "application/json")
	}
	require.False(t, b.ran)
	for _, ct := range []string{"application/json", "Application/JSON", "application/json; charset=utf-8"} {
		w := req{method: "POST", target: "/v1/shards/dev-1/groups/g/scale", body: `{"size":0}`, hdr: auth("Content-Type", ct)}.do(h)
		require.Equal(t, http.StatusOK, w.Code, ct)
		require.Equal(t, `{"size":0}`, b.body)
	}
	// A declared body over the limit is refused before the handler; an
	// undeclared one (chunked) is cut by MaxBytesReader.
	big := strings.Repeat(" ", adminserve.MaxBody+1)
	w := req{method: "POST", target: "/v1/shards/x", body: big, hdr: auth("Content-Type", "application/json")}.do(h)
	requireJSONError(t, w, http.StatusRequestEntityTooLarge, "at most 1048576 bytes")
	b.ran = false
	r := httptest.NewRequest("POST", "/v1/shards/x", io.NopCloser(strings.NewReader(big)))
	r.Host, r.ContentLength, r.TransferEncoding = "127.0.0.1:8980", -1, []string{"chunked"}
	r.Header.Set("Authorization", "Bearer "+token)
	r.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(httptest.NewRecorder(), r)
	require.True(t, b.ran)
	var tooLarge *http.MaxBytesError
	require.ErrorAs(t, b.err, &tooLarge)
}

func TestJSONErrors(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/things/{id}", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("thing")) })
	h := adminserve.JSONErrors(mux)
	w := req{target: "/v1/things/1"}.do(h)
	require.Equal(t, "thing", w.Body.String())
	requireJSONError(t, req{target: "/v1/nothing"}.do(h), http.StatusNotFound, "not found")
	w = req{method: "DELETE", target: "/v1/things/1"}.do(h)
	requireJSONError(t, w, http.StatusMethodNotAllowed, "method not allowed")
	require.Contains(t, w.Header().Get("Allow"), "GET")
}
