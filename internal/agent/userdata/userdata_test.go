package userdata

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
)

func TestRunsOncePerRunner(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "user-data")
	require.NoError(t, os.WriteFile(path, []byte("#!/bin/sh\necho \"ran in $(pwd) for $NSTANCE_INSTANCE_ID\"\necho x >> count\n"), 0o600))
	var out bytes.Buffer
	r := &Runner{Path: path, Env: []string{"NSTANCE_INSTANCE_ID=i-1", "PATH=" + os.Getenv("PATH")}, Stdout: &out, Stderr: &out, Log: logr.Discard()}
	require.NoError(t, r.Wait(), "not started: nothing to wait for")
	r.Start(context.Background())
	r.Start(context.Background())
	require.NoError(t, r.Wait())
	require.Equal(t, "ran in "+dir+" for i-1\n", out.String())

	count, err := os.ReadFile(filepath.Join(dir, "count"))
	require.NoError(t, err)
	require.Equal(t, "x\n", string(count), "Start runs it once however often it is called")
	// A restarted agent (a new Runner) runs it again, as a boot would.
	r2 := &Runner{Path: path, Env: r.Env, Stdout: &out, Stderr: &out, Log: logr.Discard()}
	r2.Start(context.Background())
	require.NoError(t, r2.Wait())
	count, err = os.ReadFile(filepath.Join(dir, "count"))
	require.NoError(t, err)
	require.Equal(t, "x\nx\n", string(count))
}

func TestFailureIsReportedAndSkippedData(t *testing.T) {
	dir := t.TempDir()
	fail := filepath.Join(dir, "fail")
	require.NoError(t, os.WriteFile(fail, []byte("#!/bin/sh\necho broken >&2\nexit 3\n"), 0o600))
	var out bytes.Buffer
	r := &Runner{Path: fail, Stdout: &out, Stderr: &out, Log: logr.Discard()}
	r.Start(context.Background())
	require.ErrorContains(t, r.Wait(), "exit status 3")
	require.Equal(t, "broken\n", out.String())

	cc := filepath.Join(dir, "cloud-config")
	require.NoError(t, os.WriteFile(cc, []byte("#cloud-config\nruncmd: [reboot]\n"), 0o600))
	r = &Runner{Path: cc, Log: logr.Discard()}
	r.Start(context.Background())
	require.NoError(t, r.Wait())
	info, err := os.Stat(cc)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "cloud-config is not made executable nor run")

	r = &Runner{Path: filepath.Join(dir, "missing"), Log: logr.Discard()}
	r.Start(context.Background())
	require.NoError(t, r.Wait())
}
