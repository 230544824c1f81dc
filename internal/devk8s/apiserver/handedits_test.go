package apiserver

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHandEditedCustomResourceValidated edits a stored NstanceMachine's
// file to values its CRD refuses: the last valid object stays served (no
// watch event), and a Warning Event names the file and the field. A valid
// edit afterwards is served, pruned and defaulted.
func TestHandEditedCustomResourceValidated(t *testing.T) {
	dir := t.TempDir()
	crd := filepath.Join("..", "..", "..", "config", "crd", "bases", "infrastructure.cluster.x-k8s.io_nstancemachines.yaml")
	_, hs := startServer(t, Options{Dir: dir, CRDFiles: []string{crd}})
	base := hs.URL + "/apis/infrastructure.cluster.x-k8s.io/v1beta1/namespaces/default/nstancemachines"
	code, obj := call(t, http.MethodPost, base, `{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta1","kind":"NstanceMachine",
"metadata":{"name":"m"},"spec":{"group":"workers","shard":"dev-1"}}`)
	require.Equal(t, http.StatusCreated, code, "%v", obj)
	rv := obj["metadata"].(map[string]any)["resourceVersion"].(string)
	ch := watchLines(t, base+"?watch=1&resourceVersion="+rv)
	path := filepath.Join(dir, "nstancemachines", "default", "m.json")

	cases := []struct {
		name  string
		spec  string
		field string // named by the Event; "" for a valid edit
	}{
		{name: "pattern", spec: `{"group":"Bad_Group","shard":"dev-1"}`, field: `spec.group: Invalid value: "Bad_Group"`},
		{name: "immutable", spec: `{"group":"workers","shard":"dev-2"}`, field: "spec: Invalid value: shard is immutable once set"},
		{name: "type", spec: `{"group":7,"shard":"dev-1"}`, field: `spec.group: Invalid value: "integer"`},
		{name: "missing required", spec: `{"shard":"dev-1"}`, field: "spec.group: Required value"},
		{name: "valid", spec: `{"group":"others","shard":"dev-1","bogus":1}`},
	}
	seen := map[string]bool{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			content := `{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta1","kind":"NstanceMachine","metadata":{"name":"m","namespace":"default"},"spec":` + tc.spec + `}`
			require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
			if tc.field == "" {
				ev := next(t, ch)
				require.Equal(t, "MODIFIED", ev["type"])
				_, got := call(t, http.MethodGet, base+"/m", "")
				require.Equal(t, map[string]any{"group": "others", "shard": "dev-1"}, got["spec"], "served pruned")
				require.EqualValues(t, 2, got["metadata"].(map[string]any)["generation"], "a spec change")
				return
			}
			// The Event (new, about this edit) shows the file was processed.
			var ev map[string]any
			require.Eventually(t, func() bool {
				_, list := call(t, http.MethodGet, hs.URL+"/api/v1/namespaces/default/events", "")
				items, _ := list["items"].([]any)
				for _, it := range items {
					m := it.(map[string]any)
					name := m["metadata"].(map[string]any)["name"].(string)
					if !seen[name] && strings.Contains(m["message"].(string), tc.field) {
						seen[name], ev = true, m
						return true
					}
				}
				return false
			}, 5*time.Second, 20*time.Millisecond)
			require.Equal(t, "Warning", ev["type"])
			require.Equal(t, invalidFileReason, ev["reason"])
			require.Contains(t, ev["message"].(string), path)
			involved := ev["involvedObject"].(map[string]any)
			require.Equal(t, "NstanceMachine", involved["kind"])
			require.Equal(t, "m", involved["name"])
			require.Equal(t, obj["metadata"].(map[string]any)["uid"], involved["uid"])
			select {
			case ev := <-ch:
				t.Fatalf("invalid file served: %v", ev["type"])
			default:
			}
			_, got := call(t, http.MethodGet, base+"/m", "")
			require.Equal(t, map[string]any{"group": "workers", "shard": "dev-1"}, got["spec"], "last valid object")
		})
	}
	// A new file that fails is not served at all; its Event has no uid yet.
	fresh := filepath.Join(dir, "nstancemachines", "default", "fresh.json")
	require.NoError(t, os.WriteFile(fresh, []byte(`{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta1","kind":"NstanceMachine","spec":{"group":"Bad"}}`), 0o644))
	require.Eventually(t, func() bool {
		_, list := call(t, http.MethodGet, hs.URL+"/api/v1/namespaces/default/events", "")
		items, _ := list["items"].([]any)
		for _, it := range items {
			if strings.Contains(it.(map[string]any)["message"].(string), fresh) {
				return true
			}
		}
		return false
	}, 5*time.Second, 20*time.Millisecond)
	code, _ = call(t, http.MethodGet, base+"/fresh", "")
	require.Equal(t, http.StatusNotFound, code)

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var stored map[string]any
	require.NoError(t, json.Unmarshal(data, &stored))
	require.False(t, strings.Contains(string(data), "bogus"), "pruned field written back: %s", data)
}

// TestHandEditedBuiltInChecked: a hand-edited ConfigMap whose data holds a
// number (which no client can decode into a ConfigMap) keeps the last good
// object served, with a Warning Event naming the file; a valid edit is
// served as written.
func TestHandEditedBuiltInChecked(t *testing.T) {
	dir := t.TempDir()
	_, hs := startServer(t, Options{Dir: dir})
	base := hs.URL + "/api/v1/namespaces/default/configmaps"
	code, obj := call(t, http.MethodPost, base, `{"metadata":{"name":"cm"},"data":{"k":"v"}}`)
	require.Equal(t, http.StatusCreated, code, "%v", obj)
	path := filepath.Join(dir, "configmaps", "default", "cm.json")

	require.NoError(t, os.WriteFile(path, []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm"},"data":{"k":1}}`), 0o644))
	require.Eventually(t, func() bool {
		_, list := call(t, http.MethodGet, hs.URL+"/api/v1/namespaces/default/events", "")
		items, _ := list["items"].([]any)
		for _, it := range items {
			m := it.(map[string]any)
			if m["reason"] == invalidFileReason && strings.Contains(m["message"].(string), path) {
				return true
			}
		}
		return false
	}, 5*time.Second, 20*time.Millisecond, "a Warning Event names the file")
	_, got := call(t, http.MethodGet, base+"/cm", "")
	require.Equal(t, map[string]any{"k": "v"}, got["data"], "last good object")

	require.NoError(t, os.WriteFile(path, []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm"},"data":{"k":"edited"}}`), 0o644))
	require.Eventually(t, func() bool {
		_, got := call(t, http.MethodGet, base+"/cm", "")
		return got["data"].(map[string]any)["k"] == "edited"
	}, 5*time.Second, 20*time.Millisecond)
}
