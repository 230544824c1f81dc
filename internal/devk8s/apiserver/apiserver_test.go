package apiserver

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func startServer(t *testing.T, opts Options) (*Server, *httptest.Server) {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := New(ctx, logr.Discard(), opts)
	require.NoError(t, err)
	hs := httptest.NewServer(s)
	serverTokens.Store(hs.Listener.Addr().String(), s.AdminToken())
	t.Cleanup(func() {
		hs.Close()
		cancel()
		require.NoError(t, s.Close())
	})
	return s, hs
}

// serverTokens maps each test server's address to its admin token, which
// testClient sends: dev-k8s answers 401 to requests without one.
var (
	serverTokens sync.Map
	testClient   = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if tok, ok := serverTokens.Load(r.URL.Host); ok {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+tok.(string))
		}
		return http.DefaultTransport.RoundTrip(r)
	})}
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func call(t *testing.T, method, url, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	res, err := testClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	var obj map[string]any
	_ = json.Unmarshal(data, &obj)
	return res.StatusCode, obj
}

// watchLines streams watch events as decoded maps until the stream ends.
func watchLines(t *testing.T, url string) <-chan map[string]any {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	res, err := testClient.Do(req)
	require.NoError(t, err)
	out := make(chan map[string]any, 100)
	go func() {
		defer close(out)
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var ev map[string]any
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				out <- ev
			}
		}
	}()
	return out
}

func next(t *testing.T, ch <-chan map[string]any) map[string]any {
	t.Helper()
	select {
	case ev, ok := <-ch:
		require.True(t, ok, "watch ended")
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no watch event")
	}
	return nil
}

func TestPeriodicBookmarks(t *testing.T) {
	_, hs := startServer(t, Options{BookmarkInterval: 50 * time.Millisecond})
	code, list := call(t, http.MethodGet, hs.URL+"/api/v1/namespaces/default/configmaps", "")
	require.Equal(t, http.StatusOK, code)
	rv := list["metadata"].(map[string]any)["resourceVersion"].(string)
	ch := watchLines(t, hs.URL+"/api/v1/namespaces/default/configmaps?watch=1&allowWatchBookmarks=true&resourceVersion="+rv)
	ev := next(t, ch)
	require.Equal(t, "BOOKMARK", ev["type"])
	md := ev["object"].(map[string]any)["metadata"].(map[string]any)
	require.NotEmpty(t, md["resourceVersion"])
	code, _ = call(t, http.MethodPost, hs.URL+"/api/v1/namespaces/default/configmaps", `{"metadata":{"name":"a"}}`)
	require.Equal(t, http.StatusCreated, code)
	for {
		ev = next(t, ch)
		if ev["type"] != "BOOKMARK" {
			break
		}
	}
	require.Equal(t, "ADDED", ev["type"])
}

func TestSlowWatchEndsStream(t *testing.T) {
	_, hs := startServer(t, Options{WatchBuffer: 1})
	// Open a watch but do not read it; a burst of changes overflows it
	// and the server ends the stream instead of blocking or dropping.
	req, err := http.NewRequest(http.MethodGet, hs.URL+"/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=0", nil)
	require.NoError(t, err)
	res, err := testClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	for i := 0; i < 2000; i++ {
		code, _ := call(t, http.MethodPost, hs.URL+"/api/v1/namespaces/default/configmaps", `{"metadata":{"generateName":"x-"},"data":{"pad":"`+strings.Repeat("p", 2048)+`"}}`)
		require.Equal(t, http.StatusCreated, code)
	}
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, res.Body)
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err, "the stream ends cleanly; the client relists")
	case <-time.After(10 * time.Second):
		t.Fatal("overflowed watch was not closed")
	}
}

