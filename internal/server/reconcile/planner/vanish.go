package planner

import "time"

// Signs are what the Agent service saw that suggests an instance's VM may
// be going away, before any health report is missed.
type Signs struct {
	// ShutdownAt is when the agent reported that its host is shutting down
	// (zero: it did not, or a later report came without it).
	ShutdownAt time.Time
	// DisconnectedAt is when the instance's last stream to this leader
	// closed (zero: a stream is open, or it never had one).
	DisconnectedAt time.Time
	// Streams is the number of streams it has open now.
	Streams int
}

// Vanish is what to do with signs the provider did not confirm: its last
// answer was that the instance still runs.
type Vanish struct {
	// Replace: the shutdown grace is over; the member is replaced as if the
	// platform had announced its termination.
	Replace bool
	// Recheck > 0: ask the provider again after this long.
	Recheck time.Duration
}

// Probe pacing: the provider is asked again after as long as has passed
// since the sign (so at about 50, 100, 200, 400 ms, ...), never sooner than
// ProbeMin and never later than ProbeMax. A VM that goes away right after
// its agent's last word is seen within a few tens of milliseconds; one that
// takes a while costs a provider call per ProbeMax.
const (
	ProbeMin = 50 * time.Millisecond
	ProbeMax = 5 * time.Second
)

// DecideVanish decides, after the provider answered that the instance still
// runs, what its signs call for at now.
//
//   - A reported host shutdown is checked until shutdownGrace has passed
//     since the report, then the member is replaced (replacement first, as
//     for a spot notice): a provider that cannot see a guest shutdown (a VM
//     halted but not stopped) must not keep a dead member.
//   - A lost connection is a hint, not a verdict: it is checked while the
//     instance has no stream open, for as long as the health rule itself
//     would wait (window: interval × misses); an agent that comes back (a
//     restart on a living VM) ends the checks, and past the window the
//     missed reports decide as for any instance.
//   - With neither, nothing.
func DecideVanish(s Signs, now time.Time, shutdownGrace, window time.Duration) Vanish {
	switch {
	case !s.ShutdownAt.IsZero():
		since := now.Sub(s.ShutdownAt)
		if since >= shutdownGrace {
			return Vanish{Replace: true}
		}
		return Vanish{Recheck: min(pace(since), shutdownGrace-since)}
	case !s.DisconnectedAt.IsZero() && s.Streams == 0:
		since := now.Sub(s.DisconnectedAt)
		if since >= window {
			return Vanish{}
		}
		return Vanish{Recheck: min(pace(since), window-since)}
	}
	return Vanish{}
}

func pace(since time.Duration) time.Duration {
	return min(max(since, ProbeMin), ProbeMax)
}
