package packaging_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/provider/proxmox"
	"github.com/nstance-dev/nstance/internal/testing/hosttools"
)

const proxmoxRoleRel = "deploy/proxmox/nstance-role.sh"

// TestProxmoxRole: the role deploy/proxmox creates grants exactly the
// privileges of the API calls the provider makes (proxmox.Calls, whose
// paths the provider's wire test checks against what it calls), and the
// script is clean POSIX sh.
func TestProxmoxRole(t *testing.T) {
	script := filepath.Join(root, proxmoxRoleRel)
	data, err := os.ReadFile(script)
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^PRIVS="([^"]*)"$`).FindStringSubmatch(string(data))
	require.NotNil(t, m, "%s sets PRIVS=\"...\"", proxmoxRoleRel)
	privs := strings.Split(m[1], ",")
	sorted := append([]string(nil), privs...)
	sort.Strings(sorted)
	require.Equal(t, sorted, privs, "kept sorted")
	require.Equal(t, proxmox.Privileges(), privs)

	out, err := exec.Command(hosttools.Require(t, "shellcheck"), "-s", "sh", "-S", "style", script).CombinedOutput()
	require.NoError(t, err, "shellcheck:\n%s", out)
}
