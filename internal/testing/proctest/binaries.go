package proctest

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// Binaries builds the repository's commands once per test binary into one
// temporary directory. A suite keeps one (a package variable) and removes
// its directory when the test binary ends: `os.Exit(bins.Main(m))` in
// TestMain. The zero value is ready to use.
type Binaries struct {
	mu    sync.Mutex
	dir   string
	built map[string]bool
	err   error // a failed build: later calls fail the same way
}

// Build compiles the commands among names not built yet (one `go build`)
// and returns the directory holding them all.
func (b *Binaries) Build(names ...string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return "", b.err
	}
	var missing []string
	for _, n := range names {
		if !b.built[n] {
			missing = append(missing, n)
		}
	}
	if len(missing) == 0 && b.dir != "" {
		return b.dir, nil
	}
	if b.dir == "" {
		dir, err := os.MkdirTemp("", "nstance-test-bin-")
		if err != nil {
			return "", fmt.Errorf("directory for the test binaries: %w", err)
		}
		b.dir, b.built = dir, map[string]bool{}
	}
	if len(missing) == 0 {
		return b.dir, nil
	}
	root, err := RepoRoot()
	if err == nil {
		err = Build(root, b.dir, missing...)
	}
	if err != nil {
		b.err = err
		return "", err
	}
	for _, n := range missing {
		b.built[n] = true
	}
	return b.dir, nil
}

// Dir is Build that fails the test on an error.
func (b *Binaries) Dir(tb testing.TB, names ...string) string {
	tb.Helper()
	dir, err := b.Build(names...)
	if err != nil {
		tb.Fatal(err)
	}
	return dir
}

// Remove deletes the directory of the built binaries.
func (b *Binaries) Remove() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dir == "" {
		return nil
	}
	if err := os.RemoveAll(b.dir); err != nil {
		return fmt.Errorf("removing the test binaries: %w", err)
	}
	b.dir, b.built = "", nil
	return nil
}

// Main runs the tests and then removes the built binaries; TestMain passes
// its result to os.Exit.
func (b *Binaries) Main(m *testing.M) int {
	code := m.Run()
	if err := b.Remove(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	return code
}
