package apiserver

import (
	"crypto/rand"
	"fmt"
	"math/big"
	"reflect"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
)

// Helpers over unstructured (map) objects.

func metaOf(obj map[string]any) map[string]any {
	md, ok := obj["metadata"].(map[string]any)
	if !ok {
		md = map[string]any{}
		obj["metadata"] = md
	}
	return md
}

func str(m map[string]any, k string) string {
	v, _ := m[k].(string)
	return v
}

func nested(obj map[string]any, path ...string) (any, bool) {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		cur, ok = m[p]
		if !ok {
			return nil, false
		}
	}
	return cur, true
}

func nestedString(obj map[string]any, path ...string) string {
	v, _ := nested(obj, path...)
	s, _ := v.(string)
	return s
}

func nestedMap(obj map[string]any, path ...string) map[string]any {
	v, _ := nested(obj, path...)
	m, _ := v.(map[string]any)
	return m
}

func stringMap(v any) map[string]string {
	m, _ := v.(map[string]any)
	out := make(map[string]string, len(m))
	for k, val := range m {
		if s, ok := val.(string); ok {
			out[k] = s
		}
	}
	return out
}

func finalizers(md map[string]any) []string {
	raw, _ := md["finalizers"].([]any)
	out := make([]string, 0, len(raw))
	for _, f := range raw {
		if s, ok := f.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func setFinalizers(md map[string]any, fs []string) {
	if len(fs) == 0 {
		delete(md, "finalizers")
		return
	}
	raw := make([]any, len(fs))
	for i, f := range fs {
		raw[i] = f
	}
	md["finalizers"] = raw
}

func hasDeletionTimestamp(obj map[string]any) bool {
	if obj == nil {
		return false
	}
	md, _ := obj["metadata"].(map[string]any)
	return str(md, "deletionTimestamp") != ""
}

func int64Of(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case float64:
		return int64(n), true
	case int:
		return int64(n), true
	}
	return 0, false
}

func timestamp(t time.Time) string {
	return t.UTC().Format(time.RFC3339)
}

const nameChars = "bcdfghjklmnpqrstvwxz2456789"

// generateName appends five random characters as kube-apiserver does.
func generateName(base string) string {
	if len(base) > 58 {
		base = base[:58]
	}
	b := make([]byte, 5)
	for i := range b {
		n, err := rand.Int(rand.Reader, big.NewInt(int64(len(nameChars))))
		if err != nil {
			panic(fmt.Sprintf("random name: %v", err))
		}
		b[i] = nameChars[n.Int64()]
	}
	return base + string(b)
}

// withoutMetaStatus returns the parts of an object that count as its spec
// for generation tracking.
func specPart(obj map[string]any) map[string]any {
	out := make(map[string]any, len(obj))
	for k, v := range obj {
		switch k {
		case "metadata", "status", "apiVersion", "kind":
			continue
		}
		out[k] = v
	}
	return out
}

func specChanged(a, b map[string]any) bool {
	return !reflect.DeepEqual(specPart(a), specPart(b))
}

func generationOf(md map[string]any) int64 {
	g, _ := int64Of(md["generation"])
	return g
}

// tidyMeta drops empty metadata collections, as encoding ObjectMeta does.
func tidyMeta(obj map[string]any) {
	md := metaOf(obj)
	for _, k := range []string{"labels", "annotations", "finalizers", "ownerReferences"} {
		switch v := md[k].(type) {
		case map[string]any:
			if len(v) == 0 {
				delete(md, k)
			}
		case []any:
			if len(v) == 0 {
				delete(md, k)
			}
		case nil:
			delete(md, k)
		}
	}
}

// prepareCreate fills server-managed fields of a new object.
func (s *Server) prepareCreate(res *registry.Resource, obj map[string]any, now time.Time) {
	tidyMeta(obj)
	md := metaOf(obj)
	md["uid"] = string(uuid.NewUUID())
	md["creationTimestamp"] = timestamp(now)
	delete(md, "resourceVersion")
	delete(md, "deletionTimestamp")
	delete(md, "deletionGracePeriodSeconds")
	delete(md, "selfLink")
	if res.Generation {
		md["generation"] = int64(1)
	} else {
		delete(md, "generation")
	}
	obj["apiVersion"] = res.APIVersion()
	obj["kind"] = res.Kind
	if res.Status && !res.BuiltIn {
		delete(obj, "status")
	}
	s.defaultCreate(res, obj)
}

// prepareUpdate computes the stored object for an update of cur to obj
// through the main resource (sub "") or the status subresource.
func prepareUpdate(res *registry.Resource, sub string, cur, obj map[string]any) map[string]any {
	var next map[string]any
	bump := false
	switch {
	case sub == "status" && isNodes(res):
		// kube-apiserver's Node status strategy resets only the spec: a
		// status write may change labels and annotations (the kubelet
		// sets its default labels on an existing Node that way).
		next = obj
		if sp, ok := cur["spec"]; ok {
			next["spec"] = sp
		} else {
			delete(next, "spec")
		}
	case sub == "status":
		next = deepCopy(cur)
		if st, ok := obj["status"]; ok {
			next["status"] = st
		} else {
			delete(next, "status")
		}
		return next
	default:
		bump = appsPrepareUpdate(res, sub, cur, obj)
		next = obj
		if res.Status {
			if st, ok := cur["status"]; ok {
				next["status"] = st
			} else {
				delete(next, "status")
			}
		}
	}
	md, cmd := metaOf(next), metaOf(cur)
	for _, k := range []string{"uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation", "name", "namespace"} {
		if v, ok := cmd[k]; ok {
			md[k] = v
		} else {
			delete(md, k)
		}
	}
	delete(md, "selfLink")
	if _, ok := md["managedFields"]; !ok {
		if mf, ok := cmd["managedFields"]; ok {
			md["managedFields"] = mf
		}
	}
	next["apiVersion"] = res.APIVersion()
	next["kind"] = res.Kind
	if res.Generation && (bump || specChanged(cur, next) || (!res.Status && !jsonEqual(cur["status"], next["status"]))) {
		md["generation"] = generationOf(cmd) + 1
	}
	return next
}

// isNodes reports whether res is the core Node resource.
func isNodes(res *registry.Resource) bool {
	return res.BuiltIn && res.Group == "" && res.Resource == "nodes"
}

func rvOf(obj map[string]any) string {
	return str(metaOf(obj), "resourceVersion")
}

func parseRV(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	return strconv.ParseUint(s, 10, 64)
}

func schemaGK(group, kind string) schema.GroupKind {
	return schema.GroupKind{Group: group, Kind: kind}
}
