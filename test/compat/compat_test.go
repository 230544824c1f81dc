package compat

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/server/election"
	"github.com/nstance-dev/nstance/internal/storage"
	"github.com/nstance-dev/nstance/internal/testing/gcsemu"
	"github.com/nstance-dev/nstance/internal/testing/portpick"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
	"github.com/nstance-dev/nstance/internal/testing/toolbin"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/gcsstore"
	"github.com/nstance-dev/nstance/pkg/objstore/objstoretest"
	"github.com/nstance-dev/nstance/pkg/objstore/s3store"
)

// compatEnv set to 1 runs every store, building what is missing.
const compatEnv = "NSTANCE_COMPAT"

// server is a running store: NewBucket makes an empty bucket and returns a
// store over it.
type server interface {
	NewBucket(t *testing.T) objstore.Store
}

// backend is one column of the matrix.
type backend struct {
	name string
	tool toolbin.Tool
	// always runs it without NSTANCE_COMPAT (building it if needed);
	// cached runs it without NSTANCE_COMPAT when its build is cached.
	always, cached bool
	start          func(t *testing.T, bin string) server
	// probeRefuses, when not empty, is the reason the start-up probe
	// refuses this store (its error must contain it); the contract and the
	// election are then not run, as the server would not run on it.
	probeRefuses string
}

var backends = []backend{
	{name: "fake-gcs-server", tool: toolbin.FakeGCSServer, always: true, start: startFakeGCS},
	{name: "versitygw", tool: toolbin.VersityGW, cached: true, start: startVersity},
	{name: "seaweedfs", tool: toolbin.SeaweedFS, start: startSeaweed},
	{name: "minio", tool: toolbin.MinIO, start: startMinIO},
}

func TestCompat(t *testing.T) {
	root := proctest.Root(t)
	all := os.Getenv(compatEnv) == "1"
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			path, cached, err := toolbin.Cached(root, b.tool)
			require.NoError(t, err)
			switch {
			case all, b.always:
			case b.cached && cached:
			case b.cached:
				t.Skipf("%s is not built yet (%s); `make compat` builds it and runs every store", b.name, path)
			default:
				t.Skipf("%s runs only in `make compat` (%s=1): its build takes too long for `make test`", b.name, compatEnv)
			}
			bin := toolbin.Require(t, root, b.tool)
			srv := b.start(t, bin)
			runMatrix(t, srv, b)
		})
	}
}

func runMatrix(t *testing.T, srv server, b backend) {
	probed := t.Run("probe", func(t *testing.T) {
		s := srv.NewBucket(t)
		err := storage.ProbeConditionalWrites(context.Background(), s, "shard/s1/probe/compat-1")
		if b.probeRefuses != "" {
			require.ErrorIs(t, err, storage.ErrNoConditionalWrites)
			require.ErrorContains(t, err, b.probeRefuses)
			t.Logf("%s: the start-up probe refuses it: %v", b.name, err)
			return
		}
		require.NoError(t, err, "the start-up probe")
		_, err = s.Head(context.Background(), "shard/s1/probe/compat-1")
		require.ErrorIs(t, err, objstore.ErrNotFound, "the probe object is removed")
	})
	if !probed || b.probeRefuses != "" {
		return
	}
	t.Run("contract", func(t *testing.T) {
		objstoretest.Run(t, srv.NewBucket)
	})
	t.Run("election", func(t *testing.T) {
		testElection(t, srv.NewBucket(t))
	})
}

// cuttable fails every call while cut is set, like a network partition
// between one server and the store.
type cuttable struct {
	objstore.Store
	cut atomic.Bool
}

var errCut = errors.New("cut off from storage")

func (c *cuttable) Get(ctx context.Context, key string) (*objstore.Object, error) {
	if c.cut.Load() {
		return nil, errCut
	}
	return c.Store.Get(ctx, key)
}

func (c *cuttable) Head(ctx context.Context, key string) (*objstore.ObjectInfo, error) {
	if c.cut.Load() {
		return nil, errCut
	}
	return c.Store.Head(ctx, key)
}

func (c *cuttable) Put(ctx context.Context, key string, body []byte, o objstore.PutOptions) (string, error) {
	if c.cut.Load() {
		return "", errCut
	}
	return c.Store.Put(ctx, key, body, o)
}

