package crschema

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
)

// TestPlainMetaMatchesRoundTrip compares plainMeta with apiextensions'
// ObjectMeta round trip on random metadata, and requires it to take the
// shortcut often and to leave everything odd to the round trip.
func TestPlainMetaMatchesRoundTrip(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	values := map[string][]any{
		"name":              {"m", "", "Bad_Name", int64(3), nil},
		"generateName":      {"m-", ""},
		"namespace":         {"default", "", true},
		"uid":               {"0b9c", ""},
		"resourceVersion":   {"12", "", int64(12)},
		"selfLink":          {"/apis/x", ""},
		"generation":        {int64(0), int64(1), int64(7), 2.0, "3", nil},
		"creationTimestamp": {nil, "2026-01-01T00:00:00Z", "2026-01-01T01:00:00+01:00", "2026-01-01T00:00:00.5Z", "0001-01-01T00:00:00Z", "yesterday", "", int64(5)},
		"labels":            {map[string]any{}, map[string]any{"a": "1"}, map[string]any{"a": "1", "b": ""}, map[string]any{"a": int64(1)}, map[string]any{"a": nil}, nil, "x"},
		"annotations":       {map[string]any{"note": "x"}, map[string]any{}},
		"finalizers":        {[]any{"f"}, []any{}},
		"deletionTimestamp": {"2026-01-01T00:00:00Z", nil},
		"Name":              {"m"},
		"bogus":             {"x"},
		"ownerReferences":   {[]any{}},
		"managedFields":     {nil},
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	plainCount := 0
	for i := 0; i < 20000; i++ {
		md := map[string]any{}
		n := r.Intn(6)
		for j := 0; j < n; j++ {
			k := keys[r.Intn(len(keys))]
			if r.Intn(3) > 0 { // favour the usual keys
				k = []string{"name", "namespace", "labels", "creationTimestamp", "generation", "uid"}[r.Intn(6)]
			}
			md[k] = values[k][r.Intn(len(values[k]))]
		}
		obj := map[string]any{"metadata": md}
		got, ok := plainMeta(obj)
		if !ok {
			continue
		}
		plainCount++
		for _, track := range []bool{false, true} {
			meta, found, unknown, err := schemaobjectmeta.GetObjectMetaWithOptions(obj, schemaobjectmeta.ObjectMetaOptions{ReturnUnknownFieldPaths: track})
			require.NoError(t, err, "%v", md)
			require.True(t, found)
			require.Empty(t, unknown, "%v", md)
			want := map[string]any{}
			require.NoError(t, schemaobjectmeta.SetObjectMeta(want, meta))
			require.Equal(t, want["metadata"], got, fmt.Sprintf("metadata %#v", md))
		}
	}
	t.Logf("%d of 20000 taken without the round trip", plainCount)
	require.Greater(t, plainCount, 2000)
	require.Less(t, plainCount, 18000)
	_, ok := plainMeta(map[string]any{})
	require.False(t, ok, "no metadata")
	_, ok = plainMeta(map[string]any{"metadata": nil})
	require.False(t, ok, "null metadata")
}
