package agentapi

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Remedies of files that stay in error back off: at once, then after 30s,
// 1m, 2m, ... up to 10m; a report without errors starts over.
func TestFileFixBacksOff(t *testing.T) {
	h := &hub{byID: map[string]*instanceState{}}
	h.add("i-1")
	t0 := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	base := 30 * time.Second
	require.True(t, h.fileFixDue("i-1", t0, base), "the first at once")
	at := t0
	for _, gap := range []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 10 * time.Minute, 10 * time.Minute} {
		require.False(t, h.fileFixDue("i-1", at.Add(gap-time.Second), base), "before %s", gap)
		at = at.Add(gap)
		require.True(t, h.fileFixDue("i-1", at, base), "after %s", gap)
	}
	h.fileFixReset("i-1")
	require.True(t, h.fileFixDue("i-1", at.Add(time.Second), base), "errors again after a clean report: at once")
	require.False(t, h.fileFixDue("i-2", t0, base), "no stream open: nothing to push")
}
