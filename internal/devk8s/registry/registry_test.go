package registry

import (
	"testing"

	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// builtins is a small table of built-in kinds for these tests (the real
// one is strategy.Resources, which imports this package).
func builtins() []Resource {
	return []Resource{
		{Version: "v1", Resource: "nodes", Kind: "Node", BuiltIn: true, Storage: true},
		{Version: "v1", Resource: "secrets", Kind: "Secret", Namespaced: true, BuiltIn: true, Storage: true},
		{Version: "v1", Resource: "events", Kind: "Event", Namespaced: true, BuiltIn: true, Storage: true},
		{Group: "coordination.k8s.io", Version: "v1", Resource: "leases", Kind: "Lease", Namespaced: true, BuiltIn: true, Storage: true},
		{Group: "policy", Version: "v1", Resource: "poddisruptionbudgets", Kind: "PodDisruptionBudget", Namespaced: true, BuiltIn: true, Storage: true},
	}
}

func crd(versions ...apiextensionsv1.CustomResourceDefinitionVersion) *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "things.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.com", Scope: apiextensionsv1.NamespaceScoped,
			Names:    apiextensionsv1.CustomResourceDefinitionNames{Plural: "things", Kind: "Thing"},
			Versions: versions,
		},
	}
}

func TestVersionOrder(t *testing.T) {
	cases := []struct {
		in, want []string
	}{
		{in: []string{"v1alpha1", "v1", "v1beta1"}, want: []string{"v1", "v1beta1", "v1alpha1"}},
		{in: []string{"v1beta1", "v1beta2", "v2"}, want: []string{"v2", "v1beta2", "v1beta1"}},
		{in: []string{"foo", "v1"}, want: []string{"v1", "foo"}},
	}
	for _, tc := range cases {
		got := append([]string(nil), tc.in...)
		sortVersions(got)
		require.Equal(t, tc.want, got)
	}
}

func TestCRDLifecycle(t *testing.T) {
	r := New(builtins()...)
	require.NoError(t, r.AddCRD(crd(
		apiextensionsv1.CustomResourceDefinitionVersion{Name: "v1beta1", Served: true},
		apiextensionsv1.CustomResourceDefinitionVersion{Name: "v1", Served: true, Storage: true,
			Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}}},
		apiextensionsv1.CustomResourceDefinitionVersion{Name: "v2", Served: false},
	)))
	res, ok := r.Lookup(schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "things"})
	require.True(t, ok)
	require.True(t, res.Status)
	require.True(t, res.Namespaced)
	require.Equal(t, "ThingList", res.ListKind)
	require.Equal(t, "things", res.StorageName(), "a plural no core resource uses is stored under its own name")
	_, ok = r.Lookup(schema.GroupVersionResource{Group: "example.com", Version: "v2", Resource: "things"})
	require.False(t, ok, "unserved versions are not served")
	stored, ok := r.ByStorageName("things")
	require.True(t, ok)
	require.Equal(t, "v1", stored.Version)
	require.False(t, r.BuiltInGroup("example.com"))
	require.True(t, r.BuiltInGroup("policy"))
	for _, g := range r.Groups() {
		if g.Group == "example.com" {
			require.Equal(t, []string{"v1", "v1beta1"}, g.Versions)
		}
	}
	r.RemoveCRD("things.example.com")
	_, ok = r.Lookup(schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "things"})
	require.False(t, ok)
}

func TestInvalidCRD(t *testing.T) {
	c := crd()
	c.Spec.Names.Plural = ""
	require.Error(t, New(builtins()...).AddCRD(c))
}

func TestStorageDirs(t *testing.T) {
	r := New(builtins()...)
	cases := []struct {
		group, resource, want string
	}{
		{"", "nodes", "nodes"},
		{"", "secrets", "secrets"},
		{"coordination.k8s.io", "leases", "leases"},
		{"infrastructure.cluster.x-k8s.io", "nstancemachinepools", "nstancemachinepools"},
		{"cluster.x-k8s.io", "machinepools", "machinepools"},
		{"events.k8s.io", "events", "events.events.k8s.io"},
	}
	for _, tc := range cases {
		t.Run(tc.group+"/"+tc.resource, func(t *testing.T) {
			require.Equal(t, tc.want, r.StorageDir(tc.group, tc.resource))
		})
	}

	// A CRD whose plural another group already stores is refused, not mixed
	// into the same directory.
	require.NoError(t, r.AddCRD(crd(apiextensionsv1.CustomResourceDefinitionVersion{Name: "v1", Served: true, Storage: true})))
	other := crd(apiextensionsv1.CustomResourceDefinitionVersion{Name: "v1", Served: true, Storage: true})
	other.Name, other.Spec.Group = "things.other.example.com", "other.example.com"
	err := r.AddCRD(other)
	require.ErrorContains(t, err, `plural "things" is already served by group "example.com"`)
}
