package agent_test

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/require"

	srvconfig "github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/test/agent/agenttest"
)

func bigFile(size int, fill string) srvconfig.Template {
	return srvconfig.Template{Files: map[string]srvconfig.TemplateFile{
		"big": {Kind: "string", Path: "big.bin", Content: strings.Repeat(fill, size)},
	}}
}

// TestLargeFileDeliveriesOverRealTLS: a 5 MiB file (above gRPC's 4 MiB
// default message size) is delivered; a file set above max_file_bytes is
// refused by the server with a clear log line while the agent keeps its
// stream (no reconnect) and its current file; a later delivery within the
// limit goes through on the same stream.
func TestLargeFileDeliveriesOverRealTLS(t *testing.T) {
	var mu sync.Mutex
	var logged strings.Builder
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		logged.WriteString(prefix + " " + args + "\n")
		mu.Unlock()
	}, funcr.Options{})
	s, err := agenttest.New(log)
	require.NoError(t, err)
	s.RepushInterval = 300 * time.Millisecond
	require.NoError(t, s.Start())
	t.Cleanup(s.Stop)
	e := &env{shard: s, dir: t.TempDir(), log: log}

	cfg, _ := e.start(t, "node-big", bigFile(5<<20, "a"), nil)
	e.waitConverged(t, "node-big", 1)
	path := filepath.Join(cfg.FilesDir, "big.bin")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Len(t, b, 5<<20)
	streams := s.FileStreams.Load()
	require.Equal(t, int64(1), streams, "one file stream, no reconnects")

	// Above the limit (default 8 MiB): refused, logged, agent stays.
	tooBig := srvconfig.DefaultMaxFileBytes + 1
	s.SetTemplate("node-big", bigFile(tooBig, "b"), true)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(logged.String(), "file delivery refused")
	}, 20*time.Second, 20*time.Millisecond)
	mu.Lock()
	require.Contains(t, logged.String(), "more than shard.limits.max_file_bytes (8388608)")
	mu.Unlock()
	// Several health reports later (and drift-triggered re-plans every
	// 300ms), the agent is still on its first stream with its old file.
	rec, ok := s.Health.Get("node-big")
	require.True(t, ok)
	seen := rec.Reports
	require.Eventually(t, func() bool {
		r, _ := s.Health.Get("node-big")
		return r.Reports >= seen+8
	}, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, streams, s.FileStreams.Load(), "the agent did not reconnect")
	require.Equal(t, int64(1), s.Refused.Load(), "the refusal is reported once per file set, not on every re-plan")
	mu.Lock()
	require.Equal(t, 1, strings.Count(logged.String(), "file delivery refused"))
	mu.Unlock()
	b, err = os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, byte('a'), b[0], "the agent keeps its current file")

	// Back within the limit: delivered on the same stream.
	s.SetTemplate("node-big", bigFile(6<<20, "c"), true)
	e.waitConverged(t, "node-big", 1)
	b, err = os.ReadFile(path)
	require.NoError(t, err)
	require.Len(t, b, 6<<20)
	require.Equal(t, byte('c'), b[0])
	require.Equal(t, streams, s.FileStreams.Load())
}
