package status

import (
	"testing"

	"github.com/stretchr/testify/require"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func TestFigures(t *testing.T) {
	require.Nil(t, figures(nil), "no report yet")
	r := &nstancev1.HealthReport{
		Cpu:    &nstancev1.CpuStats{UsagePercent: 30, Load1: 0.5, CoreUsagePercent: []float64{10, 50}},
		Memory: &nstancev1.MemoryStats{TotalBytes: 1000, UsedBytes: 250},
		Disks:  []*nstancev1.DiskStats{{TotalBytes: 100, UsedBytes: 10}, {TotalBytes: 100, UsedBytes: 90}, {}},
		NetworkInterfaces: []*nstancev1.NetworkInterfaceStats{
			{Name: "eth0", RxBytes: 10, TxBytes: 20, RxDropped: 1, TxDropped: 2}, {Name: "lo", RxBytes: 5, TxBytes: 5},
		},
		Files: []*nstancev1.FileStatus{
			{Path: "a", State: nstancev1.FileState_FILE_STATE_OK}, {Path: "b", State: nstancev1.FileState_FILE_STATE_ERROR},
		},
		ConntrackEntries: 7, ConntrackMax: 70,
	}
	require.Equal(t, &Figures{CPUPercent: 30, CoreMaxPercent: 50, Load1: 0.5, MemoryPercent: 25, DiskPercent: 90,
		RxBytes: 15, TxBytes: 25, Dropped: 3, ConntrackEntries: 7, ConntrackMax: 70, Files: 2, FileErrors: 1}, figures(r))
	require.Equal(t, &Figures{}, figures(&nstancev1.HealthReport{}), "an empty report divides by nothing")
}
