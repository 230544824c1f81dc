package packaging_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/testing/hosttools"
)

const (
	unitRel     = "deploy/aws/systemd/nstance-server.service"
	userDataRel = "deploy/aws/user-data/nstance-server.sh"
)

// unitSettings parses a systemd unit file: section -> key -> values in
// order (a key may repeat). Continuation lines are not used by our units
// and are rejected.
func unitSettings(t *testing.T, text string) map[string]map[string][]string {
	t.Helper()
	out := map[string]map[string][]string{}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		require.False(t, strings.HasSuffix(line, `\`), "line %d: continuation lines are not used", n)
		if strings.HasPrefix(line, "[") {
			require.True(t, strings.HasSuffix(line, "]"), "line %d: %q", n, line)
			section = strings.Trim(line, "[]")
			require.NotContains(t, out, section, "section %s twice", section)
			out[section] = map[string][]string{}
			continue
		}
		require.NotEmpty(t, section, "line %d outside a section", n)
		k, v, ok := strings.Cut(line, "=")
		require.True(t, ok, "line %d: %q is not key=value", n, line)
		out[section][k] = append(out[section][k], v)
	}
	require.NoError(t, sc.Err())
	return out
}

// TestSystemdUnit checks the unit by its content and with systemd's own
// tools: `systemd-analyze verify` (syntax, known keys, values) and
// `systemd-analyze security` (exposure score).
func TestSystemdUnit(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, unitRel))
	require.NoError(t, err)
	u := unitSettings(t, string(data))
	require.Equal(t, []string{"multi-user.target"}, u["Install"]["WantedBy"])
	svc := u["Service"]
	for k, want := range map[string]string{
		"ExecStart":       "/usr/local/bin/nstance-server",
		"EnvironmentFile": "/etc/nstance/server.env",
		"Restart":         "always",
		"DynamicUser":     "yes",
		"ProtectSystem":   "strict",
		"StateDirectory":  "nstance-server",
		"CacheDirectory":  "nstance-server",
		"NoNewPrivileges": "yes",
		"PrivateTmp":      "yes",
		"ProtectHome":     "yes",
		"KillSignal":      "SIGTERM",
	} {
		require.Equal(t, []string{want}, svc[k], "[Service] %s", k)
	}
	require.Equal(t, []string{""}, svc["CapabilityBoundingSet"], "no capabilities")
	require.Contains(t, svc["Environment"][0], "NSTANCE_CACHE_DIR=%C/nstance-server", "the SQLite cache lives in the cache directory")

	// systemd-analyze needs ExecStart to exist: point it at a stand-in.
	dir := t.TempDir()
	stand := filepath.Join(dir, "nstance-server")
	require.NoError(t, os.WriteFile(stand, []byte("#!/bin/sh\n"), 0o755))
	unit := filepath.Join(dir, "nstance-server.service")
	require.NoError(t, os.WriteFile(unit, []byte(strings.ReplaceAll(string(data), "/usr/local/bin/nstance-server", stand)), 0o644))
	analyze := hosttools.Require(t, "systemd-analyze")
	out, err := exec.Command(analyze, "verify", unit).CombinedOutput()
	require.NoError(t, err, "systemd-analyze verify:\n%s", out)
	require.Empty(t, strings.TrimSpace(string(out)), "systemd-analyze verify complains")
	// Exposure 2.0 or lower ("OK" is below 3.0 on systemd's 0-10 scale).
	out, err = exec.Command(analyze, "security", "--offline=true", "--threshold=20", unit).CombinedOutput()
	require.NoError(t, err, "systemd-analyze security: exposure above 2.0:\n%s", out)
	t.Logf("systemd-analyze security: %s", strings.TrimSpace(string(out[strings.LastIndex(string(out), "→"):])))

	// A typo is caught by the same check (the test can fail).
	bad := filepath.Join(dir, "bad.service")
	require.NoError(t, os.WriteFile(bad, []byte(strings.Replace(string(data), "ProtectSystem=strict", "ProtectSytem=strict", 1)), 0o644))
	out, _ = exec.Command(analyze, "verify", bad).CombinedOutput()
	require.Contains(t, string(out), "ProtectSytem")
}

// userDataBody is the script without its first (#!) line: what the
// CloudFormation template embeds after its settings.
func userDataBody(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, userDataRel))
	require.NoError(t, err)
	first, body, ok := strings.Cut(string(data), "\n")
	require.True(t, ok)
	require.Equal(t, "#!/bin/bash", first)
	return body
}

func TestUserDataScriptStatic(t *testing.T) {
	script := filepath.Join(root, userDataRel)
	body := userDataBody(t)
	out, err := exec.Command(hosttools.Require(t, "bash"), "-n", script).CombinedOutput()
	require.NoError(t, err, "bash -n:\n%s", out)
	out, err = exec.Command(hosttools.Require(t, "shellcheck"), "-s", "bash", "-S", "style", script).CombinedOutput()
	require.NoError(t, err, "shellcheck:\n%s", out)
	require.NotContains(t, body, "${", "Fn::Sub would take ${...} for a reference")
	require.Less(t, len(body)+2048, 16384, "user data is limited to 16 KiB (with the settings the template adds)")

	// It writes the unit from deploy/aws/systemd verbatim.
	unit, err := os.ReadFile(filepath.Join(root, unitRel))
	require.NoError(t, err)
	_, rest, ok := strings.Cut(body, "<<'UNIT'\n")
	require.True(t, ok)
	embedded, _, ok := strings.Cut(rest, "\nUNIT\n")
	require.True(t, ok)
	require.Equal(t, strings.TrimSuffix(string(unit), "\n"), embedded, "the unit in the user data differs from %s", unitRel)
}

// TestUserDataScriptRuns runs the script against a stand-in root directory
// with fake curl (instance metadata and the download), systemctl and aws
// commands: it must install the checked binary, write the environment file
// and the unit, start the service, and refuse a binary whose checksum does
// not match.
func TestUserDataScriptRuns(t *testing.T) {
	bash := hosttools.Require(t, "bash")
	for _, tool := range []string{"sha256sum", "install", "mktemp", "uname"} {
		hosttools.Require(t, tool)
	}
	script := filepath.Join(root, userDataRel)
	binary := []byte("#!/bin/sh\n[ \"$1\" = --version ] && echo 'nstance-server version v9.9.9'\n")
	sum := sha256.Sum256(binary)

	setup := func(t *testing.T) (dir, rootDir string, env []string) {
		dir = t.TempDir()
		rootDir = filepath.Join(dir, "root")
		fakes := filepath.Join(dir, "bin")
		require.NoError(t, os.MkdirAll(fakes, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "release-binary"), binary, 0o755))
		fake := func(name, text string) {
			require.NoError(t, os.WriteFile(filepath.Join(fakes, name), []byte("#!/bin/bash\nset -eu\n"+text), 0o755))
		}
		fake("curl", `out= url=
while [ $# -gt 0 ]; do case $1 in -o) out=$2; shift 2;; -H|-X|--retry) shift 2;; -*) shift;; *) url=$1; shift;; esac; done
echo "curl $url" >> "$FAKE_LOG"
case $url in
*/latest/api/token) echo token-1 ;;
*/latest/meta-data/instance-id) echo i-0123456789abcdef0 ;;
https://releases.example/v9/nstance-server-linux-*) cp "$FAKE_RELEASE" "$out" ;;
*) echo "unexpected URL $url" >&2; exit 22 ;;
esac
`)
		fake("systemctl", `echo "systemctl $*" >> "$FAKE_LOG"`+"\n")
		fake("aws", `echo "aws $*" >> "$FAKE_LOG"; printf 'key-from-secrets-manager'`+"\n")
		env = append(os.Environ(),
			"PATH="+fakes+":"+os.Getenv("PATH"),
			"FAKE_LOG="+filepath.Join(dir, "log"),
			"FAKE_RELEASE="+filepath.Join(dir, "release-binary"),
			"NSTANCE_INSTALL_ROOT="+rootDir,
			"NSTANCE_SHARD=us-west-2a",
			"NSTANCE_STORAGE_BUCKET=example-nstance-state",
			"NSTANCE_STORAGE_PREFIX=nstance/",
			"NSTANCE_LEADER_ENI=eni-0abc",
			"NSTANCE_LEADER_ADDRESS=10.0.1.10",
			"NSTANCE_RELEASE_URL=https://releases.example/v9",
			"NSTANCE_SHA256_AMD64="+hex.EncodeToString(sum[:]),
			"NSTANCE_SHA256_ARM64="+hex.EncodeToString(sum[:]),
			"AWS_REGION=us-west-2",
		)
		return dir, rootDir, env
	}

	t.Run("installs and starts", func(t *testing.T) {
		dir, rootDir, env := setup(t)
		cmd := exec.Command(bash, script)
		cmd.Env = append(slices.Clone(env), "NSTANCE_KEY_SECRET_ID=nstance/prod/encryption-key")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "user data:\n%s", out)
		got, err := os.ReadFile(filepath.Join(rootDir, "usr/local/bin/nstance-server"))
		require.NoError(t, err)
		require.Equal(t, binary, got)
		envFile, err := os.ReadFile(filepath.Join(rootDir, "etc/nstance/server.env"))
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(string(envFile)), "\n")
		for _, want := range []string{
			"NSTANCE_SERVER_ID=i-0123456789abcdef0", "NSTANCE_SHARD=us-west-2a", "NSTANCE_STORAGE=s3",
			"NSTANCE_STORAGE_BUCKET=example-nstance-state", "NSTANCE_STORAGE_PREFIX=nstance/",
			"NSTANCE_ADVERTISE_HOST=10.0.1.10", "NSTANCE_LEADER_ENI=eni-0abc", "AWS_REGION=us-west-2",
		} {
			require.True(t, slices.Contains(lines, want), "server.env lacks %s:\n%s", want, envFile)
		}
		unit, err := os.ReadFile(filepath.Join(rootDir, "etc/systemd/system/nstance-server.service"))
		require.NoError(t, err)
		want, err := os.ReadFile(filepath.Join(root, unitRel))
		require.NoError(t, err)
		require.Equal(t, string(want), string(unit))
		key, err := os.ReadFile(filepath.Join(rootDir, "etc/nstance/credentials/encryption-key"))
		require.NoError(t, err)
		require.Equal(t, "key-from-secrets-manager", string(key))
		st, err := os.Stat(filepath.Join(rootDir, "etc/nstance/credentials/encryption-key"))
		require.NoError(t, err)
		require.EqualValues(t, 0o600, st.Mode().Perm(), "the key file is readable by root only")
		dropIn, err := os.ReadFile(filepath.Join(rootDir, "etc/systemd/system/nstance-server.service.d/encryption-key.conf"))
		require.NoError(t, err)
		require.Contains(t, string(dropIn), "LoadCredential=encryption-key:/etc/nstance/credentials/encryption-key")
		log, err := os.ReadFile(filepath.Join(dir, "log"))
		require.NoError(t, err)
		require.Contains(t, string(log), "aws secretsmanager get-secret-value --region us-west-2 --secret-id nstance/prod/encryption-key")
		require.Contains(t, string(log), "systemctl daemon-reload\nsystemctl enable --now nstance-server.service\n")
	})

	t.Run("refuses a wrong checksum", func(t *testing.T) {
		dir, rootDir, env := setup(t)
		cmd := exec.Command(bash, script)
		cmd.Env = append(slices.Clone(env), "NSTANCE_SHA256_AMD64="+strings.Repeat("0", 64), "NSTANCE_SHA256_ARM64="+strings.Repeat("0", 64))
		out, err := cmd.CombinedOutput()
		require.Error(t, err)
		require.Contains(t, string(out), "want 0000")
		_, err = os.Stat(filepath.Join(rootDir, "usr/local/bin/nstance-server"))
		require.True(t, os.IsNotExist(err), "a binary that failed its check was installed")
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		require.NotContains(t, string(log), "systemctl")
	})

	t.Run("refuses missing settings", func(t *testing.T) {
		_, _, env := setup(t)
		cmd := exec.Command(bash, script)
		cmd.Env = slices.DeleteFunc(env, func(s string) bool { return strings.HasPrefix(s, "NSTANCE_LEADER_ENI=") })
		out, err := cmd.CombinedOutput()
		require.Error(t, err)
		require.Contains(t, string(out), "NSTANCE_LEADER_ENI is not set")
	})
}
