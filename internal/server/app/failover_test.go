package app

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

func TestTwoServersOneShard(t *testing.T) {
	store := s3Store(t)
	// A lease far longer than any wait below: the standby can only take
	// over through the graceful release, never by expiry, however slow the
	// machine.
	cfg := strings.Replace(string(testConfig("c1", "s1")), `"lease_duration": "2s"`, `"lease_duration": "2m"`, 1)
	require.Contains(t, cfg, `"lease_duration": "2m"`)
	_, err := store.Put(context.Background(), layout.New("").Config("s1"), []byte(cfg), objstore.PutOptions{})
	require.NoError(t, err)
	a := startApp(t, store, "srv-a", "s1")
	b := startApp(t, store, "srv-b", "s1")
	leader := waitServing(t, 15*time.Second, a, b)
	standby := b
	if leader == b {
		standby = a
	}
	// For a few lease renewals exactly one serves, and the standby accepts no gRPC connections.
	for i := 0; i < 20; i++ {
		require.True(t, leader.app.ServingGRPC())
		require.False(t, standby.app.ServingGRPC())
		time.Sleep(50 * time.Millisecond)
	}
	require.Empty(t, standby.app.Addrs().Registration)
	require.Equal(t, 200, healthCode(t, standby.app.Addrs().Health), "a ready standby reports healthy")

	// A graceful stop releases the lease; the standby serves long before
	// the lease could have expired.
	began := time.Now()
	require.NoError(t, leader.stop())
	waitServing(t, 30*time.Second, standby)
	t.Logf("graceful handover took %s", time.Since(began))
	conn, err := net.DialTimeout("tcp", standby.app.Addrs().Registration, time.Second)
	require.NoError(t, err)
	require.NoError(t, conn.Close())
}
