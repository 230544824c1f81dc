package aws_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/provider/aws"
)

// TestUserDataScriptRuns executes the rendered script with sh, with the
// agent's directories moved under a temporary root and a start command that
// records its environment, and checks what the agent would find.
func TestUserDataScriptRuns(t *testing.T) {
	root := t.TempDir()
	agent := aws.Agent{StateDir: filepath.Join(root, "var/lib/nstance-agent"), EnvFile: filepath.Join(root, "etc/nstance/agent.env"),
		Start: "set -a; . '" + filepath.Join(root, "etc/nstance/agent.env") + "'; env > '" + filepath.Join(root, "started") + "'"}
	req := request("web-1", "web")
	req.CACertPEM = []byte(caPEM + "with 'quotes' and $(not run) `either`\n")
	ud, err := aws.UserData(agent, req, []string{"NSTANCE_METRICS_INTERVAL=5s"})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(ud), "#!/bin/sh\n"), "cloud-init runs #! user data as a script")

	cmd := exec.Command("sh", "-c", string(ud))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))

	identity := filepath.Join(agent.StateDir, "identity")
	nonce, err := os.ReadFile(filepath.Join(identity, "nonce.jwt"))
	require.NoError(t, err)
	require.Equal(t, "nonce-web-1", string(nonce))
	ca, err := os.ReadFile(filepath.Join(identity, "ca.crt"))
	require.NoError(t, err)
	require.Equal(t, req.CACertPEM, ca, "file contents survive the script byte for byte")
	for path, mode := range map[string]os.FileMode{filepath.Join(identity, "nonce.jwt"): 0o600, filepath.Join(identity, "ca.crt"): 0o644, agent.EnvFile: 0o600} {
		fi, err := os.Stat(path)
		require.NoError(t, err)
		require.Equal(t, mode, fi.Mode().Perm(), path)
	}
	env, err := os.ReadFile(agent.EnvFile)
	require.NoError(t, err)
	require.Equal(t, strings.Join([]string{
		"NSTANCE_AGENT_ADDR=10.0.0.5:8994",
		"NSTANCE_IDENTITY_DIR=" + identity,
		"NSTANCE_INSTANCE_ID=web-1",
		"NSTANCE_METRICS_INTERVAL=5s",
		"NSTANCE_PROVIDER_ID=nstance://c1/s1/web-1",
		"NSTANCE_REGISTRATION_ADDR=10.0.0.5:8992",
		"NSTANCE_SHARD=s1", // no NSTANCE_SPOT_NOTICE: the agent detects spot from the metadata
	}, "\n")+"\n", string(env))
	started, err := os.ReadFile(filepath.Join(root, "started"))
	require.NoError(t, err)
	require.Contains(t, string(started), "NSTANCE_INSTANCE_ID=web-1", "the start command ran with the settings")
	_, err = os.Stat(filepath.Join(root, "not run"))
	require.True(t, os.IsNotExist(err))

	// Defaults: the paths an image with the agent's systemd unit expects.
	ud, err = aws.UserData(aws.DefaultOptions().Agent, req, nil)
	require.NoError(t, err)
	require.Contains(t, string(ud), "/var/lib/nstance-agent/identity/nonce.jwt")
	require.Contains(t, string(ud), "/etc/nstance/agent.env")
	require.True(t, strings.HasSuffix(string(ud), "systemctl enable --now nstance-agent.service\n"))
}

func TestUserDataRejects(t *testing.T) {
	agent := aws.DefaultOptions().Agent
	req := request("web-1", "web")
	req.AgentNonce = ""
	_, err := aws.UserData(agent, req, nil)
	require.ErrorContains(t, err, "no agent nonce")

	req = request("web-1", "web")
	_, err = aws.UserData(agent, req, []string{"X=1\nrm -rf /"})
	require.ErrorContains(t, err, "bad agent environment entry")

	req.CACertPEM = []byte(strings.Repeat("x", aws.MaxUserData))
	_, err = aws.UserData(agent, req, nil)
	require.ErrorContains(t, err, "EC2 allows 16384")
}
