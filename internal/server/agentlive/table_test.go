package agentlive_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/agentlive"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func TestOverdueAndGet(t *testing.T) {
	tb := agentlive.New()
	t0 := time.Unix(1000, 0)
	require.NoError(t, tb.RecordHealth(context.Background(), agentlive.Ref{InstanceID: "a"}, &nstancev1.HealthReport{
		Files: []*nstancev1.FileStatus{{Path: "x", State: nstancev1.FileState_FILE_STATE_ERROR}},
	}, t0.Add(10*time.Second)))
	got := tb.Overdue([]string{"a", "b"}, t0, t0.Add(35*time.Second), 10*time.Second)
	require.Equal(t, map[string]int{"a": 2, "b": 3}, got)
	rec, ok := tb.Get("a")
	require.True(t, ok)
	require.Equal(t, 1, rec.FileErrors)
	require.Equal(t, uint64(1), rec.Reports)
	require.Equal(t, "x", rec.Last.GetFiles()[0].GetPath())
	tb.Forget("a")
	require.Empty(t, tb.IDs())
	_, ok = tb.LastReport("a")
	require.False(t, ok)
}

// The one subscription hears the changes the reconciler acts on, once
// each: a first report, a new version, a new notice kind, a reported host
// shutdown; a repeated report changes nothing. A shutdown is not a
// platform notice: it is kept apart, and a report without it clears it.
func TestChanges(t *testing.T) {
	tb := agentlive.New()
	var got []agentlive.Change
	tb.Subscribe(func(c agentlive.Change) { got = append(got, c) })
	ctx, now, ref := context.Background(), time.Unix(1000, 0), agentlive.Ref{InstanceID: "i-1"}
	rep := func(version string, notice nstancev1.TerminationKind) {
		r := &nstancev1.HealthReport{AgentVersion: version}
		if notice != nstancev1.TerminationKind_TERMINATION_KIND_UNSPECIFIED {
			r.Termination = &nstancev1.TerminationNotice{Kind: notice}
		}
		require.NoError(t, tb.RecordHealth(ctx, ref, r, now))
	}
	rep("v1", 0)
	rep("v1", 0)
	rep("", 0) // an agent that says no version keeps the last one
	rep("v2", 0)
	rep("v2", nstancev1.TerminationKind_TERMINATION_KIND_SPOT)
	rep("v2", nstancev1.TerminationKind_TERMINATION_KIND_SPOT)
	rep("v2", nstancev1.TerminationKind_TERMINATION_KIND_SHUTDOWN)
	require.Equal(t, []agentlive.Change{
		{InstanceID: "i-1", First: true, NewVersion: true},
		{InstanceID: "i-1", NewVersion: true},
		{InstanceID: "i-1", NewNotice: true},
		{InstanceID: "i-1", Shutdown: true},
	}, got)
	require.Equal(t, "v2", tb.Version("i-1"))
	require.Equal(t, "spot", tb.Notice("i-1"), "the platform's notice stays")
	p, _ := tb.Presence("i-1")
	require.Equal(t, now, p.ShutdownAt)
	rep("v2", nstancev1.TerminationKind_TERMINATION_KIND_SHUTDOWN)
	require.Len(t, got, 4, "a repeated shutdown report is no new change")
	rep("v2", 0)
	p, _ = tb.Presence("i-1")
	require.True(t, p.ShutdownAt.IsZero(), "a report without it: the host stayed up")
	require.Equal(t, uint64(9), tb.Reports())
}

// The release of an instance's last stream, after it reported, is a
// Disconnected change stamped with the table's clock; a new stream clears
// it. An instance that never reported says nothing when it goes.
func TestDisconnected(t *testing.T) {
	now := time.Unix(2000, 0)
	tb := agentlive.NewWithClock(func() time.Time { return now })
	var got []agentlive.Change
	tb.Subscribe(func(c agentlive.Change) { got = append(got, c) })
	a, quiet := agentlive.Ref{InstanceID: "a"}, agentlive.Ref{InstanceID: "quiet"}
	r1, r2 := tb.Connect(a), tb.Connect(a)
	require.NoError(t, tb.RecordHealth(context.Background(), a, &nstancev1.HealthReport{}, now))
	tb.Connect(quiet)()
	r1()
	require.Equal(t, []agentlive.Change{{InstanceID: "a", First: true}}, got, "one stream is still open")
	now = now.Add(time.Second)
	r2()
	require.Equal(t, agentlive.Change{InstanceID: "a", Disconnected: true}, got[len(got)-1])
	p, ok := tb.Presence("a")
	require.True(t, ok)
	require.Equal(t, agentlive.Presence{DisconnectedAt: now}, p)
	tb.Connect(a)
	p, _ = tb.Presence("a")
	require.Equal(t, agentlive.Presence{Streams: 1}, p, "back: no longer disconnected")
	require.Len(t, got, 2)
}

// Streams are counted per instance; an instance that only connected (no
// report) leaves the table with its last stream, and a release after a
// Forget does not bring it back.
func TestConnect(t *testing.T) {
	tb := agentlive.New()
	a, b := agentlive.Ref{InstanceID: "a"}, agentlive.Ref{InstanceID: "b"}
	ra1, ra2, rb := tb.Connect(a), tb.Connect(a), tb.Connect(b)
	require.Equal(t, 2, tb.Connected())
	ra1()
	ra1() // a second release is a no-op
	require.Equal(t, 2, tb.Connected())
	ra2()
	require.Equal(t, 1, tb.Connected())
	require.Equal(t, 1, tb.Len(), "a connected without reporting: gone with its last stream")
	tb.Forget("b")
	rb()
	require.Equal(t, 0, tb.Len())
	_, reported := tb.LastReport("b")
	require.False(t, reported, "a connection is not a report")
}
