package browser

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"

	"github.com/nstance-dev/nstance/internal/devk8s/app"
	"github.com/nstance-dev/nstance/internal/devs3"
)

// A web page the developer opens must not read or change what dev-s3 and
// dev-k8s hold (issue 29 finding 1): neither from its own origin (CORS,
// simple requests) nor after re-pointing its own name to 127.0.0.1 (DNS
// rebinding). The attacker's name is evil.test, which Chromium resolves to
// 127.0.0.1 (--host-resolver-rules).

const evilName = "evil.test"

// attackerPage is what the attacker serves at http://evil.test:<port>/.
const attackerPage = `<!doctype html><title>attacker</title><p>nothing to see`

// fetchResult is what the page learned from one fetch: the status and body
// it could read, or the error the browser gave it.
type fetchResult struct {
	Name   string `json:"name"`
	Status int    `json:"status"`
	Body   string `json:"body"`
	Error  string `json:"error"`
	// Opaque: a no-cors request was sent, its answer hidden from the page.
	Opaque bool `json:"opaque"`
}

func (f fetchResult) String() string {
	if f.Error != "" {
		return fmt.Sprintf("%s: error %s", f.Name, f.Error)
	}
	return fmt.Sprintf("%s: status %d opaque=%v body %.120q", f.Name, f.Status, f.Opaque, f.Body)
}

// fetchScript runs the fetches in the page and resolves to their results.
// Each request is {name, url, method, body, mode, form}: form sends a
// multipart form with fields key and file (an HTML form's upload).
func fetchScript(reqs []map[string]any) string {
	var b strings.Builder
	b.WriteString(`(async (reqs) => {
  const out = [];
  for (const q of reqs) {
    const init = {method: q.method, mode: q.mode || "cors", cache: "no-store", credentials: "include"};
    if (q.form) {
      const fd = new FormData();
      fd.append("key", q.form);
      fd.append("file", new Blob([q.body]), "x");
      init.body = fd;
    } else if (q.body) {
      init.body = q.body;
    }
    try {
      const r = await fetch(q.url, init);
      out.push({name: q.name, status: r.status, body: r.type === "opaque" ? "" : await r.text(), opaque: r.type === "opaque"});
    } catch (e) {
      out.push({name: q.name, error: String(e)});
    }
  }
  return out;
})(`)
	b.WriteString(mustJSON(reqs))
	b.WriteString(`)`)
	return b.String()
}

// rebindingTab loads the attacker's page from http://evilName:port/ in a
// new tab of ctx's browser and then stops the attacker's server, leaving
// port free for the tool the page will reach as its "own" origin.
func rebindingTab(t *testing.T, ctx context.Context) (context.Context, int) {
	t.Helper()
	port := Port(t)
	stop := serveAttacker(t, port)
	tab := NewTab(t, ctx)
	Navigate(t, tab, fmt.Sprintf("http://%s:%d/", evilName, port))
	stop()
	return tab, port
}

// serveAttacker serves the attacker's page on 127.0.0.1:port until the
// returned function stops it (and drops its connections).
func serveAttacker(t *testing.T, port int) (stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	srv := ServePage(ln, attackerPage)
	stop = func() { _ = srv.Close() }
	t.Cleanup(stop)
	return stop
}

// startDevS3 serves dir on 127.0.0.1:port (0: any) without access keys
// (dev-s3's default, any credentials accepted).
func startDevS3(t *testing.T, dir string, port int) *devs3.Running {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	r, err := devs3.Start(context.Background(), ln, devs3.Config{Dir: dir, Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop() })
	return r
}

// startDevK8s runs dev-k8s on 127.0.0.1:port over plain HTTP (with TLS a
// re-pointed name already fails the certificate check; plain HTTP leaves
// the Host check alone in front).
func startDevK8s(t *testing.T, dir string, port int) *app.Running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r, err := app.Start(ctx, testr.New(t), app.Config{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Dir: dir})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = r.Wait() })
	return r
}

