package chaos

import (
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// envInt reads a positive integer knob (make chaos raises them).
func envInt(t testing.TB, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, "%s=%q", name, v)
	require.Positive(t, n, name)
	return n
}

// other returns the server of two that is not s.
func (st *stack) other(s *server) *server {
	if st.servers[0] == s {
		return st.servers[1]
	}
	return st.servers[0]
}

// A leader cut off from storage stops serving before its standby starts:
// both Operator ports are polled every 50ms, and no answer of the old
// leader is received after the first call the new one answers. The
// servers alternate as the one cut off (CHAOS_RUNS handovers).
func TestLeaderCutOffFromStorage(t *testing.T) {
	cutOffRuns(t, newStack(t, 2), envInt(t, "CHAOS_RUNS", 3))
}

// cutOffRuns cuts the leader of st's two servers off from storage runs
// times, alternating, and requires each handover without overlap and the
// healed old leader silent.
func cutOffRuns(t *testing.T, st *stack, runs int) {
	t.Helper()
	p := startPoller(st.operatorClients())
	defer p.Stop()
	leader := st.leader(p, time.Now(), 60*time.Second)
	for i := 1; i <= runs; i++ {
		standby := st.other(leader)
		cut := time.Now()
		leader.proxy.Cut()
		require.Eventually(t, func() bool { return p.servedSince(standby, cut) }, 60*time.Second, 20*time.Millisecond,
			"run %d: the standby takes over", i)
		ov, err := p.overlap(leader, standby, cut)
		require.NoError(t, err)
		t.Logf("run %d: %s cut off; %s serves %s after the cut; overlap %s (old leader's last answer %s after the cut)", i, leader.id, standby.id,
			p.firstServedAfter(standby, cut).Sub(cut).Round(time.Millisecond), ov, p.lastServed(leader).recv.Sub(cut).Round(time.Millisecond))
		require.Zero(t, ov, "run %d: two leaders served at once", i)
		// Heal: the old leader becomes a standby and must stay silent.
		leader.proxy.Heal()
		healed := time.Now()
		require.Eventually(t, func() bool { return p.servedSince(standby, healed.Add(time.Second)) }, 30*time.Second, 20*time.Millisecond)
		require.False(t, p.servedSince(leader, healed), "run %d: the healed old leader serves again while the new one leads", i)
		leader = standby
	}
}

// A leader frozen by SIGSTOP longer than its lease is replaced, and once
// continued it answers nothing: its own clock says its lease is over before
// any queued request is served (CHAOS_FREEZE seconds, 2 lease lengths in
// make test).
func TestLeaderFrozen(t *testing.T) {
	freeze := time.Duration(envInt(t, "CHAOS_FREEZE", 6)) * time.Second
	st := newStack(t, 2)
	p := startPoller(st.operatorClients())
	defer p.Stop()
	leader := st.leader(p, time.Now(), 60*time.Second)
	standby := st.other(leader)
	cut := time.Now()
	leader.signal(t, syscall.SIGSTOP)
	require.Eventually(t, func() bool { return p.servedSince(standby, cut) }, 60*time.Second, 20*time.Millisecond, "the standby takes over")
	if rest := freeze - time.Since(cut); rest > 0 {
		time.Sleep(rest) // the fault's duration is the input, not a wait for a condition
	}
	cont := time.Now()
	leader.signal(t, syscall.SIGCONT)
	// The new leader keeps serving for a while after the old one resumed;
	// the old one answers nothing after the cut.
	require.Eventually(t, func() bool { return p.servedSince(standby, cont.Add(3*time.Second)) }, 30*time.Second, 20*time.Millisecond)
	ov, err := p.overlap(leader, standby, cut)
	require.NoError(t, err)
	t.Logf("%s frozen %s; %s took over; overlap %s", leader.id, freeze, standby.id, ov)
	require.Zero(t, ov, "two leaders served at once")
	require.False(t, p.servedSince(leader, cut), "the resumed old leader answered a call")
}
