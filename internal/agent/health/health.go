package health

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Windows are the averaging windows the sampler keeps.
var Windows = []time.Duration{time.Minute, 5 * time.Minute, 15 * time.Minute}

type point struct {
	at          time.Time
	busy, total uint64
	rx, tx      uint64
}

// Sampler reads machine figures. It is safe for concurrent use.
type Sampler struct {
	proc  string
	disks []string

	mu    sync.Mutex
	ring  []point
	cores []coreTimes // per-core times at the last sample
}

// NewSampler returns a sampler reading procRoot ("/proc" when empty) and
// reporting the filesystems mounted at disks.
func NewSampler(procRoot string, disks []string) *Sampler {
	if procRoot == "" {
		procRoot = "/proc"
	}
	return &Sampler{proc: procRoot, disks: disks}
}

// WindowStats are averages over one window.
type WindowStats struct {
	Window      time.Duration
	CPUPercent  float64
	RxBytesPerS float64
	TxBytesPerS float64
	Covered     time.Duration
}

// Sample takes a reading and returns the report figures (without files,
// termination notice or config hash).
func (s *Sampler) Sample(now time.Time) (*nstancev1.HealthReport, error) {
	r := &nstancev1.HealthReport{Timestamp: timestamppb.New(now)}
	up, err := s.uptime()
	if err != nil {
		return nil, err
	}
	r.Uptime = durationpb.New(up)
	busy, total, cores, err := s.cpu()
	if err != nil {
		return nil, err
	}
	cpu, err := s.load()
	if err != nil {
		return nil, err
	}
	cpu.Cores = cores
	r.Cpu = cpu
	if r.Memory, err = s.memory(); err != nil {
		return nil, err
	}
	if r.NetworkInterfaces, err = s.network(); err != nil {
		return nil, err
	}
	p, err := s.procFS()
	if err != nil {
		return nil, err
	}
	if err := addPackets(p, r.NetworkInterfaces); err != nil {
		return nil, err
	}
	perCore, err := coreTimesOf(p)
	if err != nil {
		return nil, err
	}
	if r.ConntrackEntries, r.ConntrackMax, err = conntrack(p); err != nil {
		return nil, err
	}
	var rx, tx uint64
	for _, n := range r.NetworkInterfaces {
		rx += n.RxBytes
		tx += n.TxBytes
	}
	for _, d := range s.disks {
		var st syscall.Statfs_t
		if err := syscall.Statfs(d, &st); err != nil {
			return nil, fmt.Errorf("health: statfs %s: %w", d, err)
		}
		bs := uint64(st.Bsize)
		r.Disks = append(r.Disks, &nstancev1.DiskStats{MountPoint: d, TotalBytes: st.Blocks * bs, UsedBytes: (st.Blocks - st.Bfree) * bs})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.ring); n > 0 {
		prev := s.ring[n-1]
		r.Cpu.UsagePercent = percent(busy-prev.busy, total-prev.total)
	}
	r.Cpu.CoreUsagePercent = coreUsage(s.cores, perCore)
	s.cores = perCore
	s.ring = append(s.ring, point{at: now, busy: busy, total: total, rx: rx, tx: tx})
	// Keep one point older than the longest window.
	cut := 0
	for cut < len(s.ring)-1 && now.Sub(s.ring[cut+1].at) >= Windows[len(Windows)-1] {
		cut++
	}
	s.ring = append(s.ring[:0], s.ring[cut:]...)
	return r, nil
}

func percent(busy, total uint64) float64 {
	if total == 0 || busy > total {
		return 0
	}
	return float64(busy) * 100 / float64(total)
}

// Averages returns CPU usage and network throughput over each of Windows,
// from the samples taken so far (Covered tells how much history was available).
func (s *Sampler) Averages() []WindowStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]WindowStats, 0, len(Windows))
	if len(s.ring) < 2 {
		return out
	}
	last := s.ring[len(s.ring)-1]
	for _, w := range Windows {
		first := s.ring[0]
		for _, p := range s.ring {
			if last.at.Sub(p.at) <= w {
				first = p
				break
			}
		}
		span := last.at.Sub(first.at)
		ws := WindowStats{Window: w, Covered: span, CPUPercent: percent(last.busy-first.busy, last.total-first.total)}
		if secs := span.Seconds(); secs > 0 {
			ws.RxBytesPerS = float64(last.rx-first.rx) / secs
			ws.TxBytesPerS = float64(last.tx-first.tx) / secs
		}
		out = append(out, ws)
	}
	return out
}

func (s *Sampler) read(name string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(s.proc, name))
	if err != nil {
		return nil, fmt.Errorf("health: %w", err)
	}
	return b, nil
}

