package portpick

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Addr returns "127.0.0.1:<port>" for a port that is free now, that the
// kernel will not hand out by itself and that no other test using portpick
// gets until t ends.
func Addr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(Port(t)))
}

// Port is Addr's port number.
func Port(t testing.TB) int {
	t.Helper()
	p, release, err := pick()
	if err != nil {
		t.Fatalf("picking a loopback port: %v", err)
	}
	t.Cleanup(release)
	return p
}

// attempts bounds the search; each attempt is one random port.
const attempts = 500

func pick() (int, func(), error) {
	lo, hi, err := candidates(rangeFile)
	if err != nil {
		return 0, nil, err
	}
	return pickIn(lo, hi)
}

// pickIn picks a free, unlocked port in [lo, hi] and locks it.
func pickIn(lo, hi int) (int, func(), error) {
	dir := filepath.Join(os.TempDir(), "nstance-portpick")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return 0, nil, fmt.Errorf("lock directory: %w", err)
	}
	for i := 0; i < attempts; i++ {
		port := lo + rand.IntN(hi-lo+1)
		release, ok, err := lock(dir, port)
		if err != nil {
			return 0, nil, err
		}
		if !ok {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			release() // in use by something else on the machine
			continue
		}
		if err := l.Close(); err != nil {
			release()
			return 0, nil, fmt.Errorf("closing probe listener: %w", err)
		}
		return port, release, nil
	}
	return 0, nil, fmt.Errorf("no free port in %d-%d after %d attempts", lo, hi, attempts)
}

// lock takes the advisory lock of port; ok is false when another test
// holds it.
func lock(dir string, port int) (release func(), ok bool, err error) {
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, false, fmt.Errorf("lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("locking %s: %w", f.Name(), err)
	}
	// Closing the file drops the lock (so does the process exiting).
	return func() { _ = f.Close() }, true, nil
}

const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// minPort keeps picks above the well-known and commonly configured ports.
const minPort = 10000

// candidates returns the port range to pick from: below the kernel's
// ephemeral range when there is room for 1000 ports there, else above it.
func candidates(path string) (lo, hi int, err error) {
	elo, ehi := 32768, 60999 // the Linux default
	if b, err := os.ReadFile(path); err == nil {
		f := strings.Fields(string(b))
		if len(f) != 2 {
			return 0, 0, fmt.Errorf("%s: want two numbers, got %q", path, strings.TrimSpace(string(b)))
		}
		if elo, err = strconv.Atoi(f[0]); err != nil {
			return 0, 0, fmt.Errorf("%s: %w", path, err)
		}
		if ehi, err = strconv.Atoi(f[1]); err != nil {
			return 0, 0, fmt.Errorf("%s: %w", path, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return 0, 0, fmt.Errorf("reading the ephemeral port range: %w", err)
	}
	switch {
	case elo-minPort >= 1000:
		return minPort, elo - 1, nil
	case 65535-ehi >= 1000:
		return ehi + 1, 65535, nil
	default:
		return 0, 0, fmt.Errorf("the ephemeral port range %d-%d leaves fewer than 1000 ports outside it", elo, ehi)
	}
}
