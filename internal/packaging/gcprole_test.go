package packaging_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/nstance-dev/nstance/internal/server/provider/gcp"
)

// gcpRole is the YAML of `gcloud iam roles create --file` (the Role
// resource of the IAM API: title at most 100 characters, description at
// most 256, a launch stage, permissions service.resource.verb).
type gcpRole struct {
	Title               string   `json:"title"`
	Description         string   `json:"description"`
	Stage               string   `json:"stage"`
	IncludedPermissions []string `json:"includedPermissions"`
}

var gcpPermissionRE = regexp.MustCompile(`^[a-z]+\.[a-zA-Z]+\.[a-zA-Z]+$`)

// TestGCPServerRole: deploy/gcp/nstance-server-role.yaml is a valid custom
// role whose permissions are exactly what the gcp provider, the alias IP
// leader address and the gcp load balancer kind call (gcp.IAMPermissions,
// whose calls the provider's wire test sees), and the install guide
// creates it.
func TestGCPServerRole(t *testing.T) {
	const rel = "deploy/gcp/nstance-server-role.yaml"
	data, err := os.ReadFile(filepath.Join(root, rel))
	require.NoError(t, err)
	var role gcpRole
	require.NoError(t, yaml.UnmarshalStrict(data, &role), rel)
	require.NotEmpty(t, role.Title)
	require.LessOrEqual(t, len(role.Title), 100)
	require.NotEmpty(t, role.Description)
	require.LessOrEqual(t, len(role.Description), 256)
	require.Contains(t, []string{"ALPHA", "BETA", "GA"}, role.Stage)
	for _, p := range role.IncludedPermissions {
		require.Regexp(t, gcpPermissionRE, p)
	}
	require.True(t, slices.IsSorted(role.IncludedPermissions), "sorted, for review")
	require.Equal(t, gcp.IAMPermissions(), role.IncludedPermissions)

	guide, err := os.ReadFile(filepath.Join(root, "docs/install-gcp.md"))
	require.NoError(t, err)
	require.True(t, strings.Contains(string(guide), "--file=deploy/gcp/nstance-server-role.yaml"), "docs/install-gcp.md creates the role from the file")
}
