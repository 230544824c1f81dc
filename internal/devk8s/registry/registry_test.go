package registry

import (
	"testing"

	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

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
	r := New()
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
	require.Equal(t, "things.example.com", res.StorageName())
	_, ok = r.Lookup(schema.GroupVersionResource{Group: "example.com", Version: "v2", Resource: "things"})
	require.False(t, ok, "unserved versions are not served")
	stored, ok := r.ByStorageName("things.example.com")
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
	require.Error(t, New().AddCRD(c))
}
