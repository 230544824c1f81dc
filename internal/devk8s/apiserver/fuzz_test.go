package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
)

// fuzzServer is one dev-k8s API server per fuzzing process, with the
// NstanceMachine CRD installed and a ConfigMap "cm", a Pod "p" and an
// NstanceMachine "m" to update and patch.
func fuzzServer(f testing.TB) (*Server, string) {
	dir := f.TempDir()
	crd := filepath.Join("..", "..", "..", "config", "crd", "bases", "infrastructure.cluster.x-k8s.io_nstancemachines.yaml")
	ctx, cancel := context.WithCancel(context.Background())
	s, err := New(ctx, logr.Discard(), Options{Dir: dir, CRDFiles: []string{crd}})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		cancel()
		_ = s.Close()
	})
	if err := fuzzObjects(s); err != nil {
		f.Fatal(err)
	}
	return s, dir
}

// fuzzObjects creates those of "cm", "p" and "m" that do not exist (an
// input may have deleted one, e.g. by setting a deletionTimestamp).
func fuzzObjects(s *Server) error {
	for _, c := range []struct{ path, name, body string }{
		{"/api/v1/namespaces/default/configmaps", "cm", `{"metadata":{"name":"cm","labels":{"a":"b"}},"data":{"k":"v"}}`},
		{"/api/v1/namespaces/default/pods", "p", `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"busybox","ports":[{"containerPort":80}]}]}}`},
		{"/apis/infrastructure.cluster.x-k8s.io/v1beta1/namespaces/default/nstancemachines", "m", `{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta1","kind":"NstanceMachine","metadata":{"name":"m"},"spec":{"group":"workers","shard":"dev-1"}}`},
	} {
		if code, _ := fuzzDo(s, http.MethodGet, c.path+"/"+c.name, "", nil); code == http.StatusOK {
			continue
		}
		if code, body := fuzzDo(s, http.MethodPost, c.path, "application/json", []byte(c.body)); code != http.StatusCreated {
			return fmt.Errorf("creating %s/%s: %d %s", c.path, c.name, code, body)
		}
	}
	return nil
}

func fuzzDo(s *Server, method, target, contentType string, body []byte) (int, []byte) {
	req := httptest.NewRequest(method, target, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.AdminToken())
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes()
}

// fuzzOps are the body-decoding requests FuzzRequestBody sends.
var fuzzOps = []struct{ method, path, contentType string }{
	{http.MethodPost, "/api/v1/namespaces/default/configmaps", "application/json"},
	{http.MethodPost, "/api/v1/namespaces/default/configmaps", "application/yaml"},
	{http.MethodPost, "/api/v1/namespaces/default/pods", "application/vnd.kubernetes.protobuf"},
	{http.MethodPut, "/api/v1/namespaces/default/configmaps/cm", "application/json"},
	{http.MethodPatch, "/api/v1/namespaces/default/configmaps/cm", "application/json-patch+json"},
	{http.MethodPatch, "/api/v1/namespaces/default/configmaps/cm", "application/merge-patch+json"},
	{http.MethodPatch, "/api/v1/namespaces/default/configmaps/cm", "application/strategic-merge-patch+json"},
	{http.MethodPatch, "/api/v1/namespaces/default/configmaps/cm?fieldManager=fuzz", "application/apply-patch+yaml"},
	{http.MethodPatch, "/api/v1/namespaces/default/pods/p", "application/strategic-merge-patch+json"},
	{http.MethodPatch, "/api/v1/namespaces/default/pods/p", "application/json-patch+json"},
	{http.MethodPut, "/api/v1/namespaces/default/pods/p/status", "application/json"},
	{http.MethodPost, "/apis/infrastructure.cluster.x-k8s.io/v1beta1/namespaces/default/nstancemachines", "application/json"},
	{http.MethodPatch, "/apis/infrastructure.cluster.x-k8s.io/v1beta1/namespaces/default/nstancemachines/m", "application/merge-patch+json"},
	{http.MethodPatch, "/apis/infrastructure.cluster.x-k8s.io/v1beta1/namespaces/default/nstancemachines/m?fieldManager=fuzz&force=true", "application/apply-patch+yaml"},
	{http.MethodPut, "/apis/infrastructure.cluster.x-k8s.io/v1beta1/namespaces/default/nstancemachines/m", "application/json"},
}

