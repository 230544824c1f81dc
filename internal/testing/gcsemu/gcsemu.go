// Package gcsemu runs fake-gcs-server (github.com/fsouza/fake-gcs-server,
// pinned in scripts/tools/fake-gcs-server and built through toolbin) as a
// process on a loopback port for tests of the GCS object store: plain HTTP,
// objects in memory, stopped at the test's cleanup by its PID.
package gcsemu

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/option"

	"github.com/nstance-dev/nstance/internal/testing/portpick"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
	"github.com/nstance-dev/nstance/internal/testing/toolbin"
)

// Server is a running emulator.
type Server struct {
	// Addr is host:port; URL is http://Addr.
	Addr, URL string
	// Proc is the emulator process.
	Proc *proctest.Proc

	buckets atomic.Int64
}

// Start builds (once, cached) and starts fake-gcs-server; it is stopped when
// t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	root := proctest.Root(t)
	bin := toolbin.Require(t, root, toolbin.FakeGCSServer)
	dir := t.TempDir()
	g := proctest.NewGroup(t, proctest.Options{Dir: dir, Grace: 5 * time.Second})
	addr := portpick.Addr(t)
	port := addr[strings.LastIndex(addr, ":")+1:]
	// The emulator routes by the Host header, matching its public host;
	// without a port it matches 127.0.0.1 on any port, so clients may reach
	// it through proxies on other ports of 127.0.0.1 (test/chaos).
	p := g.MustStart("fake-gcs-server", bin, nil,
		"-scheme", "http", "-host", "127.0.0.1", "-port", port, "-backend", "memory",
		"-external-url", "http://"+addr, "-public-host", "127.0.0.1", "-log-level", "warn")
	if err := p.WaitFor(context.Background(), "fake-gcs-server listening on "+addr, 30*time.Second, func() bool {
		return proctest.HTTPOK("http://" + addr + "/storage/v1/b")
	}); err != nil {
		t.Fatal(err)
	}
	return &Server{Addr: addr, URL: "http://" + addr, Proc: p}
}

// ClientOptions point a storage client at the emulator, without credentials.
func (s *Server) ClientOptions() []option.ClientOption {
	return []option.ClientOption{option.WithEndpoint(s.URL + "/storage/v1/"), option.WithoutAuthentication()}
}

// Client returns a storage client of the emulator, closed when t ends.
func (s *Server) Client(t testing.TB) *storage.Client {
	t.Helper()
	c, err := storage.NewClient(context.Background(), s.ClientOptions()...)
	if err != nil {
		t.Fatalf("storage client for %s: %v", s.URL, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// NewBucket creates an empty bucket with a fresh name and returns the name.
func (s *Server) NewBucket(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("nstance-test-%d", s.buckets.Add(1))
	if err := s.Client(t).Bucket(name).Create(context.Background(), "test-project", nil); err != nil {
		t.Fatalf("create bucket %s: %v", name, err)
	}
	return name
}
