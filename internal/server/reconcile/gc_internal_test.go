package reconcile

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
)

func TestGCDue(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	on := config.GarbageCollection{Interval: config.Duration(10 * time.Minute)}.WithDefaults()
	off := on
	off.Enabled = new(false)
	for _, tc := range []struct {
		name      string
		gc        config.GarbageCollection
		last, now time.Time
		want      bool
	}{
		{"on by default, first pass of the term", config.GarbageCollection{}.WithDefaults(), time.Time{}, t0, true},
		{"before the interval", on, t0, t0.Add(10*time.Minute - time.Nanosecond), false},
		{"at the interval", on, t0, t0.Add(10 * time.Minute), true},
		{"default interval 5m", config.GarbageCollection{}.WithDefaults(), t0, t0.Add(4 * time.Minute), false},
		{"off", off, time.Time{}, t0, false},
	} {
		t.Run(tc.name, func(t *testing.T) { require.Equal(t, tc.want, gcDue(tc.gc, tc.last, tc.now)) })
	}
}

func TestOrphanVerdicts(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	grace := 30 * time.Minute
	for _, tc := range []struct {
		name        string
		listed      []string
		known       map[string]bool
		seen        map[string]time.Time
		now         time.Time
		wantNext    map[string]time.Time
		wantCollect []string
	}{
		{"new orphan: first sighting only", []string{"a"}, nil, nil, t0,
			map[string]time.Time{"a": t0}, nil},
		{"a record claims it", []string{"a"}, map[string]bool{"a": true}, map[string]time.Time{"a": t0}, t0.Add(time.Hour),
			map[string]time.Time{}, nil},
		{"within the grace period", []string{"a"}, nil, map[string]time.Time{"a": t0}, t0.Add(grace - time.Second),
			map[string]time.Time{"a": t0}, nil},
		{"grace over", []string{"a", "b"}, nil, map[string]time.Time{"a": t0}, t0.Add(grace),
			map[string]time.Time{"a": t0, "b": t0.Add(grace)}, []string{"a"}},
		{"gone from the provider: forgotten", nil, nil, map[string]time.Time{"a": t0}, t0.Add(grace),
			map[string]time.Time{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next, collect := orphanVerdicts(tc.listed, tc.known, tc.seen, tc.now, grace)
			require.Equal(t, tc.wantNext, next)
			require.Equal(t, tc.wantCollect, collect)
		})
	}
}
