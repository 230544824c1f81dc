package crschema

import (
	"context"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	structurallisttype "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// randomMeta is object metadata, with bad often invalid.
func randomMeta(r *rand.Rand, bad bool) map[string]any {
	md := map[string]any{"name": "m", "namespace": "default"}
	if r.Intn(3) == 0 {
		md["labels"] = map[string]any{"app": "v", "example.com/x": "y"}
	}
	if !bad {
		return md
	}
	switch r.Intn(5) {
	case 0:
		md["name"] = "Bad_Name"
	case 1:
		delete(md, "name")
		md["generateName"] = []string{"gen-", "Bad_"}[r.Intn(2)]
	case 2:
		md["name"] = strings.Repeat("n", 254)
	}
	if r.Intn(6) == 0 {
		md["namespace"] = []string{"", "Bad_NS"}[r.Intn(2)]
	}
	if r.Intn(3) == 0 {
		md["labels"] = map[string]any{[]string{"app", "bad key", "x/y"}[r.Intn(3)]: []string{"v", "bad value!", strings.Repeat("v", 64)}[r.Intn(3)]}
	}
	if r.Intn(4) == 0 {
		md["annotations"] = map[string]any{[]string{"a", "bad key", "example.com/a"}[r.Intn(3)]: "v"}
	}
	if r.Intn(5) == 0 {
		md["finalizers"] = []any{[]string{"example.com/f", "bad finalizer!"}[r.Intn(2)]}
	}
	if r.Intn(8) == 0 {
		md["generation"] = int64(-1)
	}
	return md
}

func errorStrings(errs field.ErrorList) []string {
	out := make([]string, 0, len(errs))
	for _, e := range errs {
		out = append(out, fmt.Sprintf("%s|%s|%#v|%s|%s", e.Type, e.Field, e.BadValue, e.Detail, e.Error()))
	}
	sort.Strings(out)
	return out
}

// TestCreateValidationMatchesStrategy compares the create validation
// without the embedded-resource walk with the customresource strategy's
// Validate on random objects of every version of every project CRD.
func TestCreateValidationMatchesStrategy(t *testing.T) {
	files := projectCRDFiles(t)
	static, err := NewStatic()
	require.NoError(t, err)
	ctx := context.Background()
	r := rand.New(rand.NewSource(1))
	versions, total, invalid, blocked, celErrors, dropped := 0, 0, 0, 0, 0, 0
	for _, file := range files {
		crd := projectCRD(t, file)
		k, err := New(crd, static)
		require.NoError(t, err)
		for _, cv := range crd.Spec.Versions {
			v := k.Version(cv.Name)
			if v == nil {
				continue
			}
			require.NotNil(t, v.create, "%s %s has no embedded resources", crd.Name, cv.Name)
			versions++
			if v.create.hasCEL && v.create.structural != withoutTransitionRules(v.create.structural) {
				dropped++
			}
			schema := internalSchema(t, crd, cv.Name)
			_, openAPI, err := apiservervalidation.NewSchemaValidator(schema)
			require.NoError(t, err)
			for i := 0; i < 600; i++ {
				obj, _ := randomValue(r, openAPI, 0, r.Intn(3) == 0).(map[string]any)
				if obj == nil {
					obj = map[string]any{}
				}
				obj["apiVersion"] = crd.Spec.Group + "/" + cv.Name
				obj["kind"] = crd.Spec.Names.Kind
				switch r.Intn(20) {
				case 0:
					obj["kind"] = "Other"
				case 1:
					obj["apiVersion"] = crd.Spec.Group + "/v0"
				}
				obj["metadata"] = randomMeta(r, r.Intn(3) == 0)
				want := v.main.Validate(ctx, &unstructured.Unstructured{Object: runtime.DeepCopyJSON(obj)})
				got := v.create.validate(ctx, &unstructured.Unstructured{Object: runtime.DeepCopyJSON(obj)})
				total++
				if len(want) > 0 {
					invalid++
				}
				if blockingError(want) != nil {
					blocked++
				} else if len(want) > len(v.create.meta.Validate(ctx, &unstructured.Unstructured{Object: obj}))+
					len(structurallisttype.ValidateListSetsAndMaps(nil, v.create.structural, obj)) {
					celErrors++
				}
				if !assertSameErrors(t, want, got, crd.Name, obj) {
					return
				}
			}
		}
	}
	t.Logf("%d versions (%d with transition rules left out), %d objects, %d invalid, %d with CEL rules not run, %d with CEL errors", versions, dropped, total, invalid, blocked, celErrors)
	require.Positive(t, dropped)
	require.Positive(t, celErrors)
	require.Greater(t, invalid, total/10)
	require.Less(t, invalid, total-total/10)
	require.Greater(t, total-blocked, total/4)
}

func assertSameErrors(t *testing.T, want, got field.ErrorList, crd string, obj any) bool {
	t.Helper()
	if fmt.Sprint(errorStrings(want)) != fmt.Sprint(errorStrings(got)) {
		t.Errorf("%s create validation differs for %v:\nstrategy: %v\nours: %v", crd, obj, errorStrings(want), errorStrings(got))
		return false
	}
	return true
}
