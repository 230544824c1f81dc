// Package toolbin builds the third-party programs some tests run as
// processes (the GCS emulator, the S3 servers of the compatibility matrix)
// from their tools modules, scripts/tools/<name>, each pinned in its own
// go.mod so their dependencies stay out of the main module. A build is kept
// in the cache the Makefile uses for promtool and clusterctl
// (~/.cache/nstance/tools, or $XDG_CACHE_HOME/nstance/tools) under the name
// <name>-<first 16 hex digits of sha256(go.mod + go.sum)>, so a changed pin
// builds again and an unchanged one never does. Concurrent builds of one
// tool (test packages run in parallel) wait for each other on a lock file.
package toolbin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Tool is a program built from scripts/tools/<Name>.
type Tool struct {
	// Name is the tools module's directory and the binary's name.
	Name string
	// Main is the import path of its main package.
	Main string
}

// The tools tests run.
var (
	FakeGCSServer = Tool{Name: "fake-gcs-server", Main: "github.com/fsouza/fake-gcs-server"}
	VersityGW     = Tool{Name: "versitygw", Main: "github.com/versity/versitygw/cmd/versitygw"}
	SeaweedFS     = Tool{Name: "weed", Main: "github.com/seaweedfs/seaweedfs/weed"}
	MinIO         = Tool{Name: "minio", Main: "github.com/minio/minio"}
)

// CacheDir is where builds are kept: nstance/tools under the user's cache
// directory (os.UserCacheDir: $XDG_CACHE_HOME, else ~/.cache), as the
// Makefile's TOOLS_CACHE.
func CacheDir() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("cache directory: %w", err)
	}
	return filepath.Join(base, "nstance", "tools"), nil
}

// Path is where the build of tool for the tools module under root (the
// repository) is, or will be, cached.
func Path(root string, tool Tool) (string, error) {
	mod := filepath.Join(root, "scripts", "tools", tool.Name)
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(mod, f))
		if err != nil {
			return "", fmt.Errorf("tools module of %s: %w", tool.Name, err)
		}
		h.Write(b)
	}
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, tool.Name+"-"+hex.EncodeToString(h.Sum(nil))[:16]), nil
}

// Cached returns the cached build of tool and whether it exists.
func Cached(root string, tool Tool) (string, bool, error) {
	p, err := Path(root, tool)
	if err != nil {
		return "", false, err
	}
	st, err := os.Stat(p)
	return p, err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0, nil
}

// Build returns the cached build of tool, building it first (`nice go
// build -trimpath` in its tools module) when it is missing. The build's
// output is returned in the error when it fails.
func Build(ctx context.Context, root string, tool Tool) (string, error) {
	p, ok, err := Cached(root, tool)
	if err != nil || ok {
		return p, err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", fmt.Errorf("tools cache: %w", err)
	}
	unlock, err := lock(p + ".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, ok, _ := Cached(root, tool); ok { // built while this waited
		return p, nil
	}
	tmp := fmt.Sprintf("%s.tmp.%d", p, os.Getpid())
	args := []string{"build", "-trimpath", "-o", tmp, tool.Main}
	name := "go"
	if nice, err := exec.LookPath("nice"); err == nil {
		name, args = nice, append([]string{"-n", "15", "go"}, args...)
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = filepath.Join(root, "scripts", "tools", tool.Name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("go build %s in scripts/tools/%s: %w\n%s", tool.Main, tool.Name, err, out)
	}
	if err := os.Rename(tmp, p); err != nil {
		return "", fmt.Errorf("tools cache: %w", err)
	}
	fmt.Fprintf(os.Stderr, "toolbin: built %s in %s into %s\n", tool.Name, time.Since(start).Round(time.Second), p)
	return p, nil
}

// Require is Build for a test: a failed build fails it.
func Require(tb testing.TB, root string, tool Tool) string {
	tb.Helper()
	p, err := Build(context.Background(), root, tool)
	if err != nil {
		tb.Fatalf("building %s: %v", tool.Name, err)
	}
	return p
}

// lock takes an exclusive advisory lock on path, waiting for it.
func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { _ = f.Close() }, nil
}
