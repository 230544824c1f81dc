package crschema

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"k8s.io/kube-openapi/pkg/validation/validate"
	"sigs.k8s.io/yaml"

	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

// randomValue makes a JSON value for schema s that is often valid and
// often not: wrong types, nulls, values outside enums, lengths and
// bounds, unknown keys, missing required properties.
func randomValue(r *rand.Rand, s *spec.Schema, depth int, bad bool) any {
	if bad {
		switch r.Intn(12) {
		case 0:
			return nil
		case 1:
			wrong := []any{"x", int64(3), 2.5, true, []any{"a"}, map[string]any{"k": "v"}}
			return wrong[r.Intn(len(wrong))]
		}
	}
	if len(s.Enum) > 0 && (!bad || r.Intn(3) > 0) {
		return runtime.DeepCopyJSONValue(s.Enum[r.Intn(len(s.Enum))])
	}
	typ := ""
	if len(s.Type) > 0 {
		typ = s.Type[0]
	}
	if typ == "" && len(s.Properties) > 0 {
		typ = "object"
	}
	switch typ {
	case "object":
		obj := map[string]any{}
		if depth > 6 {
			return obj
		}
		required := map[string]bool{}
		for _, name := range s.Required {
			required[name] = true
		}
		for name, p := range s.Properties {
			if r.Intn(4) > 0 || (!bad && required[name]) {
				obj[name] = randomValue(r, &p, depth+1, bad)
			}
		}
		if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
			for i := r.Intn(3); i > 0; i-- {
				obj[fmt.Sprintf("key%d", r.Intn(5))] = randomValue(r, s.AdditionalProperties.Schema, depth+1, bad)
			}
		}
		if bad && r.Intn(4) == 0 {
			obj["unknownField"] = "u"
		}
		return obj
	case "array":
		n := r.Intn(4)
		arr := make([]any, 0, n)
		for i := 0; i < n; i++ {
			if s.Items != nil && s.Items.Schema != nil {
				arr = append(arr, randomValue(r, s.Items.Schema, depth+1, bad))
			} else {
				arr = append(arr, "item")
			}
		}
		if bad && n > 0 && r.Intn(5) == 0 {
			arr = append(arr, arr[0]) // duplicates for uniqueItems
		}
		return arr
	case "string":
		if !bad {
			if s.Format == "date-time" {
				return "2026-01-01T00:00:00Z"
			}
			return []string{"a", "workers", "dev-1"}[r.Intn(3)]
		}
		strs := []string{"", "a", "workers", "dev-1", "Bad_Name", strings.Repeat("x", 300), "t3.small", "10.0.0.0/16", "2026-01-01T00:00:00Z", "1Gi"}
		return strs[r.Intn(len(strs))]
	case "integer":
		if !bad {
			return int64(1 + r.Intn(3))
		}
		ints := []int64{0, 1, -1, 3, 65536, 1 << 40}
		return ints[r.Intn(len(ints))]
	case "number":
		return []float64{0, -1.5, 3.25, 1e20}[r.Intn(4)]
	case "boolean":
		return r.Intn(2) == 0
	}
	return "any"
}

// resultStrings are a result's errors and warnings in a stable order.
func resultStrings(res *validate.Result) []string {
	var out []string
	for _, e := range res.Errors {
		out = append(out, "error: "+e.Error())
	}
	for _, e := range res.Warnings {
		out = append(out, "warning: "+e.Error())
	}
	sort.Strings(out)
	return out
}

// TestSchemaValidatorMatchesLibrary compares the cached validator with
// apiextensions' own on random objects for every version of every
// project CRD, from several goroutines at once (run with -race).
func TestSchemaValidatorMatchesLibrary(t *testing.T) {
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, file := range projectCRDFiles(t) {
		crds = append(crds, projectCRD(t, file))
	}
	total, invalid, fast := compareWithLibrary(t, crds, 150)
	t.Logf("%d of %d objects invalid, %d valid ones answered by the fast path", invalid, total, fast)
	// Most valid objects must take the fast path, or it is not tested.
	require.Greater(t, fast, (total-invalid)*3/4)
	// The objects must exercise both outcomes.
	require.Greater(t, invalid, total/10)
	require.Less(t, invalid, total-total/10)
}

