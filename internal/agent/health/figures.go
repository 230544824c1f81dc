package health

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/prometheus/procfs"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// coreTimes is one core's busy and total CPU time (seconds) at a reading.
type coreTimes struct{ busy, total float64 }

// procFS opens the proc tree the sampler reads (procfs only checks that
// the directory exists).
func (s *Sampler) procFS() (procfs.FS, error) {
	p, err := procfs.NewFS(s.proc)
	if err != nil {
		return procfs.FS{}, fmt.Errorf("health: opening %s: %w", s.proc, err)
	}
	return p, nil
}

// coreTimesOf reads each core's busy and total time from stat, indexed by core
// number (a core missing from the file, offline, stays zero).
func coreTimesOf(p procfs.FS) ([]coreTimes, error) {
	st, err := p.Stat()
	if err != nil {
		return nil, fmt.Errorf("health: per-core CPU: %w", err)
	}
	var out []coreTimes
	for id, c := range st.CPU {
		if id < 0 {
			continue
		}
		for int64(len(out)) <= id {
			out = append(out, coreTimes{})
		}
		// guest and guest_nice are already in user and nice.
		total := c.User + c.Nice + c.System + c.Idle + c.Iowait + c.IRQ + c.SoftIRQ + c.Steal
		out[id] = coreTimes{busy: total - c.Idle - c.Iowait, total: total}
	}
	return out, nil
}

// coreUsage is each core's busy share between two readings, from 0 to
// 100 (0 for a core without time passed or missing from prev).
func coreUsage(prev, cur []coreTimes) []float64 {
	if len(prev) == 0 {
		return nil
	}
	out := make([]float64, len(cur))
	for i, c := range cur {
		if i >= len(prev) {
			continue
		}
		busy, total := c.busy-prev[i].busy, c.total-prev[i].total
		if total > 0 && busy >= 0 && busy <= total {
			out[i] = busy * 100 / total
		}
	}
	return out
}

// addPackets fills packets and drops into the interfaces of net/dev.
func addPackets(p procfs.FS, ifs []*nstancev1.NetworkInterfaceStats) error {
	if len(ifs) == 0 {
		return nil
	}
	nd, err := p.NetDev()
	if err != nil {
		return fmt.Errorf("health: network packets: %w", err)
	}
	for _, n := range ifs {
		if l, ok := nd[n.Name]; ok {
			n.RxPackets, n.TxPackets, n.RxDropped, n.TxDropped = l.RxPackets, l.TxPackets, l.RxDropped, l.TxDropped
		}
	}
	return nil
}

// conntrack reads the connection tracking table's use and size; both 0
// when the kernel tracks no connections (no nf_conntrack module).
func conntrack(p procfs.FS) (entries, size uint64, err error) {
	read := func(name string) (uint64, error) {
		v, err := p.SysctlInts("net.netfilter." + name)
		if errors.Is(err, fs.ErrNotExist) {
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("health: conntrack %s: %w", name, err)
		}
		if len(v) != 1 || v[0] < 0 {
			return 0, fmt.Errorf("health: conntrack %s: want one count, got %v", name, v)
		}
		return uint64(v[0]), nil
	}
	if entries, err = read("nf_conntrack_count"); err != nil {
		return 0, 0, err
	}
	if size, err = read("nf_conntrack_max"); err != nil {
		return 0, 0, err
	}
	return entries, size, nil
}
