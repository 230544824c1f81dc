package crschema

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

func projectCRD(t *testing.T, file string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "crd", "bases", file))
	require.NoError(t, err)
	var crd apiextensionsv1.CustomResourceDefinition
	require.NoError(t, yaml.Unmarshal(data, &crd))
	return &crd
}

// projectCRDFiles lists the project's CRD manifests (base names).
func projectCRDFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "..", "config", "crd", "bases", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for i := range files {
		files[i] = filepath.Base(files[i])
	}
	return files
}

// internalSchema is a version's validation schema as apiextensions'
// internal type, as the libraries take it.
func internalSchema(t *testing.T, crd *apiextensionsv1.CustomResourceDefinition, version string) *apiextensionsinternal.JSONSchemaProps {
	t.Helper()
	val, err := apihelpers.GetSchemaForVersion(crd, version)
	require.NoError(t, err)
	iv := &apiextensionsinternal.CustomResourceValidation{}
	require.NoError(t, apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(val, iv, nil))
	return iv.OpenAPIV3Schema
}

func TestProjectCRDs(t *testing.T) {
	static, err := NewStatic()
	require.NoError(t, err)
	k, err := New(projectCRD(t, "infrastructure.cluster.x-k8s.io_nstancemachines.yaml"), static)
	require.NoError(t, err)
	v := k.Version("v1beta1")
	require.NotNil(t, v)
	ctx := context.Background()

	obj := map[string]any{
		"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "NstanceMachine",
		"metadata": map[string]any{"name": "m", "namespace": "default", "uid": "u", "resourceVersion": "1", "creationTimestamp": "2026-01-01T00:00:00Z"},
		"spec":     map[string]any{"group": "workers", "shard": "dev-1", "bogus": true},
	}
	unknown, err := v.Decode(obj, true)
	require.NoError(t, err)
	require.Equal(t, []string{"spec.bogus"}, unknown)
	require.Empty(t, v.BeforeCreate(ctx, obj))
	require.EqualValues(t, 1, obj["metadata"].(map[string]any)["generation"])

	next := map[string]any{
		"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": obj["metadata"],
		"spec": map[string]any{"group": "workers", "shard": "dev-2"},
	}
	errs := v.BeforeUpdate(ctx, "", next, obj)
	require.Len(t, errs, 1)
	require.Equal(t, "spec", errs[0].Field)
	require.Contains(t, errs[0].Detail, "shard is immutable once set")

	bad := map[string]any{"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": map[string]any{"name": "m", "namespace": "default"},
		"spec": map[string]any{"group": "Bad_Group"}}
	_, err = v.Decode(bad, false)
	require.NoError(t, err)
	errs = v.BeforeCreate(ctx, bad)
	require.NotEmpty(t, errs)
	require.Equal(t, "spec.group", errs[0].Field)
}