func (c *cuttable) Delete(ctx context.Context, key string) error {
	if c.cut.Load() {
		return errCut
	}
	return c.Store.Delete(ctx, key)
}

func (c *cuttable) List(ctx context.Context, prefix string) ([]objstore.ObjectInfo, error) {
	if c.cut.Load() {
		return nil, errCut
	}
	return c.Store.List(ctx, prefix)
}

// terms records who leads when; overlap is the longest time two led at once.
type terms struct {
	mu      sync.Mutex
	leading map[string]time.Time // id -> since
	overlap time.Duration
	starts  int
}

func (tr *terms) begin(id string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.leading[id] = time.Now()
	tr.starts++
}

func (tr *terms) end(id string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	since := tr.leading[id]
	delete(tr.leading, id)
	for _, other := range tr.leading {
		// The other began while id still led: they overlapped from then.
		if other.After(since) {
			tr.overlap = max(tr.overlap, time.Since(other))
		}
	}
}

func (tr *terms) leader() (string, int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var id string
	for k := range tr.leading {
		id = k
	}
	return id, len(tr.leading)
}

// testElection runs two electors on one lease and cuts the leader off from
// storage twice: the other takes over each time, never while the cut-off
// one still acts (zero overlap), and exactly one leads at the end.
func testElection(t *testing.T, store objstore.Store) {
	const (
		lease = 3 * time.Second
		renew = 300 * time.Millisecond
		retry = 150 * time.Millisecond
	)
	tr := &terms{leading: map[string]time.Time{}}
	stores := map[string]*cuttable{}
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, id := range []string{"a", "b"} {
		cs := &cuttable{Store: store}
		stores[id] = cs
		e, err := election.New(election.Config{
			Store: cs, Key: "cluster/leader.json", ID: id, LeaseDuration: lease, RenewInterval: renew, RetryInterval: retry,
			Log: logr.Discard(),
			OnLeading: func(ctx context.Context, _ int64) {
				tr.begin(id)
				<-ctx.Done()
				tr.end(id)
			},
		})
		require.NoError(t, err)
		wg.Go(func() { _ = e.Run(ctx) })
	}
	oneLeader := func() string {
		var id string
		proctest.Eventually(t, "exactly one elector leads", 30*time.Second, func() bool {
			var n int
			id, n = tr.leader()
			return n == 1
		})
		return id
	}
	leader := oneLeader()
	for run := 1; run <= 2; run++ {
		other := map[string]string{"a": "b", "b": "a"}[leader]
		stores[leader].cut.Store(true)
		proctest.Eventually(t, fmt.Sprintf("run %d: %s takes over from %s", run, other, leader), 30*time.Second, func() bool {
			id, n := tr.leader()
			return n == 1 && id == other
		})
		stores[leader].cut.Store(false)
		tr.mu.Lock()
		ov := tr.overlap
		tr.mu.Unlock()
		t.Logf("run %d: %s cut off, %s leads; overlap %s", run, leader, other, ov)
		require.Zero(t, ov, "run %d: two electors led at once", run)
		leader = other
	}
	// Healed, the old leader stays a standby: one leader for a few renewals.
	deadline := time.Now().Add(3 * renew)
	for time.Now().Before(deadline) {
		id, n := tr.leader()
		require.Equal(t, 1, n)
		require.Equal(t, leader, id)
		time.Sleep(renew / 3)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	require.Zero(t, tr.overlap)
	require.Equal(t, 3, tr.starts, "one term per handover")
}

// gcsServer is fake-gcs-server.
type gcsServer struct{ emu *gcsemu.Server }

func startFakeGCS(t *testing.T, _ string) server { return gcsServer{gcsemu.Start(t)} }

func (g gcsServer) NewBucket(t *testing.T) objstore.Store {
	s, err := gcsstore.NewWithClient(g.emu.Client(t), g.emu.NewBucket(t), "")
	require.NoError(t, err)
	return s
}

// s3Server is an S3 endpoint with root credentials.
type s3Server struct {
	endpoint, access, secret string
	buckets                  *atomic.Int64
}

func (s s3Server) NewBucket(t *testing.T) objstore.Store {
	name := fmt.Sprintf("nstance-compat-%d", s.buckets.Add(1))
	client := devs3test.ClientWith(s.endpoint, s.access, s.secret)
	_, err := client.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(name)})
	require.NoError(t, err, "create bucket %s", name)
	st, err := s3store.NewWithClient(client, name, "")
	require.NoError(t, err)
	return st
}

