package object

import (
	"reflect"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Meta returns the object's metadata map, adding an empty one if missing.
func Meta(obj map[string]any) map[string]any {
	md, ok := obj["metadata"].(map[string]any)
	if !ok {
		md = map[string]any{}
		obj["metadata"] = md
	}
	return md
}

// Str returns m[k] when it is a string, else "".
func Str(m map[string]any, k string) string {
	v, _ := m[k].(string)
	return v
}

// Nested returns the value at path and whether it is there.
func Nested(obj map[string]any, path ...string) (any, bool) {
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

// NestedString returns the string at path, or "".
func NestedString(obj map[string]any, path ...string) string {
	v, _ := Nested(obj, path...)
	s, _ := v.(string)
	return s
}

// NestedMap returns the map at path, or nil.
func NestedMap(obj map[string]any, path ...string) map[string]any {
	v, _ := Nested(obj, path...)
	m, _ := v.(map[string]any)
	return m
}

// ChildMap returns m[k] as a map, adding an empty one if missing.
func ChildMap(m map[string]any, k string) map[string]any {
	c, _ := m[k].(map[string]any)
	if c == nil {
		c = map[string]any{}
		m[k] = c
	}
	return c
}

// Finalizers returns the finalizers of an object's metadata map.
func Finalizers(md map[string]any) []string {
	raw, _ := md["finalizers"].([]any)
	out := make([]string, 0, len(raw))
	for _, f := range raw {
		if s, ok := f.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// StringMap returns the string values of a map value.
func StringMap(v any) map[string]string {
	m, _ := v.(map[string]any)
	out := make(map[string]string, len(m))
	for k, val := range m {
		if s, ok := val.(string); ok {
			out[k] = s
		}
	}
	return out
}

// NonEmptyMap returns v as a map, or nil when it is not one or empty.
func NonEmptyMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	if len(m) == 0 {
		return nil
	}
	return m
}

// List returns v as a list, or nil.
func List(v any) []any {
	l, _ := v.([]any)
	return l
}

// Int64 reads a JSON number (int64, float64 or int).
func Int64(v any) (int64, bool) {
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

// SetDefault sets m[k] to v when k is absent.
func SetDefault(m map[string]any, k string, v any) {
	if _, ok := m[k]; !ok {
		m[k] = v
	}
}

// Equal compares two JSON values.
func Equal(a, b any) bool { return reflect.DeepEqual(a, b) }

// HasDeletionTimestamp reports whether obj is being deleted.
func HasDeletionTimestamp(obj map[string]any) bool {
	if obj == nil {
		return false
	}
	md, _ := obj["metadata"].(map[string]any)
	return Str(md, "deletionTimestamp") != ""
}

// Timestamp formats t as metav1.Time does.
func Timestamp(t time.Time) string {
	return t.UTC().Format(time.RFC3339)
}

// SpecPart returns the parts of an object that count as its spec for
// generation tracking (all but metadata, status and type).
func SpecPart(obj map[string]any) map[string]any {
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

// SpecChanged reports whether the spec parts of a and b differ.
func SpecChanged(a, b map[string]any) bool {
	return !reflect.DeepEqual(SpecPart(a), SpecPart(b))
}

// Generation reads metadata.generation from a metadata map.
func Generation(md map[string]any) int64 {
	g, _ := Int64(md["generation"])
	return g
}

// DeepCopy copies a JSON object.
func DeepCopy(obj map[string]any) map[string]any {
	if obj == nil {
		return nil
	}
	return runtime.DeepCopyJSON(obj)
}

// ToTyped converts an unstructured object into a Go type.
func ToTyped(obj map[string]any, out any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructured(obj, out)
}

// Replace makes obj hold exactly the keys of with.
func Replace(obj, with map[string]any) {
	for k := range obj {
		delete(obj, k)
	}
	for k, v := range with {
		obj[k] = v
	}
}

// OwnerRefs reads metadata.ownerReferences, skipping malformed entries.
func OwnerRefs(obj map[string]any) []metav1.OwnerReference {
	raw := List(Meta(obj)["ownerReferences"])
	if len(raw) == 0 {
		return nil
	}
	var refs []metav1.OwnerReference
	for _, r := range raw {
		m, _ := r.(map[string]any)
		var ref metav1.OwnerReference
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &ref); err == nil {
			refs = append(refs, ref)
		}
	}
	return refs
}
