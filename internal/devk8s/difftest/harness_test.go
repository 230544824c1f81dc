package difftest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"

	"github.com/nstance-dev/nstance/internal/devk8s/app"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

// target is one API server under comparison.
type target struct {
	name string
	cfg  *rest.Config
	http *http.Client
	// stream is a client without a response timeout, for watches.
	stream *http.Client
	// anon sends no credentials (TLS settings only).
	anon *http.Client
	// node is the same server reached with a kubelet's client
	// certificate (user system:node:<nodeName>, group system:nodes).
	node *target
}

var (
	envtestTarget *target
	devTarget     *target
	nsCounter     atomic.Int64
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

// Both servers know the same static tokens (kube-apiserver's
// --token-auth-file format), so authentication answers can be compared.
const (
	userToken    = "difftest-user-token"
	tokenFileCSV = userToken + `,difftest-user,difftest-user-uid,"group-a,group-b"` + "\n"
	// authnConfig gives envtest's kube-apiserver the anonymous access
	// dev-k8s has: the health and version endpoints only.
	authnConfig = `apiVersion: apiserver.config.k8s.io/v1
kind: AuthenticationConfiguration
anonymous:
  enabled: true
  conditions:
  - path: /healthz
  - path: /livez
  - path: /readyz
  - path: /version
`
)

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "difftest-devk8s-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	tokenFile, authnFile := filepath.Join(dir, "tokens.csv"), filepath.Join(dir, "authn.yaml")
	for p, content := range map[string]string{tokenFile: tokenFileCSV, authnFile: authnConfig} {
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	// The Node authorizer and NodeRestriction judge kubelets' requests as
	// in a real cluster; envtest's client CA signs the kubelet certificate
	// both servers see.
	env, stop, err := kubetest.StartEnvWith(kubetest.Options{APIServerArgs: map[string]string{
		"token-auth-file": tokenFile, "authentication-config": authnFile,
		"authorization-mode": "Node,RBAC", "enable-admission-plugins": "NodeRestriction",
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start envtest:", err)
		return 1
	}
	defer func() { _ = stop() }()
	crdDirs, err := kubetest.CRDDirs()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if env.ClientCAFile == "" {
		fmt.Fprintln(os.Stderr, "envtest's client CA file was not found")
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	run, err := app.Start(ctx, logr.Discard(), app.Config{Addr: "127.0.0.1:0", Dir: filepath.Join(dir, "data"), CRDPaths: crdDirs, TokenFile: tokenFile,
		TLS: true, ClientCAFile: env.ClientCAFile})
	if err != nil {
		cancel()
		fmt.Fprintln(os.Stderr, "start dev-k8s:", err)
		return 1
	}
	defer func() {
		cancel()
		_ = run.Wait()
	}()
	if envtestTarget, err = newTarget("envtest", env.Config); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if devTarget, err = newTarget("dev-k8s", &rest.Config{Host: run.URL, BearerToken: run.AdminToken, TLSClientConfig: rest.TLSClientConfig{CAData: run.CAPEM}}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	kubelet, err := env.AddUser("system:node:"+nodeName, "system:nodes")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if envtestTarget.node, err = newTarget("envtest as "+nodeName, kubelet); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if devTarget.node, err = newTarget("dev-k8s as "+nodeName, &rest.Config{Host: run.URL,
		TLSClientConfig: rest.TLSClientConfig{CAData: run.CAPEM, CertData: kubelet.CertData, KeyData: kubelet.KeyData}}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for _, tg := range []*target{envtestTarget, devTarget} {
		if err := installTestCRDs(tg); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}

func newTarget(name string, cfg *rest.Config) (*target, error) {
	c := rest.CopyConfig(cfg)
	hc, err := rest.HTTPClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("%s http client: %w", name, err)
	}
	hc.Timeout = 30 * time.Second
	sc, err := rest.HTTPClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("%s http client: %w", name, err)
	}
	ac, err := rest.HTTPClientFor(rest.AnonymousClientConfig(c))
	if err != nil {
		return nil, fmt.Errorf("%s http client: %w", name, err)
	}
	ac.Timeout = 30 * time.Second
	return &target{name: name, cfg: c, http: hc, stream: sc, anon: ac}, nil
}

// resp is an answer from one server.
type resp struct {
	Code int
	Obj  map[string]any
	Raw  []byte
	CT   string
}

func (tg *target) do(ctx context.Context, method, path, contentType string, body any, accept string) (resp, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			return resp{}, err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(tg.cfg.Host, "/")+path, rd)
	if err != nil {
		return resp{}, err
	}
	if contentType == "" && body != nil {
		contentType = "application/json"
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if accept == "" {
		accept = "application/json"
	}
	req.Header.Set("Accept", accept)
	res, err := tg.http.Do(req)
	if err != nil {
		return resp{}, err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		return resp{}, err
	}
	out := resp{Code: res.StatusCode, Raw: data, CT: res.Header.Get("Content-Type")}
	_ = json.Unmarshal(data, &out.Obj)
	return out, nil
}

// tc is one case running against one target in its own namespace.
type tc struct {
	t   *testing.T
	ctx context.Context
	tg  *target
	ns  string
}

func (c *tc) path(p string) string { return strings.ReplaceAll(p, "{ns}", c.ns) }

func (c *tc) req(method, path string, body any) resp {
	return c.reqCT(method, path, "", body)
}

func (c *tc) reqCT(method, path, ct string, body any) resp {
	c.t.Helper()
	r, err := c.tg.do(c.ctx, method, c.path(path), ct, body, "")
	require.NoError(c.t, err, "%s %s %s", c.tg.name, method, path)
	return r
}

func (c *tc) get(path string) resp { return c.req(http.MethodGet, path, nil) }
func (c *tc) post(path string, body any) resp {
	return c.req(http.MethodPost, path, body)
}
func (c *tc) put(path string, body any) resp { return c.req(http.MethodPut, path, body) }
func (c *tc) del(path string, body any) resp { return c.req(http.MethodDelete, path, body) }
func (c *tc) patch(path, pt string, body any) resp {
	return c.reqCT(http.MethodPatch, path, pt, body)
}

// must asserts a 2xx answer and returns it.
func (c *tc) must(r resp) resp {
	c.t.Helper()
	require.True(c.t, r.Code >= 200 && r.Code < 300, "%s: unexpected %d: %s", c.tg.name, r.Code, r.Raw)
	return r
}

// eventually polls fn until it returns true (servers with asynchronous
// controllers settle at different speeds).
func (c *tc) eventually(fn func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !fn() {
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: condition not met in time", c.tg.name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// watchStream is a running watch.
type watchStream struct {
	events chan map[string]any
	cancel context.CancelFunc
	code   int
}

func (c *tc) watch(path string) *watchStream {
	c.t.Helper()
	ctx, cancel := context.WithCancel(c.ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(c.tg.cfg.Host, "/")+c.path(path), nil)
	require.NoError(c.t, err)
	req.Header.Set("Accept", "application/json")
	res, err := c.tg.stream.Do(req)
	require.NoError(c.t, err)
	ws := &watchStream{events: make(chan map[string]any, 1000), cancel: cancel, code: res.StatusCode}
	c.t.Cleanup(func() { cancel(); _ = res.Body.Close() })
	go func() {
		defer close(ws.events)
		dec := json.NewDecoder(bufio.NewReader(res.Body))
		for {
			var ev map[string]any
			if err := dec.Decode(&ev); err != nil {
				return
			}
			ws.events <- ev
		}
	}()
	return ws
}

// collect gathers events until n arrived or the wait ends, summarising each
// as "TYPE name" (bookmarks as "BOOKMARK").
func (ws *watchStream) collect(n int, wait time.Duration) []string {
	var out []string
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for len(out) < n {
		select {
		case ev, ok := <-ws.events:
			if !ok {
				return append(out, "CLOSED")
			}
			out = append(out, eventSummary(ev))
		case <-timer.C:
			return out
		}
	}
	return out
}

func eventSummary(ev map[string]any) string {
	typ, _ := ev["type"].(string)
	obj, _ := ev["object"].(map[string]any)
	switch typ {
	case "BOOKMARK":
		md, _ := obj["metadata"].(map[string]any)
		ann, _ := md["annotations"].(map[string]any)
		if ann["k8s.io/initial-events-end"] == "true" {
			return "BOOKMARK initial-events-end"
		}
		return "BOOKMARK"
	case "ERROR":
		return fmt.Sprintf("ERROR %v %v", obj["code"], obj["reason"])
	}
	md, _ := obj["metadata"].(map[string]any)
	return fmt.Sprintf("%s %v", typ, md["name"])
}

// diffCase is one row of the table.
type diffCase struct {
	name string
	run  func(c *tc) any
}

func newNamespace(t *testing.T, ctx context.Context, tg *target, name string) {
	t.Helper()
	r, err := tg.do(ctx, http.MethodPost, "/api/v1/namespaces", "", map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": name}}, "")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, r.Code, "%s: create namespace: %s", tg.name, r.Raw)
}

// runTable runs each case on both servers and compares.
func runTable(t *testing.T, cases []diffCase) {
	seen := map[string]bool{}
	for _, dc := range cases {
		require.False(t, seen[dc.name], "duplicate case %s", dc.name)
		seen[dc.name] = true
		t.Run(dc.name, func(t *testing.T) {
			ns := fmt.Sprintf("dt-%d", nsCounter.Add(1))
			results := make([]any, 2)
			for i, tg := range []*target{envtestTarget, devTarget} {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				newNamespace(t, ctx, tg, ns)
				results[i] = dc.run(&tc{t: t, ctx: ctx, tg: tg, ns: ns})
				cancel()
			}
			// DIFFTEST_DUMP=1 prints both answers of every case (to study a diff).
			if os.Getenv("DIFFTEST_DUMP") != "" {
				je, _ := json.Marshal(results[0])
				ja, _ := json.Marshal(results[1])
				fmt.Printf("DUMP %s\n  E %s\n  A %s\n", dc.name, je, ja)
			}
			require.Equal(t, results[0], results[1], "envtest (expected) and dev-k8s (actual) disagree")
		})
	}
}

var (
	uuidRE   = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	numberRE = regexp.MustCompile(`\(\d+\)`)
)

// volatile keys are dropped from compared objects wherever they appear.
var volatile = map[string]bool{
	"uid": true, "resourceVersion": true, "creationTimestamp": true, "managedFields": true,
	"selfLink": true, "lastTransitionTime": true, "time": true, "lastUpdateTime": true,
}

// norm returns a copy of v without server-specific values.
func norm(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, val := range x {
			switch {
			case volatile[k]:
			case k == "deletionTimestamp" || k == "continue" || k == "token" || k == "expirationTimestamp" || k == "disruptedPods":
				if s, ok := val.(string); !ok || s != "" {
					out[k] = "<set>"
				}
			default:
				out[k] = norm(val)
			}
		}
		if gen, ok := x["generateName"].(string); ok {
			if name, ok := x["name"].(string); ok && strings.HasPrefix(name, gen) && len(name) == len(gen)+5 {
				out["name"] = gen + "<random>"
			}
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = norm(e)
		}
		return out
	}
	return v
}

// summary is what cases compare for one answer: errors by code, reason,
// message and details; objects by their normalized body (pods reduced to
// the fields clients set, since kube-apiserver admission adds more).
func summary(r resp) any {
	if r.Obj == nil {
		return map[string]any{"code": r.Code, "raw": string(r.Raw)}
	}
	if r.Obj["kind"] == "Status" {
		out := map[string]any{"code": r.Code}
		for _, k := range []string{"status", "reason", "message", "code"} {
			if v, ok := r.Obj[k]; ok {
				if s, ok := v.(string); ok {
					v = uuidRE.ReplaceAllString(numberRE.ReplaceAllString(s, "(<n>)"), "<uid>")
				}
				out["status."+k] = v
			}
		}
		if d, ok := r.Obj["details"]; ok {
			out["details"] = norm(d)
		}
		return out
	}
	obj := norm(r.Obj).(map[string]any)
	if items, ok := obj["items"].([]any); ok {
		names := []any{}
		for _, it := range items {
			m, _ := it.(map[string]any)
			md, _ := m["metadata"].(map[string]any)
			names = append(names, fmt.Sprintf("%v/%v", md["namespace"], md["name"]))
		}
		md, _ := obj["metadata"].(map[string]any)
		return map[string]any{"code": r.Code, "kind": obj["kind"], "items": names, "metadata": md}
	}
	if obj["kind"] == "Pod" {
		obj = podView(obj)
	}
	return map[string]any{"code": r.Code, "object": obj}
}

func podView(pod map[string]any) map[string]any {
	spec, _ := pod["spec"].(map[string]any)
	status, _ := pod["status"].(map[string]any)
	var containers []any
	cs, _ := spec["containers"].([]any)
	for _, c := range cs {
		m, _ := c.(map[string]any)
		containers = append(containers, map[string]any{"name": m["name"], "image": m["image"]})
	}
	var conds []string
	cl, _ := status["conditions"].([]any)
	for _, c := range cl {
		m, _ := c.(map[string]any)
		conds = append(conds, fmt.Sprintf("%v=%v/%v", m["type"], m["status"], m["reason"]))
	}
	sort.Strings(conds)
	return map[string]any{
		"kind": pod["kind"], "apiVersion": pod["apiVersion"], "metadata": pod["metadata"],
		"containers": containers, "nodeName": spec["nodeName"], "phase": status["phase"], "conditions": conds,
	}
}

// pick extracts a few paths (dot separated) from an answer's object.
func pick(r resp, paths ...string) map[string]any {
	out := map[string]any{"code": r.Code}
	obj := norm(r.Obj)
	for _, p := range paths {
		var cur any = obj
		for _, seg := range strings.Split(p, ".") {
			m, _ := cur.(map[string]any)
			cur = m[seg]
		}
		out[p] = cur
	}
	return out
}