// startS3 runs bin with args in its own process group and waits until
// addr's ListBuckets answers with the credentials.
func startS3(t *testing.T, name, bin, addr, access, secret string, env []string, args ...string) server {
	dir := t.TempDir()
	g := proctest.NewGroup(t, proctest.Options{Dir: dir, Grace: 10 * time.Second})
	p := g.MustStart(name, bin, env, args...)
	srv := s3Server{endpoint: "http://" + addr, access: access, secret: secret, buckets: &atomic.Int64{}}
	client := devs3test.ClientWith(srv.endpoint, access, secret)
	var last error
	if err := p.WaitFor(context.Background(), name+" answers S3 on "+addr, 120*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, last = client.ListBuckets(ctx, &s3.ListBucketsInput{})
		return last == nil
	}); err != nil {
		t.Fatalf("%v (last error: %v)", err, last)
	}
	return srv
}

func port(addr string) string { return addr[strings.LastIndex(addr, ":")+1:] }

// Versity Gateway over a POSIX directory; metadata in a sidecar directory
// so the file system needs no extended attributes.
func startVersity(t *testing.T, bin string) server {
	dir := t.TempDir()
	root, side := filepath.Join(dir, "root"), filepath.Join(dir, "meta")
	require.NoError(t, os.MkdirAll(root, 0o755))
	require.NoError(t, os.MkdirAll(side, 0o755))
	addr := portpick.Addr(t)
	return startS3(t, "versitygw", bin, addr, "compat", "compatsecret", nil,
		"--access", "compat", "--secret", "compatsecret", "--port", addr, "posix", "--sidecar", side, root)
}

// SeaweedFS: master, volume, filer and S3 in one `weed server`, every port
// on loopback, credentials from an S3 identities file.
func startSeaweed(t *testing.T, bin string) server {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "s3.json")
	require.NoError(t, os.WriteFile(cfg, []byte(`{"identities":[{"name":"compat","credentials":[{"accessKey":"compat","secretKey":"compatsecret"}],"actions":["Admin","Read","List","Tagging","Write"]}]}`), 0o600))
	data := filepath.Join(dir, "data")
	require.NoError(t, os.MkdirAll(data, 0o755))
	s3addr := portpick.Addr(t)
	master, volume, filer := portpick.Port(t), portpick.Port(t), portpick.Port(t)
	return startS3(t, "weed", bin, s3addr, "compat", "compatsecret", nil,
		"server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-dir="+data,
		fmt.Sprintf("-master.port=%d", master), fmt.Sprintf("-volume.port=%d", volume), fmt.Sprintf("-filer.port=%d", filer),
		"-master.volumeSizeLimitMB=64", "-volume.max=16",
		"-s3", "-s3.port="+port(s3addr), "-s3.config="+cfg)
}

// MinIO in single-drive mode.
func startMinIO(t *testing.T, bin string) server {
	dir := t.TempDir()
	addr, console := portpick.Addr(t), portpick.Addr(t)
	return startS3(t, "minio", bin, addr, "compat", "compatsecret",
		[]string{"MINIO_ROOT_USER=compat", "MINIO_ROOT_PASSWORD=compatsecret", "MINIO_BROWSER=off", "MINIO_UPDATE=off"},
		"server", "--quiet", "--address", addr, "--console-address", console, filepath.Join(dir, "data"))
}

// The overlap measure sees two terms that overlap, and not two that follow
// each other.
func TestTermsOverlap(t *testing.T) {
	tr := &terms{leading: map[string]time.Time{}}
	tr.begin("a")
	tr.end("a")
	tr.begin("b")
	require.Zero(t, tr.overlap, "a ended before b began")
	tr.begin("a")
	time.Sleep(time.Millisecond)
	tr.end("b")
	require.Positive(t, tr.overlap, "a began while b still led")
}
