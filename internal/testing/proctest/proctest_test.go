package proctest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestStartAndStop(t *testing.T) {
	root, err := RepoRoot()
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.mod"))
	require.NoError(t, err)

	log := filepath.Join(t.TempDir(), "logs", "sh.log")
	// A child that ignores SIGTERM is killed after the grace period, with
	// its own child (same process group).
	p, err := Start("sh", log, t.TempDir(), os.Environ(), "/bin/sh", "-c", `trap "" TERM; echo up; sleep 60 & wait`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { b, _ := os.ReadFile(log); return strings.Contains(string(b), "up") }, 10*time.Second, 10*time.Millisecond)
	require.False(t, p.Exited())
	p.Stop(200 * time.Millisecond)
	require.True(t, p.Exited())
	p.Stop(time.Second) // idempotent
}
