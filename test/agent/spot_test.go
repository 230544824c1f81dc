package agent_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/agent/config"
	srvconfig "github.com/nstance-dev/nstance/internal/config"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// An agent whose instance metadata says it is spot (instance-life-cycle),
// with no NSTANCE_SPOT_NOTICE set, reads the spot interruption notice over
// IMDSv2 once it appears, after several empty polls, and its next health
// report, sent at once rather than at the (hour-long) report interval,
// carries it to the server.
func TestSpotNoticeFromIMDSReachesTheServer(t *testing.T) {
	var polls atomic.Int32
	imds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
			w.Header().Set("X-Aws-Ec2-Metadata-Token-Ttl-Seconds", "21600")
			_, _ = w.Write([]byte("tok"))
		case r.Method == http.MethodGet && r.URL.Path == "/latest/meta-data/instance-life-cycle" && r.Header.Get("X-Aws-Ec2-Metadata-Token") == "tok":
			_, _ = w.Write([]byte("spot"))
		case r.Method == http.MethodGet && r.URL.Path == "/latest/meta-data/spot/instance-action" && r.Header.Get("X-Aws-Ec2-Metadata-Token") == "tok":
			if polls.Add(1) <= 6 {
				http.NotFound(w, r)
				return
			}
			_, _ = w.Write([]byte(`{"action": "terminate", "time": "2026-11-24T08:22:00Z"}`))
		default:
			w.WriteHeader(http.StatusUnauthorized)
		}
	}))
	t.Cleanup(imds.Close)

	e := newEnv(t)
	e.agentEnv = map[string]string{
		config.EnvIMDSEndpoint: imds.URL, config.EnvSpotPollInterval: "50ms",
		config.EnvMetricsInterval: "1h",
	}
	e.start(t, "spot-1", srvconfig.Template{Kind: "worker"}, nil)
	require.Eventually(t, func() bool {
		r := e.lastReport("spot-1")
		return r != nil && r.GetTermination().GetKind() == nstancev1.TerminationKind_TERMINATION_KIND_SPOT
	}, 20*time.Second, 20*time.Millisecond, "the server receives the spot notice")
	r := e.lastReport("spot-1")
	require.Equal(t, time.Date(2026, 11, 24, 8, 22, 0, 0, time.UTC), r.GetTermination().GetDeadline().AsTime())
	require.Greater(t, polls.Load(), int32(6), "the notice came after the empty polls")
}

// An agent told that every stop is its host going down
// (NSTANCE_SHUTDOWN_DETECT=always) says so in its last report, which the
// server receives before the agent exits; with never, the last report
// carries nothing.
func TestStopReportsHostShutdown(t *testing.T) {
	for mode, want := range map[string]nstancev1.TerminationKind{
		"always": nstancev1.TerminationKind_TERMINATION_KIND_SHUTDOWN,
		"never":  nstancev1.TerminationKind_TERMINATION_KIND_UNSPECIFIED,
	} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			e.agentEnv = map[string]string{config.EnvShutdownDetect: mode, config.EnvMetricsInterval: "1h"}
			_, stop := e.start(t, "down-1", srvconfig.Template{Kind: "worker"}, nil)
			require.Eventually(t, func() bool { return e.lastReport("down-1") != nil }, 20*time.Second, 20*time.Millisecond, "first report")
			require.Nil(t, e.lastReport("down-1").GetTermination())
			before, _ := e.shard.Health.Get("down-1")
			stop()
			rec, ok := e.shard.Health.Get("down-1")
			require.True(t, ok)
			require.Greater(t, rec.Reports, before.Reports, "the last report arrived before the agent stopped")
			require.Equal(t, want, rec.Last.GetTermination().GetKind())
			if want != nstancev1.TerminationKind_TERMINATION_KIND_UNSPECIFIED {
				require.False(t, rec.ShutdownAt.IsZero(), "the server's table records the shutdown")
			}
		})
	}
}
