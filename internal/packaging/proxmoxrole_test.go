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

// TestProxmoxGuideNamesTheRolesPrivileges: the privileges table of
// docs/install-proxmox.md names exactly the privileges of proxmox.Calls,
// so the guide cannot promise a narrower (or wider) role than the script
// creates.
func TestProxmoxGuideNamesTheRolesPrivileges(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "docs/install-proxmox.md"))
	require.NoError(t, err)
	guide := string(data)
	start := strings.Index(guide, "| call | privileges |")
	require.NotEqual(t, -1, start, "the guide has the privileges table")
	table, _, _ := strings.Cut(guide[start:], "\n\n")
	set := map[string]bool{}
	for _, m := range regexp.MustCompile("`((?:VM|Sys|Datastore|SDN|Pool)\\.[A-Za-z.]+)`").FindAllStringSubmatch(table, -1) {
		set[m[1]] = true
	}
	named := make([]string, 0, len(set))
	for p := range set {
		named = append(named, p)
	}
	sort.Strings(named)
	require.Equal(t, proxmox.Privileges(), named)
	require.Len(t, regexp.MustCompile(`(?m)^\| `+"`"+`(GET|POST|DELETE) `).FindAllString(table, -1), len(proxmox.Calls)-1,
		"a row a call (start and stop share one)")
}
