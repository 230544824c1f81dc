package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

// TestExamplesPassSchemas creates every custom resource in examples/dev-k8s
// on dev-k8s, which validates them against their CRDs as a cluster does:
// the examples the dev stack and test/e2e use must stay valid.
func TestExamplesPassSchemas(t *testing.T) {
	root, err := kubetest.RepoRoot()
	require.NoError(t, err)
	capi, err := kubetest.CAPICRDDir(root)
	require.NoError(t, err)
	d := startDev(t, false, capi, filepath.Join(root, "config", "crd", "bases"))
	dc, err := dynamic.NewForConfig(d.config)
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(root, "examples", "dev-k8s", "*.json"))
	require.NoError(t, err)
	checked := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		var obj unstructured.Unstructured
		require.NoError(t, json.Unmarshal(data, &obj.Object), f)
		gvk := obj.GroupVersionKind()
		if gvk.Group == "" {
			continue // built-in kinds
		}
		plural := strings.ToLower(gvk.Kind) + "s"
		gvr := schema.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: plural}
		ns := obj.GetNamespace()
		if ns == "" {
			ns = "default"
		}
		_, err = dc.Resource(gvr).Namespace(ns).Create(context.Background(), &obj, metav1.CreateOptions{})
		require.NoError(t, err, "%s", f)
		checked++
	}
	require.Positive(t, checked)
}
