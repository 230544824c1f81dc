package cloudinit_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/cloudinit"
)

// The EC2 limits are tested through the aws wrappers; here what differs
// per platform: without a limit nothing is compressed, and errors name
// the platform.
func TestComposePerPlatform(t *testing.T) {
	req := provider.CreateRequest{InstanceID: "web-1", GroupID: "web", AgentNonce: "n", UserData: []byte("#cloud-config\n" + strings.Repeat("# padding\n", 4000))}
	script, err := cloudinit.AgentScript(cloudinit.DefaultAgent(), req, nil)
	require.NoError(t, err)
	ud, err := cloudinit.Compose(script, req, cloudinit.Platform{Name: "Proxmox VE"})
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(ud, []byte("Content-Type: multipart/mixed")), "40 KB stay uncompressed without a limit")
	require.Contains(t, string(ud), "00-nstance-agent")

	_, err = cloudinit.Compose(script, req, cloudinit.Platform{Name: "Tiny", MaxBytes: 64})
	require.ErrorContains(t, err, "group web: the bootstrap data")
	require.ErrorContains(t, err, "Tiny allows 64")

	req.UserDataFormat = "ignition"
	_, err = cloudinit.Compose(script, req, cloudinit.Platform{Name: "Proxmox VE"})
	require.ErrorContains(t, err, "on Proxmox VE")

	require.Empty(t, cloudinit.DefaultAgent().Validate())
	require.Equal(t, map[string]string{"state_dir": `want an absolute path without quotes or newlines, got "x'y"`, "start": "must not be empty"},
		cloudinit.Agent{StateDir: "x'y", EnvFile: "/etc/a.env"}.Validate())
}
