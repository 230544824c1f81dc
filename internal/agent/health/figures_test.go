package health

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A fixture proc tree: per-core CPU between two samples, packets and drops
// per interface, and conntrack use from sys/net/netfilter.
func TestSampleFiguresFromAFixtureTree(t *testing.T) {
	root := t.TempDir()
	write := func(name, content string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, name), []byte(content), 0o644))
	}
	write("uptime", "100.50 200.00\n")
	write("loadavg", "0.50 0.25 0.10 1/100 999\n")
	write("meminfo", "MemTotal: 1000 kB\nMemAvailable: 400 kB\n")
	write("net/dev", "Inter-|   Receive                                                |  Transmit\n"+
		" face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"+
		"    lo:     700       7    0    0    0     0          0         0      700       7    0    0    0     0       0          0\n"+
		"  eth0:  100000    1000    2    5    0     0          0         0    50000     400    0    3    0     0       0          0\n")
	// USER_HZ is 100: jiffies / 100 are seconds.
	write("stat", "cpu  200 0 0 200 0 0 0 0 0 0\ncpu0 100 0 0 100 0 0 0 0 0 0\ncpu1 100 0 0 100 0 0 0 0 0 0\n")
	write("sys/net/netfilter/nf_conntrack_count", "1200\n")
	write("sys/net/netfilter/nf_conntrack_max", "262144\n")

	s := NewSampler(root, nil)
	t0 := time.Unix(1_000_000, 0)
	r, err := s.Sample(t0)
	require.NoError(t, err)
	require.Empty(t, r.Cpu.CoreUsagePercent, "no per-core usage before a second sample")
	require.Len(t, r.NetworkInterfaces, 2)
	eth := r.NetworkInterfaces[1]
	require.Equal(t, "eth0", eth.Name)
	require.Equal(t, [6]uint64{100000, 50000, 1000, 400, 5, 3}, [6]uint64{eth.RxBytes, eth.TxBytes, eth.RxPackets, eth.TxPackets, eth.RxDropped, eth.TxDropped})
	require.Equal(t, [2]uint64{1200, 262144}, [2]uint64{r.ConntrackEntries, r.ConntrackMax})

	// cpu0 busy all of its 100 new jiffies, cpu1 a quarter of them.
	write("stat", "cpu  375 0 0 225 0 0 0 0 0 0\ncpu0 200 0 0 100 0 0 0 0 0 0\ncpu1 125 0 0 175 0 0 0 0 0 0\n")
	r, err = s.Sample(t0.Add(10 * time.Second))
	require.NoError(t, err)
	require.InDeltaSlice(t, []float64{100, 25}, r.Cpu.CoreUsagePercent, 1e-9)
	require.InDelta(t, 87.5, r.Cpu.UsagePercent, 1e-9)

	// Without connection tracking (no nf_conntrack module) both are 0.
	require.NoError(t, os.RemoveAll(filepath.Join(root, "sys")))
	r, err = s.Sample(t0.Add(20 * time.Second))
	require.NoError(t, err)
	require.Zero(t, r.ConntrackEntries)
	require.Zero(t, r.ConntrackMax)
}

func TestCoreUsage(t *testing.T) {
	for _, tc := range []struct {
		name      string
		prev, cur []coreTimes
		want      []float64
	}{
		{"first sample", nil, []coreTimes{{1, 2}}, nil},
		{"busy and idle", []coreTimes{{1, 2}, {1, 2}}, []coreTimes{{3, 4}, {1, 4}}, []float64{100, 0}},
		{"a core came online", []coreTimes{{1, 2}}, []coreTimes{{2, 4}, {5, 10}}, []float64{50, 0}},
		{"counters went back (no time passed)", []coreTimes{{5, 10}}, []coreTimes{{5, 10}}, []float64{0}},
	} {
		t.Run(tc.name, func(t *testing.T) { require.Equal(t, tc.want, coreUsage(tc.prev, tc.cur)) })
	}
}
