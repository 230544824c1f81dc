package planner_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/reconcile/planner"
)

func TestDecideVanish(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	const grace, window = time.Minute, 90 * time.Second
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	cases := []struct {
		name  string
		signs planner.Signs
		now   time.Time
		want  planner.Vanish
	}{
		{name: "no signs", now: at(time.Hour), want: planner.Vanish{}},
		{name: "shutdown just reported: ask again at the floor", signs: planner.Signs{ShutdownAt: t0, Streams: 1}, now: t0,
			want: planner.Vanish{Recheck: planner.ProbeMin}},
		{name: "shutdown 300ms ago: again after 300ms", signs: planner.Signs{ShutdownAt: t0}, now: at(300 * time.Millisecond),
			want: planner.Vanish{Recheck: 300 * time.Millisecond}},
		{name: "shutdown 30s ago: paced at the ceiling", signs: planner.Signs{ShutdownAt: t0}, now: at(30 * time.Second),
			want: planner.Vanish{Recheck: planner.ProbeMax}},
		{name: "shutdown: the last check lands on the grace", signs: planner.Signs{ShutdownAt: t0}, now: at(grace - time.Second),
			want: planner.Vanish{Recheck: time.Second}},
		{name: "shutdown grace over: replace", signs: planner.Signs{ShutdownAt: t0}, now: at(grace),
			want: planner.Vanish{Replace: true}},
		{name: "shutdown wins over a reconnection", signs: planner.Signs{ShutdownAt: t0, DisconnectedAt: t0, Streams: 2}, now: at(grace + time.Second),
			want: planner.Vanish{Replace: true}},
		{name: "disconnected: checked", signs: planner.Signs{DisconnectedAt: t0}, now: at(10 * time.Millisecond),
			want: planner.Vanish{Recheck: planner.ProbeMin}},
		{name: "disconnected 2s ago: again after 2s", signs: planner.Signs{DisconnectedAt: t0}, now: at(2 * time.Second),
			want: planner.Vanish{Recheck: 2 * time.Second}},
		{name: "disconnected but a stream is back: nothing", signs: planner.Signs{DisconnectedAt: t0, Streams: 1}, now: at(time.Second),
			want: planner.Vanish{}},
		{name: "disconnected: the last check lands on the window", signs: planner.Signs{DisconnectedAt: t0}, now: at(window - 2*time.Second),
			want: planner.Vanish{Recheck: 2 * time.Second}},
		{name: "disconnected past the window: the health rule decides", signs: planner.Signs{DisconnectedAt: t0}, now: at(window),
			want: planner.Vanish{}},
		{name: "a clock step back: the floor", signs: planner.Signs{DisconnectedAt: t0}, now: at(-time.Minute),
			want: planner.Vanish{Recheck: planner.ProbeMin}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, planner.DecideVanish(tc.signs, tc.now, grace, window))
		})
	}
}
