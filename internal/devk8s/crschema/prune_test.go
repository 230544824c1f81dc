package crschema

import (
	"math/rand"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestPruneCheckMatchesLibrary compares pruneNode.prunes with what
// apiextensions' pruning does to random objects of every project CRD
// version, and to the same objects under schemas with
// x-kubernetes-preserve-unknown-fields and embedded resources added.
func TestPruneCheckMatchesLibrary(t *testing.T) {
	files := projectCRDFiles(t)
	r := rand.New(rand.NewSource(1))
	total, pruned := 0, 0
	for _, file := range files {
		crd := projectCRD(t, file)
		for _, cv := range crd.Spec.Versions {
			schema := internalSchema(t, crd, cv.Name)
			_, openAPI, err := apiservervalidation.NewSchemaValidator(schema)
			require.NoError(t, err)
			s, err := structuralschema.NewStructural(schema)
			require.NoError(t, err)
			schemas := []*structuralschema.Structural{s, nil, mutateSchema(r, s), mutateSchema(r, s), mutateSchema(r, s)}
			for _, sch := range schemas {
				root := newPruneRoot(sch)
				for i := 0; i < 300; i++ {
					obj, _ := randomValue(r, openAPI, 0, r.Intn(2) == 0).(map[string]any)
					if obj == nil {
						obj = map[string]any{}
					}
					if r.Intn(2) == 0 {
						obj["apiVersion"], obj["kind"] = "v", "K"
					}
					if r.Intn(2) == 0 {
						obj["metadata"] = map[string]any{"name": "m", "odd": map[string]any{"x": "y"}}
					}
					lib := runtime.DeepCopyJSON(obj)
					paths := structuralpruning.PruneWithOptions(lib, sch, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
					changed := !reflect.DeepEqual(lib, obj)
					require.Equal(t, changed, len(paths) > 0 || changed, "unknown paths without a change")
					require.Equal(t, changed, root.prunes(obj), "%v: pruning gives %v (%v)", obj, lib, paths)
					total++
					if changed {
						pruned++
					}
				}
			}
		}
	}
	t.Logf("%d objects, %d pruned", total, pruned)
	require.Greater(t, pruned, total/10)
	require.Less(t, pruned, total-total/10)
}

// mutateSchema returns a copy of s with x-kubernetes-preserve-unknown-fields,
// x-kubernetes-embedded-resource and additionalProperties switched on or
// off at random nodes.
func mutateSchema(r *rand.Rand, s *structuralschema.Structural) *structuralschema.Structural {
	out := s.DeepCopy()
	var walk func(n *structuralschema.Structural)
	walk = func(n *structuralschema.Structural) {
		switch r.Intn(8) {
		case 0:
			n.XPreserveUnknownFields = !n.XPreserveUnknownFields
		case 1:
			n.XEmbeddedResource = !n.XEmbeddedResource
		case 2:
			if n.AdditionalProperties == nil {
				n.AdditionalProperties = &structuralschema.StructuralOrBool{Bool: true}
			} else {
				n.AdditionalProperties = nil
			}
		}
		if n.Items != nil {
			walk(n.Items)
		}
		if n.AdditionalProperties != nil && n.AdditionalProperties.Structural != nil {
			walk(n.AdditionalProperties.Structural)
		}
		for name := range n.Properties {
			p := n.Properties[name]
			walk(&p)
			n.Properties[name] = p
		}
	}
	walk(out)
	return out
}
