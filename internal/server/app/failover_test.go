package app

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTwoServersOneShard(t *testing.T) {
	store := s3Store(t)
	putConfig(t, store, "c1", "s1")
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

	// A graceful stop releases the lease; the standby serves well within a lease.
	began := time.Now()
	require.NoError(t, leader.stop())
	waitServing(t, 3*time.Second, standby)
	t.Logf("graceful handover took %s", time.Since(began))
	conn, err := net.DialTimeout("tcp", standby.app.Addrs().Registration, time.Second)
	require.NoError(t, err)
	require.NoError(t, conn.Close())
}
