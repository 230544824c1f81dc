package packaging_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// TestLicense: the repository is Apache-2.0 (the Kubernetes ecosystem's
// license), and what is shipped says so: the generators' boilerplate heads
// the generated Go files, and both charts carry the license annotation. The
// image label is checked by TestOperatorImageArchive.
func TestLicense(t *testing.T) {
	license, err := os.ReadFile(filepath.Join(root, "LICENSE"))
	require.NoError(t, err)
	require.Contains(t, string(license), "Apache License\n                           Version 2.0, January 2004")
	require.Contains(t, string(license), "END OF TERMS AND CONDITIONS")

	boilerplate, err := os.ReadFile(filepath.Join(root, "scripts", "boilerplate.go.txt"))
	require.NoError(t, err)
	require.Contains(t, string(boilerplate), "Licensed under the Apache License, Version 2.0")
	for _, gen := range []string{"api/v1beta1/zz_generated.deepcopy.go", "api/controlplane/v1beta1/zz_generated.deepcopy.go"} {
		src, err := os.ReadFile(filepath.Join(root, gen))
		require.NoError(t, err)
		require.Contains(t, string(src), strings.TrimSpace(string(boilerplate)),
			"%s does not carry scripts/boilerplate.go.txt: run make generate", gen)
	}

	// protoc-gen-go copies the .proto files' leading comment, the same header.
	pbs, err := filepath.Glob(filepath.Join(root, "pkg", "proto", "nstance", "v1", "*.pb.go"))
	require.NoError(t, err)
	require.NotEmpty(t, pbs)
	for _, pb := range pbs {
		src, err := os.ReadFile(pb)
		require.NoError(t, err)
		require.Contains(t, string(src), "// Licensed under the Apache License, Version 2.0", "%s lacks the license header: run make generate", pb)
	}

	for _, chart := range []string{"nstance-operator", "nstance-server"} {
		raw, err := os.ReadFile(filepath.Join(root, "deploy", "helm", chart, "Chart.yaml"))
		require.NoError(t, err)
		var meta struct {
			Annotations map[string]string `json:"annotations"`
		}
		require.NoError(t, yaml.Unmarshal(raw, &meta))
		require.Equal(t, "Apache-2.0", meta.Annotations["artifacthub.io/license"], "chart %s", chart)
	}
}
