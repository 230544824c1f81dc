package portpick

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCandidates(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, strconv.Itoa(len(s))+"range")
		require.NoError(t, os.WriteFile(p, []byte(s), 0o600))
		return p
	}
	for _, tc := range []struct {
		name, content string
		lo, hi        int
		err           string
	}{
		{"linux default", "32768\t60999\n", 10000, 32767, ""},
		{"low range", "1024 50000\n", 50001, 65535, ""},
		{"whole range", "1024 65000\n", 0, 0, "leaves fewer than 1000"},
		{"garbage", "lots\n", 0, 0, "want two numbers"},
		{"not a number", "a 6\n", 0, 0, "invalid syntax"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lo, hi, err := candidates(write(tc.content))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, [2]int{tc.lo, tc.hi}, [2]int{lo, hi})
		})
	}
	lo, hi, err := candidates(filepath.Join(dir, "missing"))
	require.NoError(t, err)
	require.Equal(t, [2]int{10000, 32767}, [2]int{lo, hi})
}

// Ports are outside the ephemeral range, bindable, and distinct while held;
// a held port's lock refuses a second taker until the test ends.
func TestPortsAreHeldUntilTheTestEnds(t *testing.T) {
	lo, hi, err := candidates(rangeFile)
	require.NoError(t, err)
	seen := map[int]bool{}
	for i := 0; i < 50; i++ {
		p := Port(t)
		require.False(t, seen[p], "port %d handed out twice", p)
		seen[p] = true
		require.GreaterOrEqual(t, p, lo)
		require.LessOrEqual(t, p, hi)
		_, ok, err := lock(filepath.Join(os.TempDir(), "nstance-portpick"), p)
		require.NoError(t, err)
		require.False(t, ok, "the lock of port %d was free while held", p)
	}
	l, err := net.Listen("tcp", Addr(t))
	require.NoError(t, err)
	require.NoError(t, l.Close())
}

// A port something else listens on is never handed out, locked or not.
func TestBusyPortIsSkipped(t *testing.T) {
	p, release, err := pick()
	require.NoError(t, err)
	// Listen before letting the lock go, so no other test takes the port
	// in between.
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	require.NoError(t, err)
	release()
	_, _, err = pickIn(p, p)
	require.ErrorContains(t, err, "no free port")
	require.NoError(t, l.Close())
	q, release, err := pickIn(p, p)
	require.NoError(t, err)
	require.Equal(t, p, q)
	release()
}
