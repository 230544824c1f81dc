// Package cli checks that the six binaries, built from this tree, follow one
// command-line convention (internal/cliconv): a usage error is one line
// naming the problem and the hint "Run '<prog> --help' for usage.", exit
// code 2, never a help dump; a runtime error (a missing file) exit code 1
// and one line naming it; --version prints "<prog> <version> (<commit>,
// <go version>, <os>/<arch>)".
package cli

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/testing/kubetest"
	"github.com/nstance-dev/nstance/internal/version"
)

var binaries = []string{"nstance-server", "nstance-agent", "nstance-operator", "nstance-admin", "dev-k8s", "dev-s3"}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// bin builds the six binaries once per test process (one go build).
func bin(t *testing.T, name string) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := kubetest.RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		binDir, buildErr = os.MkdirTemp("", "nstance-cli-test-")
		if buildErr != nil {
			return
		}
		args := []string{"build", "-o", binDir + string(filepath.Separator)}
		for _, b := range binaries {
			args = append(args, "./cmd/"+b)
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return filepath.Join(binDir, name)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

type result struct {
	code           int
	stdout, stderr string
}

// run runs a binary with only PATH and HOME from this environment, so no
// NSTANCE_* variable of the caller leaks in.
func run(t *testing.T, name string, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(bin(t, name), args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	cmd.Dir = t.TempDir()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

func lines(s string) []string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func TestConvention(t *testing.T) {
	tmp := t.TempDir()
	missing := filepath.Join(tmp, "missing")
	aFile := filepath.Join(tmp, "a-file")
	require.NoError(t, os.WriteFile(aFile, []byte("x"), 0o600))
	agentEnv := []string{"NSTANCE_INSTANCE_ID=i-1", "NSTANCE_IDENTITY_DIR=" + filepath.Join(tmp, "agent", "identity"),
		"NSTANCE_REGISTRATION_ADDR=127.0.0.1:1", "NSTANCE_AGENT_ADDR=127.0.0.1:1", "NSTANCE_LOG_FORMAT=json"}

	// A usage error: exit 2, the problem on the first line of stderr, the
	// hint on the second, nothing else.
	usage := []struct {
		bin, name string
		env       []string
		args      []string
		problem   string // the first line, after "<bin>: "
	}{
		{"nstance-server", "bad flag", nil, []string{"--bogus"}, "flag provided but not defined: -bogus"},
		{"nstance-server", "bad value", nil, []string{"--shard", "s", "--log-level", "loud"}, `log level "loud": want debug, info, warn, error or a verbosity number`},
		{"nstance-server", "missing required flag", nil, []string{"--storage", "file"}, "required flag --shard not set (or NSTANCE_SHARD)"},
		{"nstance-server", "argument", nil, []string{"--shard", "s", "serve"}, `unexpected argument "serve" (only flags are taken)`},
		{"nstance-agent", "bad flag", nil, []string{"--bogus"}, `unknown argument "--bogus" (configuration comes from NSTANCE_* variables)`},
		{"nstance-agent", "argument", nil, []string{"--version", "now"}, `unexpected argument "now" (the agent takes only --version or --help; configuration comes from NSTANCE_* variables)`},
		{"nstance-agent", "bad value", append([]string{"NSTANCE_LOG_LEVEL=loud"}, agentEnv...), nil, `agent configuration: NSTANCE_LOG_LEVEL: log level "loud": want debug, info, warn, error or a verbosity number`},
		{"nstance-operator", "bad flag", nil, []string{"--bogus"}, "flag provided but not defined: -bogus"},
		{"nstance-operator", "bad value", nil, []string{"--webhook-port=0"}, "--webhook-port 0: must be between 1 and 65535"},
		{"nstance-operator", "argument", nil, []string{"run"}, `unexpected argument "run" (the operator takes only flags)`},
		{"nstance-admin", "bad flag", nil, []string{"--bogus"}, "flag provided but not defined: -bogus"},
		{"nstance-admin", "unknown command", nil, []string{"shards"}, `unknown command "shards"`},
		{"nstance-admin", "bad flag of a command", nil, []string{"instance", "list", "--bogus"}, "instance list: flag provided but not defined: -bogus"},
		{"dev-k8s", "bad flag", nil, []string{"--bogus"}, "flag provided but not defined: -bogus"},
		{"dev-k8s", "bad value", nil, []string{"--tls=maybe"}, `invalid boolean value "maybe" for -tls: parse error`},
		{"dev-k8s", "argument", nil, []string{"start"}, `unexpected argument "start" (only flags are taken)`},
		{"dev-s3", "bad flag", nil, []string{"--bogus"}, "flag provided but not defined: -bogus"},
		{"dev-s3", "bad value", nil, []string{"--upload-expiry=soon"}, `invalid value "soon" for flag -upload-expiry: parse error`},
		{"dev-s3", "argument", nil, []string{"bucket"}, `unexpected argument "bucket" (only flags are taken)`},
	}
	for _, tc := range usage {
		t.Run(tc.bin+"/"+tc.name, func(t *testing.T) {
			r := run(t, tc.bin, tc.env, tc.args...)
			require.Equal(t, 2, r.code, "stdout %q stderr %q", r.stdout, r.stderr)
			require.Equal(t, []string{tc.bin + ": " + tc.problem, "Run '" + tc.bin + " --help' for usage."}, lines(r.stderr))
			require.Empty(t, r.stdout, "no help dump")
		})
	}

	// A runtime error: exit 1 and one line naming the problem. Binaries
	// that log have logged "starting" first; the problem is then the last
	// line (a log entry for those that log it).
	runtime := []struct {
		bin, name string
		env       []string
		args      []string
		last      string // regexp of the last line of stderr
		oneLine   bool   // stderr is that line only
	}{
		{"nstance-server", "missing config file", nil, []string{"--shard", "s", "--validate", "--config-file", missing},
			`^nstance-server: reading \S+/missing: open \S+/missing: no such file or directory$`, true},
		{"nstance-agent", "missing identity", agentEnv, nil,
			`^\{"level":"error".*"msg":"agent stopped".*reading nonce: open \S+/agent/identity/nonce.jwt: no such file or directory.*"\}$`, false},
		{"nstance-operator", "missing config file", nil, []string{"--config", missing, "--log-format=json"},
			`^\{"level":"error".*"msg":"invalid operator configuration","error":"operator config file \S+/missing does not exist \(set --config\)"\}$`, false},
		{"nstance-admin", "missing certificate", nil, []string{"cluster", "ca", "import", "--name", "x", "--cert", missing, "--key", missing},
			`^nstance-admin: reading --cert: open \S+/missing: no such file or directory$`, true},
		{"dev-k8s", "missing token file", nil, []string{"--token-file", missing, "--dir", filepath.Join(tmp, "k8s"), "--addr", "127.0.0.1:0", "--log-format=json"},
			`^dev-k8s: token file: stat \S+/missing: no such file or directory$`, false},
		{"dev-s3", "directory is a file", nil, []string{"--dir", aFile, "--addr", "127.0.0.1:0", "--log-format=json"},
			`^dev-s3: bucket directory \S+/a-file exists but is not a directory$`, false},
	}
	for _, tc := range runtime {
		t.Run(tc.bin+"/"+tc.name, func(t *testing.T) {
			r := run(t, tc.bin, tc.env, tc.args...)
			require.Equal(t, 1, r.code, "stdout %q stderr %q", r.stdout, r.stderr)
			ls := lines(r.stderr)
			require.NotEmpty(t, ls)
			require.Regexp(t, tc.last, ls[len(ls)-1])
			if tc.oneLine {
				require.Len(t, ls, 1, r.stderr)
			} else {
				require.Contains(t, ls[0], `"msg":"starting"`, "the version is logged first")
				require.LessOrEqual(t, len(ls), 2, r.stderr)
			}
			require.NotContains(t, r.stderr, "--help", "no hint for a runtime error")
		})
	}

	// --version, and the version command of the binary with commands.
	for _, b := range binaries {
		versions := [][]string{{"--version"}}
		if b == "nstance-admin" {
			versions = append(versions, []string{"version"})
		}
		for _, args := range versions {
			t.Run(b+"/"+args[0], func(t *testing.T) {
				r := run(t, b, nil, args...)
				require.Equal(t, 0, r.code, "stderr %q", r.stderr)
				require.Len(t, lines(r.stdout), 1)
				require.Regexp(t, regexp.MustCompile(version.Pattern(b)), lines(r.stdout)[0])
				require.Empty(t, r.stderr)
			})
		}
	}
}