func (s *Sampler) uptime() (time.Duration, error) {
	b, err := s.read("uptime")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 0, errors.New("health: /proc/uptime is empty")
	}
	secs, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("health: parsing uptime %q: %w", f[0], err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

func (s *Sampler) load() (*nstancev1.CpuStats, error) {
	b, err := s.read("loadavg")
	if err != nil {
		return nil, err
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return nil, fmt.Errorf("health: loadavg %q has fewer than 3 fields", b)
	}
	var v [3]float64
	for i := range v {
		if v[i], err = strconv.ParseFloat(f[i], 64); err != nil {
			return nil, fmt.Errorf("health: parsing loadavg: %w", err)
		}
	}
	return &nstancev1.CpuStats{Load1: v[0], Load5: v[1], Load15: v[2]}, nil
}

// cpu returns busy and total jiffies over all cores, and the core count.
func (s *Sampler) cpu() (busy, total uint64, cores uint32, err error) {
	b, err := s.read("stat")
	if err != nil {
		return 0, 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	found := false
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if f[0] == "cpu" {
			if len(f) < 5 {
				return 0, 0, 0, errors.New("health: short cpu line in /proc/stat")
			}
			for i, v := range f[1:] {
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return 0, 0, 0, fmt.Errorf("health: parsing /proc/stat: %w", err)
				}
				// guest and guest_nice (fields 9, 10) are already in user/nice.
				if i >= 8 {
					continue
				}
				total += n
				if i != 3 && i != 4 { // idle, iowait
					busy += n
				}
			}
			found = true
		} else if strings.HasPrefix(f[0], "cpu") {
			cores++
		}
	}
	if !found {
		return 0, 0, 0, errors.New("health: no cpu line in /proc/stat")
	}
	return busy, total, cores, nil
}

func (s *Sampler) memory() (*nstancev1.MemoryStats, error) {
	b, err := s.read("meminfo")
	if err != nil {
		return nil, err
	}
	vals := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && f[1] == "kB" {
			n *= 1024
		}
		vals[k] = n
	}
	total, ok := vals["MemTotal"]
	if !ok {
		return nil, errors.New("health: MemTotal missing from /proc/meminfo")
	}
	avail, ok := vals["MemAvailable"]
	if !ok {
		avail = vals["MemFree"] + vals["Buffers"] + vals["Cached"]
	}
	if avail > total {
		avail = total
	}
	return &nstancev1.MemoryStats{TotalBytes: total, AvailableBytes: avail, UsedBytes: total - avail}, nil
}

func (s *Sampler) network() ([]*nstancev1.NetworkInterfaceStats, error) {
	b, err := s.read("net/dev")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var out []*nstancev1.NetworkInterfaceStats
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 9 {
			continue
		}
		rx, err1 := strconv.ParseUint(f[0], 10, 64)
		tx, err2 := strconv.ParseUint(f[8], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("health: parsing net/dev line for %s", strings.TrimSpace(name))
		}
		out = append(out, &nstancev1.NetworkInterfaceStats{Name: strings.TrimSpace(name), RxBytes: rx, TxBytes: tx})
	}
	return out, nil
}

// terminationFile is the JSON form of a termination notice file.
type terminationFile struct {
	Kind     string    `json:"kind"`
	Deadline time.Time `json:"deadline"`
	Message  string    `json:"message"`
}

// ReadTermination reads a termination notice from path: JSON
// {"kind": "spot"|"maintenance"|"shutdown", "deadline": RFC 3339, "message": ...}.
// A missing file means no notice (nil, nil).
func ReadTermination(path string) (*nstancev1.TerminationNotice, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("health: reading termination notice: %w", err)
	}
	if len(b) > 64<<10 {
		return nil, fmt.Errorf("health: termination notice %s is larger than 64 KiB", path)
	}
	var tf terminationFile
	if err := json.Unmarshal(b, &tf); err != nil {
		return nil, fmt.Errorf("health: termination notice %s: %w", path, err)
	}
	kinds := map[string]nstancev1.TerminationKind{
		"spot": nstancev1.TerminationKind_TERMINATION_KIND_SPOT, "maintenance": nstancev1.TerminationKind_TERMINATION_KIND_MAINTENANCE,
		"shutdown": nstancev1.TerminationKind_TERMINATION_KIND_SHUTDOWN,
	}
	k, ok := kinds[strings.ToLower(tf.Kind)]
	if !ok {
		return nil, fmt.Errorf("health: termination notice %s: unknown kind %q", path, tf.Kind)
	}
	n := &nstancev1.TerminationNotice{Kind: k, Message: tf.Message}
	if !tf.Deadline.IsZero() {
		n.Deadline = timestamppb.New(tf.Deadline)
	}
	return n, nil
}