// seedS3 writes the objects the page is after.
func seedS3(t *testing.T, dir string) map[string]string {
	t.Helper()
	objs := map[string]string{
		"config/dev-1.jsonc":        `{"shard": {"id": "dev-1"}} // original`,
		"cluster/secret/ca.key.enc": "ORIGINAL-SECRET",
	}
	for k, v := range objs {
		p := filepath.Join(dir, filepath.FromSlash(k))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return objs
}

// requireUnchanged checks the objects on disk and that nothing else
// appeared under dir's config/.
func requireUnchanged(t *testing.T, dir string, objs map[string]string) {
	t.Helper()
	for k, v := range objs {
		got, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(k)))
		if err != nil {
			t.Errorf("%s: %v (the page deleted it?)", k, err)
			continue
		}
		if string(got) != v {
			t.Errorf("%s changed by the page: %q", k, got)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "config"))
	for _, e := range ents {
		if e.Name() != "dev-1.jsonc" {
			t.Errorf("the page created config/%s", e.Name())
		}
	}
}

// requireNothingRead fails for any result in which the page saw an answer
// (a status other than the refusals) or any of the secrets.
func requireRefused(t *testing.T, res []fetchResult, secrets ...string) {
	t.Helper()
	for _, r := range res {
		t.Logf("page saw %s", r)
		for _, s := range secrets {
			if strings.Contains(r.Body, s) {
				t.Errorf("%s: the page read %q", r.Name, s)
			}
		}
		switch {
		case r.Error != "", r.Opaque:
			// Blocked by the browser (no CORS grant), or sent blind.
		case r.Status == http.StatusMisdirectedRequest, r.Status == http.StatusForbidden:
			// Refused by the server.
		default:
			t.Errorf("%s: the page got an answer it can read: status %d", r.Name, r.Status)
		}
	}
}

// TestCrossOriginPage: a page at http://evil.test:<port>/ fetches dev-s3 and
// dev-k8s on their own addresses (cross-origin), with CORS requests and
// with a "simple" no-cors form upload, which needs no preflight.
func TestCrossOriginPage(t *testing.T) {
	ctx := Start(t, Options{HostResolverRules: "MAP " + evilName + " 127.0.0.1"})
	s3dir := t.TempDir()
	objs := seedS3(t, s3dir)
	s3 := startDevS3(t, s3dir, 0)
	k8s := startDevK8s(t, t.TempDir(), Port(t))
	page := Port(t)
	serveAttacker(t, page)
	tab := NewTab(t, ctx)
	Navigate(t, tab, fmt.Sprintf("http://%s:%d/", evilName, page))

	obj := s3.URL + "/dev/config/dev-1.jsonc"
	res := Eval[[]fetchResult](t, tab, fetchScript([]map[string]any{
		{"name": "dev-s3 GET config", "url": obj, "method": "GET"},
		{"name": "dev-s3 GET secret", "url": s3.URL + "/dev/cluster/secret/ca.key.enc", "method": "GET"},
		{"name": "dev-s3 LIST", "url": s3.URL + "/dev?list-type=2", "method": "GET"},
		{"name": "dev-s3 PUT config", "url": obj, "method": "PUT", "body": "pwned"},
		{"name": "dev-s3 DELETE config", "url": obj, "method": "DELETE"},
		{"name": "dev-s3 form upload (no-cors)", "url": s3.URL + "/dev", "method": "POST", "mode": "no-cors", "form": "config/dev-1.jsonc", "body": "pwned"},
		{"name": "dev-s3 form upload of a new key (no-cors)", "url": s3.URL + "/dev", "method": "POST", "mode": "no-cors", "form": "config/dev-9.jsonc", "body": "pwned"},
		{"name": "dev-k8s GET /version", "url": k8s.URL + "/version", "method": "GET"},
		{"name": "dev-k8s GET secrets", "url": k8s.URL + "/api/v1/secrets", "method": "GET"},
	}))
	// A no-cors request is always opaque to the page: what counts is that
	// dev-s3 stored nothing (checked on disk).
	requireRefused(t, res, "original", "ORIGINAL-SECRET", "gitVersion", "dev-1.jsonc")
	requireUnchanged(t, s3dir, objs)
}

