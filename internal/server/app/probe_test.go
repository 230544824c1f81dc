package app

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
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
