package health

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func TestSampleRealProc(t *testing.T) {
	s := NewSampler("", []string{"/"})
	start := time.Now()
	r1, err := s.Sample(start)
	require.NoError(t, err)
	require.Greater(t, r1.Uptime.AsDuration(), time.Duration(0))
	require.Equal(t, uint32(runtime.NumCPU()), r1.Cpu.Cores)
	require.GreaterOrEqual(t, r1.Cpu.Load1, 0.0)
	require.Greater(t, r1.Memory.TotalBytes, uint64(0))
	require.Equal(t, r1.Memory.TotalBytes, r1.Memory.UsedBytes+r1.Memory.AvailableBytes)
	require.NotEmpty(t, r1.NetworkInterfaces)
	var lo bool
	for _, n := range r1.NetworkInterfaces {
		lo = lo || n.Name == "lo"
	}
	require.True(t, lo, "loopback interface reported")
	require.Len(t, r1.Disks, 1)
	require.Greater(t, r1.Disks[0].TotalBytes, uint64(0))
	require.LessOrEqual(t, r1.Disks[0].UsedBytes, r1.Disks[0].TotalBytes)

	// Burn CPU so the second sample sees busy time.
	deadline := time.Now().Add(300 * time.Millisecond)
	for x := 0; time.Now().Before(deadline); x++ {
		_ = x * x
	}
	r2, err := s.Sample(start.Add(30 * time.Second))
	require.NoError(t, err)
	require.Greater(t, r2.Cpu.UsagePercent, 0.0)
	require.LessOrEqual(t, r2.Cpu.UsagePercent, 100.0)
	require.GreaterOrEqual(t, r2.Uptime.AsDuration(), r1.Uptime.AsDuration())

	avg := s.Averages()
	require.Len(t, avg, 3)
	for _, a := range avg {
		require.Equal(t, 30*time.Second, a.Covered)
		require.Greater(t, a.CPUPercent, 0.0)
	}
}

func TestSampleFakeProcAndWindows(t *testing.T) {
	root := t.TempDir()
	write := func(name, content string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, name), []byte(content), 0o644))
	}
	write("uptime", "100.50 200.00\n")
	write("loadavg", "0.50 0.25 0.10 1/100 999\n")
	write("meminfo", "MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 400 kB\n")
	net := func(rx, tx int) string {
		return "Inter-|   Receive\n face |bytes packets errs drop fifo frame compressed multicast|bytes\n" +
			"  eth0: " + itoa(rx) + " 0 0 0 0 0 0 0 " + itoa(tx) + " 0 0 0 0 0 0 0\n"
	}
	stat := func(user, idle int) string {
		return "cpu  " + itoa(user) + " 0 0 " + itoa(idle) + " 0 0 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\ncpu1 1 0 0 1 0 0 0 0 0 0\n"
	}
	s := NewSampler(root, nil)
	t0 := time.Unix(1_000_000, 0)
	write("stat", stat(0, 0))
	write("net/dev", net(0, 0))
	r, err := s.Sample(t0)
	require.NoError(t, err)
	require.Equal(t, 100500*time.Millisecond, r.Uptime.AsDuration())
	require.Equal(t, &nstancev1.CpuStats{Load1: 0.5, Load5: 0.25, Load15: 0.1, Cores: 2}, r.Cpu)
	require.Equal(t, uint64(1000*1024), r.Memory.TotalBytes)
	require.Equal(t, uint64(600*1024), r.Memory.UsedBytes)
	// 20 minutes at 1 sample per minute: each minute 60 busy of 100 jiffies,
	// and 6000 bytes in, 600 out.
	for i := 1; i <= 20; i++ {
		busy := 60 * i
		if i > 15 {
			busy = 60*15 + 10*(i-15) // the last 5 minutes are quieter: 10%
		}
		write("stat", stat(busy, 100*i-busy))
		write("net/dev", net(6000*i, 600*i))
		r, err = s.Sample(t0.Add(time.Duration(i) * time.Minute))
		require.NoError(t, err)
	}
	require.InDelta(t, 10.0, r.Cpu.UsagePercent, 0.001)
	avg := s.Averages()
	require.Len(t, avg, 3)
	require.InDelta(t, 10.0, avg[0].CPUPercent, 0.001)
	require.InDelta(t, 10.0, avg[1].CPUPercent, 0.001)
	require.InDelta(t, (60.0*10+10*5)/15, avg[2].CPUPercent, 0.001)
	require.Equal(t, 15*time.Minute, avg[2].Covered)
	require.InDelta(t, 100.0, avg[1].RxBytesPerS, 0.001)
	require.InDelta(t, 10.0, avg[1].TxBytesPerS, 0.001)
	require.LessOrEqual(t, len(s.ring), 17, "old samples are dropped")
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestSampleErrors(t *testing.T) {
	root := t.TempDir()
	_, err := NewSampler(root, nil).Sample(time.Now())
	require.ErrorContains(t, err, "uptime")
	require.NoError(t, os.WriteFile(filepath.Join(root, "uptime"), []byte("x"), 0o644))
	_, err = NewSampler(root, nil).Sample(time.Now())
	require.ErrorContains(t, err, "parsing uptime")
	_, err = NewSampler("", []string{"/does/not/exist"}).Sample(time.Now())
	require.ErrorContains(t, err, "statfs /does/not/exist")
}

func TestReadTermination(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "term.json")
	n, err := ReadTermination(p)
	require.NoError(t, err)
	require.Nil(t, n)
	require.NoError(t, os.WriteFile(p, []byte(`{"kind":"spot","deadline":"2026-11-01T10:00:00Z","message":"reclaim"}`), 0o644))
	n, err = ReadTermination(p)
	require.NoError(t, err)
	require.Equal(t, nstancev1.TerminationKind_TERMINATION_KIND_SPOT, n.Kind)
	require.Equal(t, "reclaim", n.Message)
	require.Equal(t, time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC), n.Deadline.AsTime())
	require.NoError(t, os.WriteFile(p, []byte(`{"kind":"meteor"}`), 0o644))
	_, err = ReadTermination(p)
	require.ErrorContains(t, err, "unknown kind")
	require.NoError(t, os.WriteFile(p, []byte(`{`), 0o644))
	_, err = ReadTermination(p)
	require.Error(t, err)
}

func BenchmarkSample(b *testing.B) {
	s := NewSampler("", []string{"/"})
	now := time.Now()
	for b.Loop() {
		now = now.Add(time.Second)
		if _, err := s.Sample(now); err != nil {
			b.Fatal(err)
		}
	}
}
