package app

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/s3store"
)

func probe(addr, path string) int {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestProbesWhenStorageGoesAway: liveness (/healthz) stays 200 while
// storage is unreachable, so a storage outage does not get the server
// restarted; readiness (/readyz) turns 503 within about a lease duration
// (2s in testConfig) once storage stops answering.
func TestProbesWhenStorageGoesAway(t *testing.T) {
	s3 := devs3test.Start(t, "")
	store, err := s3store.NewWithClient(devs3test.Client(s3.URL), devs3test.Bucket, "")
	require.NoError(t, err)
	putConfig(t, store, "c1", "dev-1")
	r := startApp(t, store, "probe-a", "dev-1")
	waitServing(t, 30*time.Second, r)
	addr := r.app.Addrs().Health
	require.Eventually(t, func() bool { return probe(addr, "/readyz") == http.StatusOK }, 10*time.Second, 20*time.Millisecond, "readyz while storage answers")
	require.Equal(t, http.StatusOK, probe(addr, "/healthz"))

	require.NoError(t, s3.Stop())
	stopped := time.Now()
	require.Eventually(t, func() bool {
		require.Equal(t, http.StatusOK, probe(addr, "/healthz"), "liveness must not follow storage")
		return probe(addr, "/readyz") == http.StatusServiceUnavailable
	}, 15*time.Second, 50*time.Millisecond, "readyz never turned 503 after storage went away")
	t.Logf("readyz 503 %s after storage stopped", time.Since(stopped).Round(10*time.Millisecond))
	for range 10 {
		require.Equal(t, http.StatusOK, probe(addr, "/healthz"))
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLeaderInterfaceFlagChecked: --leader-interface (NSTANCE_LEADER_ENI
// from the AWS user data) overrides shard.leader_address; a value that is no
// ENI id stops the server at start with the flag named, before it campaigns.
func TestLeaderInterfaceFlagChecked(t *testing.T) {
	store := s3Store(t)
	putConfig(t, store, "c1", "dev-1")
	a, err := New(Options{
		ServerID: "eni-a", Shard: "dev-1", Store: store, Keys: layout.New(""), CacheDir: t.TempDir(),
		Bind:              BindOverrides{Health: "127.0.0.1:0"},
		Getenv:            func(k string) string { return map[string]string{"NSTANCE_ENCRYPTION_KEY": testKey}[k] },
		Log:               testr.New(t),
		Provider:          mock.New(),
		LeaderInterfaceID: "i-0123456789abcdef0",
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = a.Run(ctx)
	require.ErrorContains(t, err, `--leader-interface "i-0123456789abcdef0": want an ENI id`)
	_, getErr := store.Get(context.Background(), layout.New("").ShardLeader("dev-1"))
	require.ErrorIs(t, getErr, objstore.ErrNotFound, "it never campaigned")
}

// TestLeaderPodFlagChecked: --leader-pod (NSTANCE_LEADER_POD from the
// nstance-server chart) is checked at start, before the server campaigns:
// a reference that is not namespace/name, or given with --leader-interface,
// stops it naming the problem.
func TestLeaderPodFlagChecked(t *testing.T) {
	for _, tc := range []struct {
		name, pod, eni, want string
	}{
		{"not namespace/name", "nstance-server-a-0", "", `leader pod "nstance-server-a-0": want namespace/name`},
		{"unexpanded downward API variables", "$(POD_NAMESPACE)/$(POD_NAME)", "", `leader pod "$(POD_NAMESPACE)/$(POD_NAME)": namespace`},
		{"both leader address flags", "ns/pod", "eni-0123456789abcdef0", "--leader-pod and --leader-interface: choose one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := s3Store(t)
			putConfig(t, store, "c1", "dev-1")
			a, err := New(Options{
				ServerID: "pod-a", Shard: "dev-1", Store: store, Keys: layout.New(""), CacheDir: t.TempDir(),
				Bind:              BindOverrides{Health: "127.0.0.1:0"},
				Getenv:            func(k string) string { return map[string]string{"NSTANCE_ENCRYPTION_KEY": testKey}[k] },
				Log:               testr.New(t),
				Provider:          mock.New(),
				LeaderPod:         tc.pod,
				LeaderInterfaceID: tc.eni,
			})
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			require.ErrorContains(t, a.Run(ctx), tc.want)
			_, getErr := store.Get(context.Background(), layout.New("").ShardLeader("dev-1"))
			require.ErrorIs(t, getErr, objstore.ErrNotFound, "it never campaigned")
		})
	}
}
