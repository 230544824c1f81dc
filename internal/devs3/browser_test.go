package devs3_test

import (
	"bytes"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/devs3"
	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
)

// What a web page can make a browser send: cross-origin requests with an
// Origin (and preflights), and, after DNS rebinding, same-origin requests
// with a foreign Host. See internal/devguard.

func send(t *testing.T, method, url, host, origin, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if host != "" {
		req.Host = host
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
		if method == http.MethodOptions {
			req.Header.Set("Access-Control-Request-Method", "PUT")
		}
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

func requireNoCORS(t *testing.T, resp *http.Response) {
	t.Helper()
	for k := range resp.Header {
		require.False(t, strings.HasPrefix(strings.ToLower(k), "access-control-"), "CORS header %s: %s", k, resp.Header.Get(k))
	}
}

func TestNoCORS(t *testing.T) {
	dir := t.TempDir()
	srv := devs3test.Start(t, dir)
	url := srv.URL + "/" + bucket + "/config/dev-1.jsonc"
	// A page of another origin: refused whatever the method.
	for _, m := range []string{http.MethodPut, http.MethodGet, http.MethodDelete, http.MethodOptions} {
		resp, body := send(t, m, url, "", "http://evil.test", "{}")
		require.Equal(t, http.StatusForbidden, resp.StatusCode, m)
		require.Contains(t, body, "cross-origin")
		requireNoCORS(t, resp)
	}
	_, err := os.Stat(filepath.Join(dir, "config", "dev-1.jsonc"))
	require.ErrorIs(t, err, os.ErrNotExist)
	// The server's own origin (a page dev-s3 serves) works, and still gets
	// none of gofakes3's CORS headers.
	for _, m := range []string{http.MethodPut, http.MethodGet, http.MethodHead, http.MethodDelete} {
		resp, _ := send(t, m, url, "", srv.URL, "{}")
		require.Less(t, resp.StatusCode, 300, m)
		requireNoCORS(t, resp)
	}
	resp, body := send(t, http.MethodOptions, url, "", srv.URL, "")
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Contains(t, body, "CORS")
	requireNoCORS(t, resp)
}

// TestCrossOriginFormRefused: an HTML form's POST is a "simple" request a
// browser sends to any origin without a preflight; gofakes3 would store its
// file under the form's key.
func TestCrossOriginFormRefused(t *testing.T) {
	dir := t.TempDir()
	srv := devs3test.Start(t, dir)
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	require.NoError(t, mw.WriteField("key", "config/dev-1.jsonc"))
	fw, err := mw.CreateFormFile("file", "x")
	require.NoError(t, err)
	_, err = fw.Write([]byte("pwned"))
	require.NoError(t, err)
	require.NoError(t, mw.Close())
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/"+bucket, bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	_, err = os.Stat(filepath.Join(dir, "config", "dev-1.jsonc"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestForeignHostRefused(t *testing.T) {
	dir := t.TempDir()
	srv := devs3test.StartWith(t, devs3.Config{Dir: dir, AllowedHosts: []string{"devbox.lan"}})
	obj := filepath.Join(dir, "config", "dev-1.jsonc")
	require.NoError(t, os.MkdirAll(filepath.Dir(obj), 0o755))
	require.NoError(t, os.WriteFile(obj, []byte("original"), 0o644))
	url := srv.URL + "/" + bucket + "/config/dev-1.jsonc"
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete, http.MethodPost} {
		resp, body := send(t, m, url, "evil.test:"+port, "", "changed")
		require.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode, m)
		require.Contains(t, body, `Host "evil.test:`+port+`"`)
		require.Contains(t, body, "--allowed-host")
		require.NotContains(t, body, "original")
	}
	resp, _ := send(t, http.MethodGet, srv.URL+"/healthz", "evil.test:"+port, "", "")
	require.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode)
	got, err := os.ReadFile(obj)
	require.NoError(t, err)
	require.Equal(t, "original", string(got))
	for _, h := range []string{"localhost:" + port, "devbox.lan:" + port, "[::1]:" + port} {
		resp, body := send(t, http.MethodGet, url, h, "", "")
		require.Equal(t, http.StatusOK, resp.StatusCode, h)
		require.Equal(t, "original", body)
	}
}

func TestBadAllowedHost(t *testing.T) {
	_, err := devs3.New(devs3.Config{Dir: t.TempDir(), AllowedHosts: []string{"http://devbox.lan/"}})
	require.ErrorContains(t, err, `--allowed-host "http://devbox.lan/"`)
}