// TestDNSRebinding: the page is loaded from the attacker's server on
// 127.0.0.1:P as http://evil.test:P/; then that server stops and the dev
// tool starts on the same port, as if evil.test now resolved to the
// developer's machine. The page's same-origin fetches reach the dev tool
// with Host evil.test:P and must be refused.
func TestDNSRebinding(t *testing.T) {
	ctx := Start(t, Options{HostResolverRules: "MAP " + evilName + " 127.0.0.1"})

	t.Run("dev-s3", func(t *testing.T) {
		tab, port := rebindingTab(t, ctx)
		dir := t.TempDir()
		objs := seedS3(t, dir)
		startDevS3(t, dir, port)
		res := Eval[[]fetchResult](t, tab, fetchScript([]map[string]any{
			{"name": "GET config", "url": "/dev/config/dev-1.jsonc", "method": "GET"},
			{"name": "GET secret", "url": "/dev/cluster/secret/ca.key.enc", "method": "GET"},
			{"name": "PUT config", "url": "/dev/config/dev-1.jsonc", "method": "PUT", "body": "pwned"},
			{"name": "PUT new config", "url": "/dev/config/dev-9.jsonc", "method": "PUT", "body": "pwned"},
			{"name": "DELETE secret", "url": "/dev/cluster/secret/ca.key.enc", "method": "DELETE"},
		}))
		requireReachedAndRefused(t, res)
		requireRefused(t, res, "original", "ORIGINAL-SECRET")
		requireUnchanged(t, dir, objs)
	})

	t.Run("dev-k8s", func(t *testing.T) {
		tab, port := rebindingTab(t, ctx)
		dir := t.TempDir()
		secret := filepath.Join(dir, "secrets", "default", "operator-key.json")
		const secretJSON = `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"operator-key","namespace":"default"},"data":{"tls.key":"T1JJR0lOQUw="}}`
		if err := os.MkdirAll(filepath.Dir(secret), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(secret, []byte(secretJSON), 0o600); err != nil {
			t.Fatal(err)
		}
		startDevK8s(t, dir, port)
		// dev-k8s writes a hand-written object back completed (uid,
		// resourceVersion) when it loads it: compare with that.
		before, err := os.ReadFile(secret)
		if err != nil {
			t.Fatal(err)
		}
		res := Eval[[]fetchResult](t, tab, fetchScript([]map[string]any{
			{"name": "GET /version", "url": "/version", "method": "GET"},
			{"name": "GET /readyz", "url": "/readyz", "method": "GET"},
			{"name": "GET secret", "url": "/api/v1/namespaces/default/secrets/operator-key", "method": "GET"},
			{"name": "DELETE secret", "url": "/api/v1/namespaces/default/secrets/operator-key", "method": "DELETE"},
		}))
		requireReachedAndRefused(t, res)
		requireRefused(t, res, "gitVersion", "T1JJR0lOQUw=")
		got, err := os.ReadFile(secret)
		if err != nil || string(got) != string(before) || !strings.Contains(string(got), "T1JJR0lOQUw=") {
			t.Errorf("the Secret file changed: %q, %v", got, err)
		}
	})
}

// requireReachedAndRefused: after rebinding the requests are same-origin,
// so the page sees every status; each must be the Host refusal (421), which
// also proves the request reached the dev tool and not the stopped server.
func requireReachedAndRefused(t *testing.T, res []fetchResult) {
	t.Helper()
	for _, r := range res {
		if r.Error != "" || r.Status != http.StatusMisdirectedRequest {
			t.Errorf("%s: want status 421 (Host refused), got %s", r.Name, r)
		}
	}
}
