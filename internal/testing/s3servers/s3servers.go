// Package s3servers starts the third-party S3 implementations of the
// storage compatibility matrix (Versity Gateway, SeaweedFS, MinIO), each
// built from its pinned tools module by toolbin and run as its own process
// on loopback with root credentials, for test/compat (the objstore contract
// and in-process electors) and test/chaos (nstance-server processes). Gate
// says which of them a test run includes: `make compat` (NSTANCE_COMPAT=1)
// runs every one, `make test` only those marked InMakeTest whose build is
// already cached.
package s3servers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/nstance-dev/nstance/internal/testing/portpick"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
	"github.com/nstance-dev/nstance/internal/testing/toolbin"
	"github.com/nstance-dev/nstance/pkg/objstore/s3store"
)

// CompatEnv set to 1 runs every store, building what is missing.
const CompatEnv = "NSTANCE_COMPAT"

// Server is a running S3 server.
type Server struct {
	// Name is its Kind's name.
	Name string
	// Addr is host:port on loopback; Endpoint is http://Addr.
	Addr, Endpoint string
	// Access and Secret are its root credentials.
	Access, Secret string

	buckets *atomic.Int64
}

// Client is an SDK client of the server at endpoint (http://host:port: the
// server's own, or a proxy in front of it) with its root credentials and
// path-style addressing.
func (s *Server) Client(endpoint string) *s3.Client {
	return s3.New(s3.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider(s.Access, s.Secret, ""),
		UsePathStyle: true,
		DisableLogOutputChecksumValidationSkipped: true,
	})
}

// Env is the environment of a process (nstance-server, nstance-admin) that
// reaches the server at endpoint with s3store's defaults.
func (s *Server) Env(endpoint string) []string {
	return []string{"NSTANCE_STORAGE=s3", "AWS_ACCESS_KEY_ID=" + s.Access, "AWS_SECRET_ACCESS_KEY=" + s.Secret,
		"AWS_REGION=us-east-1", "AWS_ENDPOINT_URL=" + endpoint, "AWS_S3_USE_PATH_STYLE=true"}
}

// NewBucket creates an empty bucket with a fresh name and returns the name.
func (s *Server) NewBucket(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("nstance-%s-%d", s.Name, s.buckets.Add(1))
	if _, err := s.Client(s.Endpoint).CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatalf("create bucket %s on %s: %v", name, s.Name, err)
	}
	return name
}

// Store is s3store over bucket, reached directly.
func (s *Server) Store(t testing.TB, bucket string) *s3store.Store {
	t.Helper()
	st, err := s3store.NewWithClient(s.Client(s.Endpoint), bucket, "")
	if err != nil {
		t.Fatalf("s3store over %s on %s: %v", bucket, s.Name, err)
	}
	return st
}

// Kind is one S3 implementation.
type Kind struct {
	Name string
	Tool toolbin.Tool
	// InMakeTest runs it without NSTANCE_COMPAT when its build is cached.
	InMakeTest bool
	// Start starts the program bin (its build) until the test ends.
	Start func(t testing.TB, bin string) *Server
}

// The implementations, in the order of the matrix.
var (
	Versity   = Kind{Name: "versitygw", Tool: toolbin.VersityGW, InMakeTest: true, Start: startVersity}
	SeaweedFS = Kind{Name: "seaweedfs", Tool: toolbin.SeaweedFS, Start: startSeaweed}
	MinIO     = Kind{Name: "minio", Tool: toolbin.MinIO, Start: startMinIO}
	All       = []Kind{Versity, SeaweedFS, MinIO}
)

// Gate decides whether a test runs a store: every one with compat
// (NSTANCE_COMPAT=1), always ones in any case, inMakeTest ones when their
// build is cached. When it does not run, skip says why.
func Gate(compat, always, inMakeTest, cached bool, name, path string) (run bool, skip string) {
	switch {
	case compat, always, inMakeTest && cached:
		return true, ""
	case inMakeTest:
		return false, fmt.Sprintf("%s is not built yet (%s); `make compat` builds it and runs every store", name, path)
	default:
		return false, fmt.Sprintf("%s runs only in `make compat` (%s=1): its build takes too long for `make test`", name, CompatEnv)
	}
}