func TestHandEditedFiles(t *testing.T) {
	dir := t.TempDir()
	_, hs := startServer(t, Options{Dir: dir})
	base := hs.URL + "/api/v1/namespaces/default/configmaps"
	code, _ := call(t, http.MethodPost, base, `{"metadata":{"name":"c"},"data":{"v":"1"}}`)
	require.Equal(t, http.StatusCreated, code)
	_, got := call(t, http.MethodGet, base+"/c", "")
	rv := got["metadata"].(map[string]any)["resourceVersion"].(string)
	ch := watchLines(t, base+"?watch=1&resourceVersion="+rv)
	path := filepath.Join(dir, "configmaps", "default", "c.json")

	cases := []struct {
		name    string
		content string
		// want is the data served afterwards; event is the watch event
		// type expected ("" for none).
		want  string
		event string
	}{
		{name: "valid edit", content: `{"metadata":{"name":"c"},"data":{"v":"2"}}`, want: "2", event: "MODIFIED"},
		{name: "torn JSON", content: `{"metadata":{"name":"c"},"data":{"v":`, want: "2"},
		{name: "not an object", content: `[1,2]`, want: "2"},
		{name: "empty", content: ``, want: "2"},
		{name: "repaired", content: `{"data":{"v":"3"}}`, want: "3", event: "MODIFIED"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, os.WriteFile(path, []byte(tc.content), 0o644))
			if tc.event != "" {
				ev := next(t, ch)
				require.Equal(t, tc.event, ev["type"])
				md := ev["object"].(map[string]any)["metadata"].(map[string]any)
				require.NotEqual(t, rv, md["resourceVersion"], "a fresh resourceVersion")
				rv = md["resourceVersion"].(string)
			} else {
				select {
				case ev := <-ch:
					t.Fatalf("unexpected event %v", ev["type"])
				case <-time.After(300 * time.Millisecond):
				}
			}
			code, got := call(t, http.MethodGet, base+"/c", "")
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, tc.want, got["data"].(map[string]any)["v"])
		})
	}
}

func TestHandWrittenCRDIsServed(t *testing.T) {
	dir := t.TempDir()
	_, hs := startServer(t, Options{Dir: dir})
	crd := `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
"spec":{"group":"hand.example.com","scope":"Namespaced","names":{"plural":"notes","kind":"Note"},
"versions":[{"name":"v1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object"}}}]}}`
	crdDir := filepath.Join(dir, "customresourcedefinitions")
	require.NoError(t, os.WriteFile(filepath.Join(crdDir, "notes.hand.example.com.json"), []byte(crd), 0o644))
	require.Eventually(t, func() bool {
		code, _ := call(t, http.MethodGet, hs.URL+"/apis/hand.example.com/v1/namespaces/default/notes", "")
		return code == http.StatusOK
	}, 5*time.Second, 20*time.Millisecond)
	code, obj := call(t, http.MethodPost, hs.URL+"/apis/hand.example.com/v1/namespaces/default/notes", `{"apiVersion":"hand.example.com/v1","kind":"Note","metadata":{"name":"n"}}`)
	require.Equal(t, http.StatusCreated, code, "%v", obj)
	_, err := os.Stat(filepath.Join(dir, "notes", "default", "n.json"))
	require.NoError(t, err)
}

// TestCRDNotServedBeforeItsStorageIsLoaded holds the window between a CRD
// entering the registry and the store loading its files: the resource
// answers 404 (not served yet) rather than an empty list and a 500 on create
// (TestHandWrittenCRDIsServed met that window once in make test).
func TestCRDNotServedBeforeItsStorageIsLoaded(t *testing.T) {
	s, hs := startServer(t, Options{})
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "slows.hand.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "hand.example.com", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "slows", Kind: "Slow"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object"}}}},
		},
	}
	// What crdChanged does first; the store has not registered it yet.
	require.NoError(t, s.reg.AddCRD(crd))
	url := hs.URL + "/apis/hand.example.com/v1/namespaces/default/slows"
	code, _ := call(t, http.MethodGet, url, "")
	require.Equal(t, http.StatusNotFound, code)
	code, _ = call(t, http.MethodPost, url, `{"apiVersion":"hand.example.com/v1","kind":"Slow","metadata":{"name":"n"}}`)
	require.Equal(t, http.StatusNotFound, code)
	// Then the store loads it, and it is served.
	require.NoError(t, s.store.Register(s.reg.StorageDir("hand.example.com", "slows"), true))
	code, obj := call(t, http.MethodPost, url, `{"apiVersion":"hand.example.com/v1","kind":"Slow","metadata":{"name":"n"}}`)
	require.Equal(t, http.StatusCreated, code, "%v", obj)
}

