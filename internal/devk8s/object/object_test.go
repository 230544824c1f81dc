package object

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSpecChanged(t *testing.T) {
	a := map[string]any{"metadata": map[string]any{"name": "a"}, "spec": map[string]any{"x": int64(1)}, "status": map[string]any{"y": "1"}}
	b := DeepCopy(a)
	Meta(b)["labels"] = map[string]any{"l": "v"}
	b["status"] = map[string]any{"y": "2"}
	require.False(t, SpecChanged(a, b), "metadata and status are not the spec")
	b["data"] = map[string]any{"k": "v"}
	require.True(t, SpecChanged(a, b), "any other top-level field is")
}

func TestOwnerRefs(t *testing.T) {
	obj := map[string]any{"metadata": map[string]any{"ownerReferences": []any{
		map[string]any{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u1", "controller": true},
		map[string]any{"kind": "DaemonSet", "name": int64(5)},
	}}}
	refs := OwnerRefs(obj)
	require.Len(t, refs, 1, "malformed entries are skipped")
	require.Equal(t, "DaemonSet", refs[0].Kind)
	require.True(t, *refs[0].Controller)
	require.Nil(t, OwnerRefs(map[string]any{}))
}

func TestNestedAndDefaults(t *testing.T) {
	obj := map[string]any{}
	spec := ChildMap(obj, "spec")
	SetDefault(spec, "replicas", int64(1))
	SetDefault(spec, "replicas", int64(2))
	n, ok := Int64(NestedMap(obj, "spec")["replicas"])
	require.True(t, ok)
	require.Equal(t, int64(1), n, "a default does not replace a value")
	_, ok = Nested(obj, "spec", "missing")
	require.False(t, ok)
	require.Nil(t, NonEmptyMap(map[string]any{}))
}

func TestFinalizers(t *testing.T) {
	md := map[string]any{"finalizers": []any{"a", 7, "b"}}
	require.Equal(t, []string{"a", "b"}, Finalizers(md), "non-strings are skipped")
	require.Empty(t, Finalizers(map[string]any{}))
}