// Require returns the build of tool for a test, building it when Gate lets
// the test run it, or skips the test saying why.
func Require(t testing.TB, tool toolbin.Tool, name string, always, inMakeTest bool) string {
	t.Helper()
	root := proctest.Root(t)
	path, cached, err := toolbin.Cached(root, tool)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if run, skip := Gate(os.Getenv(CompatEnv) == "1", always, inMakeTest, cached, name, path); !run {
		t.Skip(skip)
	}
	return toolbin.Require(t, root, tool)
}

// Run starts k for a test when Gate lets it (see Require), else skips.
func (k Kind) Run(t testing.TB) *Server {
	t.Helper()
	return k.Start(t, Require(t, k.Tool, k.Name, false, k.InMakeTest))
}

// start runs bin with args in its own process group and waits until addr
// answers ListBuckets with the credentials.
func start(t testing.TB, name, bin, addr, access, secret string, env []string, args ...string) *Server {
	t.Helper()
	g := proctest.NewGroup(t, proctest.Options{Dir: t.TempDir(), Grace: 10 * time.Second})
	p := g.MustStart(name, bin, env, args...)
	srv := &Server{Name: name, Addr: addr, Endpoint: "http://" + addr, Access: access, Secret: secret, buckets: &atomic.Int64{}}
	client := srv.Client(srv.Endpoint)
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

func mkdirs(t testing.TB, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// Versity Gateway over a POSIX directory; metadata in a sidecar directory
// so the file system needs no extended attributes.
func startVersity(t testing.TB, bin string) *Server {
	dir := t.TempDir()
	root, side := filepath.Join(dir, "root"), filepath.Join(dir, "meta")
	mkdirs(t, root, side)
	addr := portpick.Addr(t)
	return start(t, "versitygw", bin, addr, "compat", "compatsecret", nil,
		"--access", "compat", "--secret", "compatsecret", "--port", addr, "posix", "--sidecar", side, root)
}

// SeaweedFS: master, volume, filer and S3 in one `weed server`, every port
// (HTTP and gRPC) picked on loopback, the Iceberg and Lance servers and
// telemetry off, credentials from an S3 identities file. Every bucket is a
// collection that grows 7 volumes at its first large write, hence room for
// 256 volumes (sparse files of at most 64 MiB).
func startSeaweed(t testing.TB, bin string) *Server {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "s3.json")
	if err := os.WriteFile(cfg, []byte(`{"identities":[{"name":"compat","credentials":[{"accessKey":"compat","secretKey":"compatsecret"}],"actions":["Admin","Read","List","Tagging","Write"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	mkdirs(t, data)
	s3addr := portpick.Addr(t)
	args := []string{"server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-dir=" + data,
		"-master.volumeSizeLimitMB=64", "-volume.max=256", "-master.telemetry=false",
		"-s3", "-s3.port=" + port(s3addr), "-s3.config=" + cfg, "-s3.port.iceberg=0", "-s3.port.lance=0"}
	for _, p := range []string{"master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc", "s3.port.grpc"} {
		args = append(args, fmt.Sprintf("-%s=%d", p, portpick.Port(t)))
	}
	return start(t, "seaweedfs", bin, s3addr, "compat", "compatsecret", nil, args...)
}

// MinIO in single-drive mode.
func startMinIO(t testing.TB, bin string) *Server {
	dir := t.TempDir()
	addr, console := portpick.Addr(t), portpick.Addr(t)
	return start(t, "minio", bin, addr, "compat", "compatsecret",
		[]string{"MINIO_ROOT_USER=compat", "MINIO_ROOT_PASSWORD=compatsecret", "MINIO_BROWSER=off", "MINIO_UPDATE=off"},
		"server", "--quiet", "--address", addr, "--console-address", console, filepath.Join(dir, "data"))
}
