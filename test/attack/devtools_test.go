package attack

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nstance-dev/nstance/internal/testing/portpick"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
)

// Helpers of the dev-tool cases (cases_devtools_test.go): what a web page
// the developer opens can make a browser send to dev-s3 and dev-k8s.

const (
	// evilOrigin is the page's origin for the CORS cases.
	evilOrigin = "http://evil.test"
	// evilName is a name the attacker's DNS first resolves to its own
	// server and then, rebinding, to 127.0.0.1: the browser then sends
	// same-origin requests to the dev tool with this Host.
	evilName = "evil.test"
)

// devRequest sends one request with the given Host and Origin (empty: the
// address dialled, none) and returns the response with its body read.
func devRequest(ctx context.Context, c *http.Client, method, url, host, origin string, body []byte, hdr map[string]string) (*http.Response, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, nil, err
	}
	if host != "" {
		req.Host = host
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s (Host %q): %w", method, url, host, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// corsHeaders lists the response's Access-Control-* headers.
func corsHeaders(h http.Header) []string {
	var out []string
	for k, v := range h {
		if strings.HasPrefix(strings.ToLower(k), "access-control-") {
			out = append(out, k+": "+strings.Join(v, ","))
		}
	}
	return out
}

func devS3NoCORS(ctx context.Context, e *env) error {
	c := &http.Client{Timeout: refuseWithin}
	url := "http://" + e.s.s3Addr + "/" + bucket + "/" + e.s.keys.Config(e.dev1.shard)
	resp, _, err := devRequest(ctx, c, http.MethodOptions, url, "", evilOrigin, nil, map[string]string{
		"Access-Control-Request-Method": "PUT", "Access-Control-Request-Headers": "content-type",
	})
	if err != nil {
		return err
	}
	if h := corsHeaders(resp.Header); len(h) > 0 {
		return fmt.Errorf("preflight OPTIONS from %s answered %d with %v: a page of any origin may PUT and DELETE", evilOrigin, resp.StatusCode, h)
	}
	if resp.StatusCode < 300 {
		return fmt.Errorf("preflight OPTIONS from %s answered %d, want a refusal", evilOrigin, resp.StatusCode)
	}
	for _, m := range []string{http.MethodGet, http.MethodHead} {
		resp, _, err := devRequest(ctx, c, m, url, "", evilOrigin, nil, nil)
		if err != nil {
			return err
		}
		if h := corsHeaders(resp.Header); len(h) > 0 {
			return fmt.Errorf("%s with Origin %s answered %d with %v: the page can read the shard config", m, evilOrigin, resp.StatusCode, h)
		}
	}
	return nil
}

func devS3RebindingHost(ctx context.Context, e *env) error {
	c := &http.Client{Timeout: refuseWithin}
	key := e.s.keys.Config(e.dev1.shard)
	url := "http://" + e.s.s3Addr + "/" + bucket + "/" + key
	_, port, _ := net.SplitHostPort(e.s.s3Addr)
	before, err := e.s.get(ctx, key)
	if err != nil {
		return fmt.Errorf("reading %s: %w", key, err)
	}
	rebound := net.JoinHostPort(evilName, port)
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		var body []byte
		if m == http.MethodPut {
			body = []byte(`{"shard": {"infra": {"options": {"command": "touch /tmp/pwned"}}}}`)
		}
		resp, got, err := devRequest(ctx, c, m, url, rebound, "", body, nil)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusMisdirectedRequest && resp.StatusCode != http.StatusForbidden {
			return fmt.Errorf("%s %s with Host %s answered %d, want 421 or 403", m, key, rebound, resp.StatusCode)
		}
		if bytes.Contains(got, before[:min(len(before), 64)]) {
			return fmt.Errorf("%s with Host %s returned the object", m, rebound)
		}
	}
	after, err := e.s.get(ctx, key)
	if err != nil {
		return fmt.Errorf("%s after the rebinding requests: %w", key, err)
	}
	if !bytes.Equal(before, after) {
		return fmt.Errorf("%s changed through requests with Host %s", key, rebound)
	}
	// The names a client really uses still work.
	for _, h := range []string{"", net.JoinHostPort("localhost", port)} {
		resp, _, err := devRequest(ctx, c, http.MethodGet, url, h, "", nil, nil)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET with Host %q answered %d, want 200", h, resp.StatusCode)
		}
	}
	return nil
}