func TestTableFallbackAndProtobufRefusal(t *testing.T) {
	_, hs := startServer(t, Options{})
	cases := []struct {
		name, accept, wantKind string
	}{
		{name: "table", accept: "application/json;as=Table;v=v1;g=meta.k8s.io,application/json", wantKind: "Table"},
		{name: "v1beta1 table falls back", accept: "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json", wantKind: "NamespaceList"},
		{name: "plain", accept: "application/json", wantKind: "NamespaceList"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, hs.URL+"/api/v1/namespaces", nil)
			require.NoError(t, err)
			req.Header.Set("Accept", tc.accept)
			res, err := testClient.Do(req)
			require.NoError(t, err)
			defer res.Body.Close()
			var obj map[string]any
			require.NoError(t, json.NewDecoder(res.Body).Decode(&obj))
			require.Equal(t, tc.wantKind, obj["kind"])
			require.Equal(t, "application/json", res.Header.Get("Content-Type"))
		})
	}
	req, err := http.NewRequest(http.MethodPost, hs.URL+"/apis/policy/v1/namespaces/default/poddisruptionbudgets", strings.NewReader("\x00garbage"))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/vnd.kubernetes.protobuf")
	res, err := testClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
}

// TestHandMadeFilesWithInvalidNames checks that files whose path makes a
// name kube-apiserver would refuse are not served (and left alone).
func TestHandMadeFilesWithInvalidNames(t *testing.T) {
	dir := t.TempDir()
	cm := `{"apiVersion":"v1","kind":"ConfigMap","data":{"k":"v"}}`
	files := map[string]string{
		"configmaps/default/UPPER.json":     cm,
		"configmaps/default/under_scr.json": cm,
		"configmaps/Bad_NS/x.json":          cm,
		"configmaps/default/ok.json":        cm,
		"namespaces/Bad.json":               `{"apiVersion":"v1","kind":"Namespace"}`,
		"namespaces/a.b.json":               `{"apiVersion":"v1","kind":"Namespace"}`,
		"events/default/Any_Name.json":      `{"apiVersion":"v1","kind":"Event","involvedObject":{"kind":"Pod","name":"p","namespace":"default"}}`,
	}
	for p, content := range files {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, p), []byte(content), 0o644))
	}
	_, hs := startServer(t, Options{Dir: dir})
	names := func(path string) []string {
		code, obj := call(t, http.MethodGet, hs.URL+path, "")
		require.Equal(t, http.StatusOK, code)
		var out []string
		for _, it := range obj["items"].([]any) {
			md := it.(map[string]any)["metadata"].(map[string]any)
			out = append(out, md["name"].(string))
		}
		return out
	}
	require.Equal(t, []string{"ok"}, names("/api/v1/configmaps"))
	require.NotContains(t, names("/api/v1/namespaces"), "Bad")
	require.NotContains(t, names("/api/v1/namespaces"), "a.b")
	require.Equal(t, []string{"Any_Name"}, names("/api/v1/namespaces/default/events"), "core v1 events keep their lenient names")
	for p, content := range files {
		data, err := os.ReadFile(filepath.Join(dir, p))
		require.NoError(t, err)
		if !strings.HasSuffix(p, "ok.json") && !strings.HasPrefix(p, "events/") {
			require.Equal(t, content, string(data), "%s is left as it was", p)
		}
	}
}