// FuzzRequestBody sends arbitrary bodies to dev-k8s's create, update and
// patch endpoints (JSON, YAML and protobuf bodies; JSON, merge,
// strategic-merge and apply patches; built-in kinds and a custom resource
// with its CRD schema). No request may panic or fail with a server error,
// and the objects updated stay served as JSON objects of the same name.
func FuzzRequestBody(f *testing.F) {
	for i, body := range []string{
		`{"metadata":{"name":"x"},"data":{"a":"1"}}`,
		"metadata:\n  name: y\ndata:\n  a: \"1\"\n",
		"k8s\x00\n\x0a\x02v1\x12\x03Pod\x12\x00",
		`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm","resourceVersion":"1"},"data":{"k":"w"}}`,
		`[{"op":"add","path":"/data/x","value":"1"},{"op":"remove","path":"/metadata/labels/a"},{"op":"move","from":"/data/k","path":"/data/z"}]`,
		`{"data":{"k":null,"n":"2"},"metadata":{"labels":{"c":"d"}}}`,
		`{"data":{"$patch":"replace","k":"v2"},"$setElementOrder/x":[]}`,
		"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata:\n  k: applied\n",
		`{"spec":{"containers":[{"name":"c","image":"nginx"},{"name":"d","image":"x","$patch":"delete"}],"$setElementOrder/containers":[{"name":"c"}]}}`,
		`[{"op":"replace","path":"/spec/containers/0/image","value":"x"},{"op":"test","path":"/metadata/name","value":"p"}]`,
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}`,
		`{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta1","kind":"NstanceMachine","metadata":{"generateName":"m-"},"spec":{"group":"workers","shard":"dev-1"}}`,
		`{"spec":{"group":"Bad_Group"},"status":{"ready":true}}`,
		"apiVersion: infrastructure.cluster.x-k8s.io/v1beta1\nkind: NstanceMachine\nmetadata:\n  name: m\nspec:\n  group: others\n  shard: dev-1\n",
		`{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta1","kind":"NstanceMachine","metadata":{"name":"m"},"spec":{"group":7}}`,
	} {
		f.Add(uint8(i), []byte(body))
	}
	f.Add(uint8(0), []byte(`{"metadata":{"name":"a","namespace":"other","ownerReferences":[{"apiVersion":"v1","kind":"Pod","name":"p","uid":"x","controller":true}]}}`))
	f.Add(uint8(4), []byte(`[{"op":"copy","from":"","path":"/data/self"}]`))
	f.Add(uint8(1), []byte("a: &a [*a, *a]\nb: *a\n"))
	f.Add(uint8(5), []byte(`{"metadata":{"name":"other"}}`))
	// json-patch v4 panicked on this one under the store lock, which stayed
	// held: every later request hung (found by the campaign as a worker
	// "hung while minimizing").
	f.Add(uint8(4), []byte(`[{"op":"replace","path":""}]`))

	s, _ := fuzzServer(f)
	f.Fuzz(func(t *testing.T, op uint8, body []byte) {
		if err := fuzzObjects(s); err != nil {
			t.Fatalf("after the previous input: %v", err)
		}
		o := fuzzOps[int(op)%len(fuzzOps)]
		code, resp := fuzzDo(s, o.method, o.path, o.contentType, body)
		if code >= 500 && !mirroredApplyError(o.contentType, resp) {
			t.Fatalf("%s %s (%s): %d %s\nbody: %q", o.method, o.path, o.contentType, code, resp, body)
		}
		if code == http.StatusCreated && o.method == http.MethodPost {
			var obj struct {
				Metadata struct{ Name, Namespace string }
			}
			if err := json.Unmarshal(resp, &obj); err != nil || obj.Metadata.Name == "" {
				t.Fatalf("created object without a name: %s", resp)
			}
			if code, resp := fuzzDo(s, http.MethodDelete, o.path+"/"+obj.Metadata.Name, "", nil); code >= 300 {
				t.Fatalf("deleting the created %s: %d %s", obj.Metadata.Name, code, resp)
			}
		}
		for _, p := range []string{"/api/v1/namespaces/default/configmaps/cm", "/api/v1/namespaces/default/pods/p",
			"/apis/infrastructure.cluster.x-k8s.io/v1beta1/namespaces/default/nstancemachines/m"} {
			code, resp := fuzzDo(s, http.MethodGet, p, "", nil)
			if code == http.StatusNotFound {
				continue // deleted, e.g. by a deletionTimestamp; recreated next time
			}
			var obj struct {
				Metadata struct{ Name, Namespace string }
			}
			if code != http.StatusOK || json.Unmarshal(resp, &obj) != nil || obj.Metadata.Namespace != "default" ||
				obj.Metadata.Name != filepath.Base(p) {
				t.Fatalf("after %s %s: GET %s: %d %s", o.method, o.path, p, code, resp)
			}
		}
	})
}

// mirroredApplyError reports whether a 5xx answer is the one kube-apiserver
// gives, and serverSideApply copies on purpose, for an apply error without
// a status (e.g. "failed to create typed patch object ...: field not
// declared in schema"): code 500, no reason. A panic or an internal failure
// is answered with reason InternalError and is never acceptable.
func mirroredApplyError(contentType string, resp []byte) bool {
	var st struct {
		Reason, Message string
		Code            int
	}
	return contentType == "application/apply-patch+yaml" && json.Unmarshal(resp, &st) == nil &&
		st.Code == http.StatusInternalServerError && st.Reason == "" && st.Message != ""
}