// devS3FormUpload is what a page's <form method=post enctype=multipart/form-data
// action=http://127.0.0.1:8989/dev> sends: a "simple" request, which a browser
// sends cross-origin without asking (no preflight, so no CORS), and which
// gofakes3 turns into a PutObject of the form's key.
func devS3FormUpload(ctx context.Context, e *env) error {
	c := &http.Client{Timeout: refuseWithin}
	key := "config/form-upload.jsonc"
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	if err := mw.WriteField("key", key); err != nil {
		return err
	}
	fw, err := mw.CreateFormFile("file", "x.jsonc")
	if err != nil {
		return err
	}
	if _, err := fw.Write([]byte(`{"shard": {"infra": {"options": {"command": "touch /tmp/pwned"}}}}`)); err != nil {
		return err
	}
	if err := mw.Close(); err != nil {
		return err
	}
	for _, h := range []map[string]string{
		{"Origin": evilOrigin, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"},
		{"Origin": "http://127.0.0.1:3000", "Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate"}, // another local dev server's page
		{"Origin": "null"}, // a sandboxed frame, or an older browser without Sec-Fetch-*
	} {
		h["Content-Type"] = mw.FormDataContentType()
		resp, _, err := devRequest(ctx, c, http.MethodPost, "http://"+e.s.s3Addr+"/"+bucket, "", "", buf.Bytes(), h)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusForbidden {
			return fmt.Errorf("form POST with Origin %s answered %d, want 403", h["Origin"], resp.StatusCode)
		}
		if _, err := e.s.get(ctx, key); err == nil {
			return fmt.Errorf("a cross-origin form (Origin %s) wrote %s", h["Origin"], key)
		}
	}
	return nil
}

// devK8s is a dev-k8s process on a temporary data directory.
type devK8s struct {
	addr, dir, token string
	client           *http.Client
}

func (k *devK8s) url(path string) string { return "https://" + k.addr + path }

// preSecret is a Secret file written before dev-k8s starts, with the modes
// an older dev-k8s (or a hand edit) left: 0644 in 0755 directories.
const preSecret = `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"pre","namespace":"default"},"data":{"k":"c2VjcmV0"}}`

// run wraps a case that needs dev-k8s.
func (o *devK8sOnce) run(f func(context.Context, *env, *devK8s) error) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		started := false
		o.once.Do(func() { o.k, o.err = startDevK8s(context.WithoutCancel(ctx), e.s); started = true })
		if o.err != nil {
			return fmt.Errorf("starting dev-k8s: %w", o.err)
		}
		if started {
			// Building dev-k8s on a cold cache may take longer than a
			// case's minute: the requests get a minute of their own.
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
		}
		return f(ctx, e, o.k)
	}
}

func startDevK8s(ctx context.Context, s *stack) (*devK8s, error) {
	t := s.t
	bin, err := bins.Build("dev-k8s")
	if err != nil {
		return nil, err
	}
	base := t.TempDir()
	dir := filepath.Join(base, "data")
	for _, d := range []string{dir, filepath.Join(dir, "namespaces"), filepath.Join(dir, "secrets"), filepath.Join(dir, "secrets", "default")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		if err := os.Chmod(d, 0o755); err != nil {
			return nil, err
		}
	}
	for p, b := range map[string]string{
		filepath.Join(dir, "namespaces", "default.json"):     `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"default"}}`,
		filepath.Join(dir, "secrets", "default", "pre.json"): preSecret,
	} {
		if err := os.WriteFile(p, []byte(b), 0o644); err != nil {
			return nil, err
		}
		if err := os.Chmod(p, 0o644); err != nil {
			return nil, err
		}
	}
	k := &devK8s{addr: portpick.Addr(t), dir: dir}
	procs := proctest.NewGroup(t, proctest.Options{Bin: bin, Dir: base, LogDir: base, Grace: stopGrace})
	p, err := procs.Start("dev-k8s", "dev-k8s", nil, "--addr", k.addr, "--dir", dir, "--controllers=false")
	if err != nil {
		return nil, err
	}
	var ca []byte
	if err := p.WaitFor(ctx, "dev-k8s's admin token and CA", 60*time.Second, func() bool {
		tok, err1 := os.ReadFile(filepath.Join(dir, ".dev-k8s", "auth", "admin.token"))
		c, err2 := os.ReadFile(filepath.Join(dir, ".dev-k8s", "tls", "ca.crt"))
		k.token, ca = strings.TrimSpace(string(tok)), c
		return err1 == nil && err2 == nil && k.token != "" && len(ca) > 0
	}); err != nil {
		return nil, fmt.Errorf("%w (log %s)", err, p.Log)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("dev-k8s CA: no certificate")
	}
	k.client = &http.Client{Timeout: refuseWithin, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}}
	if err := proctest.Wait(ctx, "dev-k8s /readyz", 60*time.Second, func() bool {
		resp, err := k.client.Get(k.url("/readyz"))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}); err != nil {
		return nil, fmt.Errorf("%w (log %s)", err, p.Log)
	}
	return k, nil
}