// TestSchemaValidatorMatchesLibraryOnCAPICRDs runs the same comparison on
// cluster-api's core CRDs (from the sigs.k8s.io/cluster-api module), whose
// schemas use more of OpenAPI than the project's (int-or-string, formats,
// deep nesting): dev-k8s serves them in the dev stack.
func TestSchemaValidatorMatchesLibraryOnCAPICRDs(t *testing.T) {
	root, err := kubetest.RepoRoot()
	require.NoError(t, err)
	dir, err := kubetest.CAPICRDDir(root)
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, file := range files {
		data, err := os.ReadFile(file)
		require.NoError(t, err)
		var crd apiextensionsv1.CustomResourceDefinition
		require.NoError(t, yaml.Unmarshal(data, &crd), file)
		crds = append(crds, &crd)
	}
	total, invalid, fast := compareWithLibrary(t, crds, 40)
	t.Logf("%d CRDs: %d of %d objects invalid, %d valid ones answered by the fast path", len(crds), invalid, total, fast)
	require.Greater(t, fast, 0)
	require.Greater(t, invalid, total/10)
	require.Less(t, invalid, total-total/10)
}

// compareWithLibrary compares the cached validator (fast path included)
// with apiextensions' own on random objects for every version of every CRD
// given (main and status schemas), perGoroutine objects from each of 4
// goroutines per schema. It returns how many objects were compared, how
// many of them were invalid and how many the fast path answered.
func compareWithLibrary(t *testing.T, crds []*apiextensionsv1.CustomResourceDefinition, perGoroutine int) (total, invalid, fast int) {
	t.Helper()
	seed := int64(0)
	for _, crd := range crds {
		for _, v := range crd.Spec.Versions {
			schema := internalSchema(t, crd, v.Name)
			for _, props := range []*apiextensionsinternal.JSONSchemaProps{schema, statusProps(schema)} {
				if props == nil {
					continue
				}
				lib, openAPI, err := apiservervalidation.NewSchemaValidator(props)
				require.NoError(t, err)
				cached := newSchemaValidator(lib, openAPI)
				require.IsType(t, &schemaValidator{}, cached)
				var wg sync.WaitGroup
				var mu sync.Mutex
				for g := 0; g < 4; g++ {
					wg.Add(1)
					go func(seed int64) {
						defer wg.Done()
						r := rand.New(rand.NewSource(seed))
						for i := 0; i < perGoroutine; i++ {
							obj := randomValue(r, openAPI, 0, r.Intn(2) == 0)
							old := randomValue(r, openAPI, 0, r.Intn(2) == 0)
							if r.Intn(3) == 0 {
								old = runtime.DeepCopyJSONValue(obj)
							}
							want, got := lib.Validate(obj), cached.Validate(obj)
							wantUp := lib.ValidateUpdate(obj, old, apiservervalidation.WithRatcheting(nil))
							gotUp := cached.ValidateUpdate(obj, old, apiservervalidation.WithRatcheting(nil))
							wantPlain, gotPlain := lib.ValidateUpdate(obj, old), cached.ValidateUpdate(obj, old)
							// The fast path answers for valid objects only,
							// with the library's MatchCount.
							count, ok := cached.(*schemaValidator).fast.check(obj)
							if ok && (!want.IsValid() || count != want.MatchCount) {
								t.Errorf("%s fast path accepted %v with count %d; library: %v (%d)", crd.Name, obj, count, resultStrings(want), want.MatchCount)
								return
							}
							mu.Lock()
							total++
							if !want.IsValid() {
								invalid++
							}
							if ok {
								fast++
							}
							mu.Unlock()
							if !assertSame(t, want, got, "Validate", crd.Name, obj) ||
								!assertSame(t, wantPlain, gotPlain, "ValidateUpdate", crd.Name, obj) {
								return
							}
							// Ratcheting warnings are not compared: no caller reads them.
							if wantUp.IsValid() != gotUp.IsValid() || fmt.Sprint(resultErrors(wantUp)) != fmt.Sprint(resultErrors(gotUp)) {
								t.Errorf("%s ValidateUpdate with ratcheting differs for %v -> %v:\nlibrary: %v\ncached: %v", crd.Name, old, obj, resultErrors(wantUp), resultErrors(gotUp))
								return
							}
						}
					}(seed)
					seed++
				}
				wg.Wait()
			}
		}
	}
	return total, invalid, fast
}

func resultErrors(res *validate.Result) []string {
	var out []string
	for _, e := range res.Errors {
		out = append(out, e.Error())
	}
	sort.Strings(out)
	return out
}

func assertSame(t *testing.T, want, got *validate.Result, what, crd string, obj any) bool {
	t.Helper()
	if want.IsValid() != got.IsValid() || fmt.Sprint(resultStrings(want)) != fmt.Sprint(resultStrings(got)) || want.MatchCount != got.MatchCount {
		t.Errorf("%s %s differs for %v:\nlibrary: %v (%d)\ncached: %v (%d)", crd, what, obj, resultStrings(want), want.MatchCount, resultStrings(got), got.MatchCount)
		return false
	}
	return true
}

func statusProps(p *apiextensionsinternal.JSONSchemaProps) *apiextensionsinternal.JSONSchemaProps {
	if p == nil {
		return nil
	}
	if st, ok := p.Properties["status"]; ok {
		return &st
	}
	return nil
}