// sameStrings reports whether the JSON value file (a map of strings, or
// absent) holds the same entries as served.
func sameStrings(file any, served map[string]string) bool {
	m, _ := file.(map[string]any)
	if len(m) != len(served) {
		return false
	}
	for k, v := range m {
		if s, ok := v.(string); !ok || served[k] != s {
			return false
		}
	}
	return true
}

// FuzzHandEditedFile writes arbitrary bytes over the file of a stored
// object (a ConfigMap, a Pod, a cluster-scoped Node or an NstanceMachine)
// and has the store read it, as after a hand edit. It must never panic or
// make the server fail; the object is then either the last good one or the
// file's (its labels, and a ConfigMap's data, as written), served under the
// file's name and namespace.
func FuzzHandEditedFile(f *testing.F) {
	f.Add(uint8(0), []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm","namespace":"default"},"data":{"k":"edited"}}`))
	f.Add(uint8(0), []byte(`{"metadata":{"name":"other","namespace":"kube-system","resourceVersion":"99999999999999999999"},"data":{"k":1}}`))
	f.Add(uint8(1), []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[]}}`))
	f.Add(uint8(2), []byte(`{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1","labels":{"a":"b"}},"status":{"capacity":{"cpu":"2"}}}`))
	f.Add(uint8(3), []byte(`{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta1","kind":"NstanceMachine","metadata":{"name":"m"},"spec":{"group":"Bad_Group","shard":"dev-1"}}`))
	f.Add(uint8(3), []byte(`{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta1","kind":"NstanceMachine","metadata":{"name":"m"},"spec":{"group":"g","shard":"dev-1","bogus":{}}}`))
	f.Add(uint8(0), []byte(`{"metadata":{"name":"cm"},"data":{"k":`))
	f.Add(uint8(0), []byte("null"))
	f.Add(uint8(0), []byte(`{"metadata":[]}`))
	f.Add(uint8(0), []byte(`{"metadata":{"deletionTimestamp":"2026-01-01T00:00:00Z","finalizers":["x"]}}`))
	f.Add(uint8(1), []byte(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"cm","uid":"u"}]}}`))

	s, dir := fuzzServer(f)
	if code, body := fuzzDo(s, http.MethodPost, "/api/v1/nodes", "application/json", []byte(`{"metadata":{"name":"n1"}}`)); code != http.StatusCreated {
		f.Fatalf("creating the node: %d %s", code, body)
	}
	files := []struct{ file, api string }{
		{"configmaps/default/cm.json", "/api/v1/namespaces/default/configmaps/cm"},
		{"pods/default/p.json", "/api/v1/namespaces/default/pods/p"},
		{"nodes/n1.json", "/api/v1/nodes/n1"},
		{"nstancemachines/default/m.json", "/apis/infrastructure.cluster.x-k8s.io/v1beta1/namespaces/default/nstancemachines/m"},
	}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		c := files[int(which)%len(files)]
		path := filepath.Join(dir, filepath.FromSlash(c.file))
		_, before := fuzzDo(s, http.MethodGet, c.api, "", nil)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		s.store.Resync()
		code, resp := fuzzDo(s, http.MethodGet, c.api, "", nil)
		if code == http.StatusNotFound {
			// A hand edit may mark the object deleted (deletionTimestamp
			// without finalizers); the next write of its file brings it back.
			return
		}
		var obj struct {
			Metadata struct {
				Name, Namespace string
				Labels          map[string]string
			}
			Data map[string]string
		}
		if code != http.StatusOK || json.Unmarshal(resp, &obj) != nil || obj.Metadata.Name != filepath.Base(c.api) {
			t.Fatalf("after writing %q to %s: GET: %d %s", data, c.file, code, resp)
		}
		wantNS := "default"
		if c.file == "nodes/n1.json" {
			wantNS = ""
		}
		if obj.Metadata.Namespace != wantNS {
			t.Fatalf("after writing %q to %s: served in namespace %q", data, c.file, obj.Metadata.Namespace)
		}
		if bytes.Equal(before, resp) {
			return // the last good object, kept
		}
		// Otherwise the served object is the file's: its labels (and a
		// ConfigMap's data) are the file's. (A metadata that is not an
		// object is replaced: the file name gives name and namespace.)
		var file map[string]any
		if err := json.Unmarshal(data, &file); err != nil || file == nil {
			t.Fatalf("after writing %q to %s, which is not a JSON object (%v), the served object changed to %s", data, c.file, err, resp)
		}
		var labels any
		if md, ok := file["metadata"].(map[string]any); ok {
			labels = md["labels"]
		}
		if !sameStrings(labels, obj.Metadata.Labels) {
			t.Fatalf("after writing %q to %s: served labels %v, the file's %v", data, c.file, obj.Metadata.Labels, labels)
		}
		if c.file == "configmaps/default/cm.json" && !sameStrings(file["data"], obj.Data) {
			t.Fatalf("after writing %q to %s: served data %v, the file's %v", data, c.file, obj.Data, file["data"])
		}
	})
}