func devK8sCORSAndHost(ctx context.Context, e *env, k *devK8s) error {
	auth := map[string]string{"Authorization": "Bearer " + k.token}
	_, port, _ := net.SplitHostPort(k.addr)
	rebound := net.JoinHostPort(evilName, port)
	// Control: the address dialled and localhost work.
	for _, h := range []string{"", net.JoinHostPort("localhost", port)} {
		resp, _, err := devRequest(ctx, k.client, http.MethodGet, k.url("/api/v1/namespaces/default/secrets"), h, "", nil, auth)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("control: GET secrets with Host %q answered %d, want 200", h, resp.StatusCode)
		}
	}
	// Another origin's page: no CORS headers, whatever the answer.
	resp, body, err := devRequest(ctx, k.client, http.MethodGet, k.url("/api/v1/namespaces/default/secrets"), "", evilOrigin, nil, auth)
	if err != nil {
		return err
	}
	if c := corsHeaders(resp.Header); len(c) > 0 {
		return fmt.Errorf("GET with Origin %s answered %d with %v", evilOrigin, resp.StatusCode, c)
	}
	if bytes.Contains(body, []byte("c2VjcmV0")) {
		return fmt.Errorf("GET with Origin %s returned a Secret", evilOrigin)
	}
	resp, _, err = devRequest(ctx, k.client, http.MethodOptions, k.url("/api/v1/namespaces/default/secrets"), "", evilOrigin, nil,
		map[string]string{"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"})
	if err != nil {
		return err
	}
	if c := corsHeaders(resp.Header); len(c) > 0 || resp.StatusCode < 300 {
		return fmt.Errorf("preflight OPTIONS from %s answered %d with %v, want a refusal without CORS headers", evilOrigin, resp.StatusCode, c)
	}
	// A rebinding page has no token, but anonymous paths answer; with the
	// token too, nothing is served under a foreign name.
	for _, r := range []struct {
		path string
		hdr  map[string]string
	}{{"/version", nil}, {"/readyz", nil}, {"/api/v1/namespaces/default/secrets", auth}} {
		resp, body, err := devRequest(ctx, k.client, http.MethodGet, k.url(r.path), rebound, "", nil, r.hdr)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusMisdirectedRequest && resp.StatusCode != http.StatusForbidden {
			return fmt.Errorf("GET %s with Host %s answered %d, want 421 or 403", r.path, rebound, resp.StatusCode)
		}
		if bytes.Contains(body, []byte("gitVersion")) || bytes.Contains(body, []byte("c2VjcmV0")) {
			return fmt.Errorf("GET %s with Host %s returned data: %.200s", r.path, rebound, body)
		}
	}
	return nil
}

func devK8sSecretModes(ctx context.Context, e *env, k *devK8s) error {
	body := []byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"operator-key"},"stringData":{"tls.key":"PRIVATE"}}`)
	resp, got, err := devRequest(ctx, k.client, http.MethodPost, k.url("/api/v1/namespaces/default/secrets"), "", "", body,
		map[string]string{"Authorization": "Bearer " + k.token, "Content-Type": "application/json"})
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("creating a Secret answered %d: %.300s", resp.StatusCode, got)
	}
	var problems []string
	want := func(p string, mode fs.FileMode) {
		fi, err := os.Lstat(p)
		if err != nil {
			problems = append(problems, err.Error())
			return
		}
		if fi.Mode().Perm() != mode {
			rel, _ := filepath.Rel(k.dir, p)
			problems = append(problems, fmt.Sprintf("%s is %04o, want %04o", rel, fi.Mode().Perm(), mode))
		}
	}
	want(k.dir, 0o700)
	want(filepath.Join(k.dir, "secrets"), 0o700)
	want(filepath.Join(k.dir, "secrets", "default"), 0o700)
	want(filepath.Join(k.dir, "secrets", "default", "operator-key.json"), 0o600)
	want(filepath.Join(k.dir, "secrets", "default", "pre.json"), 0o600)
	if len(problems) > 0 {
		return fmt.Errorf("other users can read Secrets: %s", strings.Join(problems, "; "))
	}
	return nil
}
