package chaos

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"

	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/operator/bootstrap"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/s3store"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const (
	clusterID     = "chaos"
	shard         = "c1"
	encryptionKey = "thisisatest32bytekey123456789012"
)

// bins holds the binaries of the suite, built once per test binary.
var bins proctest.Binaries

// binaries builds nstance-server, nstance-admin and nstance-agent once per
// test binary and returns their directory.
func binaries(t testing.TB) string {
	t.Helper()
	return bins.Dir(t, "nstance-server", "nstance-admin", "nstance-agent")
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(fleetEnv); spec != "" {
		os.Exit(runFleet(spec))
	}
	os.Exit(bins.Main(m))
}

// loopbackNet picks 127.X.Y.0/24 for one test: its hosts .1, .2, ... bind
// the standard ports without colliding with anything else on the machine.
func loopbackNet(t testing.TB) string {
	n, err := rand.Int(rand.Reader, big.NewInt(200*250))
	require.NoError(t, err)
	v := int(n.Int64())
	return fmt.Sprintf("127.%d.%d.", 20+v/250, 1+v%250)
}

// proxy forwards TCP to target. While blackholed it accepts connections and
// reads from both sides but forwards nothing, like a partition that drops
// packets; lifting the blackhole closes the connections it broke.
type proxy struct {
	ln        net.Listener
	target    string
	blackhole atomic.Bool

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startProxy(t testing.TB, listen, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	require.NoError(t, err)
	return startProxyOn(t, ln, target)
}

// startProxyOn is startProxy on a listener the caller opened.
func startProxyOn(t testing.TB, ln net.Listener, target string) *proxy {
	t.Helper()
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.closeAll()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) Addr() string { return p.ln.Addr().String() }

func (p *proxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns[c] = struct{}{}
	p.mu.Unlock()
}

func (p *proxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.track(c)
		p.track(up)
		p.wg.Add(2)
		go p.pipe(up, c)
		go p.pipe(c, up)
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.blackhole.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Cut starts dropping everything; Heal stops it and resets the connections
// whose streams lost bytes.
func (p *proxy) Cut()  { p.blackhole.Store(true) }
func (p *proxy) Heal() { p.blackhole.Store(false); p.closeAll() }

// server is one nstance-server child process with its own loopback address.
type server struct {
	id, host string
	proc     *proctest.Proc // the current run (launch replaces it)
	log      string
	proxy    *proxy
}

func (s *server) addr(port int) string { return net.JoinHostPort(s.host, strconv.Itoa(port)) }

// Operator is the server's Operator API address.
func (s *server) Operator() string { return s.addr(8993) }

// Registration is the server's Registration API address.
func (s *server) Registration() string { return s.addr(8992) }

func (s *server) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, s.proc.Signal(sig))
}

// stack is dev-s3 (in-process) and nstance-servers of one shard, each
// reaching storage through its own proxy.
type stack struct {
	t        testing.TB
	extraEnv []string
	bin      string
	dir      string
	net      string
	s3URL    string
	// objects, when set, is the store the servers use instead of dev-s3
	// (s3URL is then http:// and its address).
	objects *objects
	servers []*server
	// procs are the servers' processes, killed when the test ends; each
	// gets its whole environment from env.
	procs *proctest.Group
}

// leaseConfig is the shard config with short leases: lease 3s, renew 1s,
// renew deadline 2s, clock-skew allowance 500ms.
func leaseConfig() string {
	return fmt.Sprintf(`{
  "cluster": {
    "id": %q,
    "leader_election": {"lease_duration": "3s", "renew_interval": "1s", "renew_deadline": "2s", "max_clock_skew": "500ms", "retry_interval": "200ms"}
  },
  "shard": {
    "id": %q,
    "infra": {"provider": "mock", "region": "dev", "zone": "deva"},
    "bind": {
      "health_addr": "0.0.0.0:8990", "election_addr": "0.0.0.0:8991", "registration_addr": "0.0.0.0:8992",
      "operator_addr": "0.0.0.0:8993", "agent_addr": "0.0.0.0:8994"
    }
  }
}`, clusterID, shard)
}

func newStack(t testing.TB, servers int) *stack {
	return newStackWith(t, servers, leaseConfig(), nil)
}

// newStackWith starts servers on the shard config cfg; extraEnv is added to
// every server's environment (and so to the processes it starts).
func newStackWith(t testing.TB, servers int, cfg string, extraEnv []string) *stack {
	t.Helper()
	s := newEmptyStack(t)
	s.extraEnv = extraEnv
	s3 := devs3test.Start(t, filepath.Join(s.dir, "dev-s3"))
	s.s3URL = s3.URL
	_, err := devs3test.Client(s3.URL).PutObject(context.Background(), putInput("config/"+shard+".jsonc", []byte(cfg)))
	require.NoError(t, err)
	for i := 1; i <= servers; i++ {
		s.startServer(fmt.Sprintf("srv-%d", i), s.net+strconv.Itoa(i))
	}
	return s
}

// newEmptyStack is a stack without storage or servers yet.
func newEmptyStack(t testing.TB) *stack {
	return &stack{t: t, bin: binaries(t), dir: t.TempDir(), net: loopbackNet(t)}
}

// objects is an object store other than dev-s3 for a stack.
type objects struct {
	// addr is the store's host:port (the proxies forward to it); bucket
	// the bucket the servers use.
	addr, bucket string
	// env is the environment of a process reaching the store at endpoint
	// (http://host:port), storage kind included.
	env func(endpoint string) []string
	// direct is the store for the test itself.
	direct objstore.Store
}

// newStackOn starts servers on the shard config cfg over o (newStackWith
// for a store that is not dev-s3).
func newStackOn(t testing.TB, servers int, cfg string, o *objects) *stack {
	t.Helper()
	s := newEmptyStack(t)
	s.objects, s.s3URL = o, "http://"+o.addr
	_, err := o.direct.Put(context.Background(), "config/"+shard+".jsonc", []byte(cfg), objstore.PutOptions{})
	require.NoError(t, err, "put the shard config")
	for i := 1; i <= servers; i++ {
		s.startServer(fmt.Sprintf("srv-%d", i), s.net+strconv.Itoa(i))
	}
	return s
}

// bucket is the servers' bucket.
func (s *stack) bucket() string {
	if s.objects != nil {
		return s.objects.bucket
	}
	return devs3test.Bucket
}

// store is the servers' object store, reached directly.
func (s *stack) store() objstore.Store {
	if s.objects != nil {
		return s.objects.direct
	}
	st, err := s3store.NewWithClient(devs3test.Client(s.s3URL), devs3test.Bucket, "")
	require.NoError(s.t, err)
	return st
}

// env is the environment of a child process that reaches the store at
// endpoint, followed by the stack's extraEnv.
func (s *stack) env(endpoint string) []string {
	storeEnv := proctest.S3Env(endpoint)
	if s.objects != nil {
		storeEnv = s.objects.env(endpoint)
	}
	return append(append(append(os.Environ(), storeEnv...), "NSTANCE_ENCRYPTION_KEY="+encryptionKey), s.extraEnv...)
}

// startServer starts nstance-server id on its own loopback host, reaching
// the store through a new proxy; the process is killed when the test ends.
func (s *stack) startServer(id, host string) *server {
	t := s.t
	t.Helper()
	u := strings.TrimPrefix(s.s3URL, "http://")
	listen := net.JoinHostPort(host, "8989")
	if s.objects != nil {
		// fake-gcs-server serves only requests whose Host header names its
		// public host, 127.0.0.1 (any port): every proxy of a stack on
		// another store is on 127.0.0.1, on a port the kernel picks.
		listen = "127.0.0.1:0"
	}
	p := startProxy(t, listen, u)
	srv := &server{id: id, host: host, proxy: p, log: filepath.Join(s.dir, id+".log")}
	if s.procs == nil {
		// Created with the first server, so that its cleanup kills the
		// servers before dev-s3 (started earlier) stops (cleanups run
		// last-in first-out). Servers are killed at once (SIGKILL); their
		// logs are dir/{id}.log.
		s.procs = proctest.NewGroup(t, proctest.Options{Bin: s.bin, LogDir: s.dir, Env: []string{}, TailLines: 60})
	}
	bind := func(port int) string { return srv.addr(port) }
	var err error
	srv.proc, err = s.procs.Start(id, "nstance-server", s.env("http://"+srv.proxy.Addr()), "--id", srv.id, "--shard", shard, "--bucket", s.bucket(),
		"--advertise-host", srv.host, "--bind-health", bind(8990), "--bind-election", bind(8991),
		"--bind-registration", bind(8992), "--bind-operator", bind(8993), "--bind-agent", bind(8994))
	require.NoError(t, err)
	s.servers = append(s.servers, srv)
	return srv
}

// launch starts srv's process again after it exited; its output is
// appended to srv.log.
func (s *stack) launch(srv *server) {
	s.t.Helper()
	var err error
	srv.proc, err = s.procs.Restart(srv.proc)
	require.NoError(s.t, err)
}

// kill9 kills srv with SIGKILL and waits for it to be gone.
func (s *stack) kill9(srv *server) { srv.proc.Kill() }

func putInput(key string, body []byte) *s3.PutObjectInput {
	return &s3.PutObjectInput{Bucket: aws.String(devs3test.Bucket), Key: aws.String(key), Body: bytes.NewReader(body)}
}

// registerOperator registers an operator with a nonce minted by
// nstance-admin and returns the cluster CA pool and the operator's
// certificate.
func (s *stack) registerOperator() (*x509.CertPool, tls.Certificate) {
	t := s.t
	t.Helper()
	var caPEM []byte
	store := s.store()
	require.Eventually(t, func() bool {
		obj, err := store.Get(context.Background(), "cluster/ca.crt")
		if err != nil {
			return false
		}
		caPEM = obj.Body
		return len(caPEM) > 0
	}, 60*time.Second, 50*time.Millisecond, "cluster CA written")
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(caPEM))

	nonce, err := proctest.Output(context.Background(), s.env(s.s3URL), filepath.Join(s.bin, "nstance-admin"), "cluster", "nonce", "--cluster-id", clusterID,
		"--bucket", s.bucket(), "--key-provider", "env", "--expiry", "1h", "--output", "-")
	require.NoError(t, err)

	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	pubPEM, err := pki.MarshalPublicKeyPEM(pub)
	require.NoError(t, err)
	var certPEM []byte
	require.Eventually(t, func() bool {
		for _, srv := range s.servers {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			c, err := bootstrap.GRPCRegistrar{Timeout: 2 * time.Second, Hostname: "chaos"}.Register(ctx, srv.Registration(), roots,
				string(bytes.TrimSpace(nonce)), pubPEM)
			cancel()
			if err == nil {
				certPEM = c
				return true
			}
		}
		return false
	}, 60*time.Second, 100*time.Millisecond, "an operator registers with the leader")
	keyPEM, err := pki.MarshalPrivateKeyPEM(key)
	require.NoError(t, err)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	return roots, cert
}

// operatorClients registers an operator (registerOperator) and returns
// Operator API clients, one per server, each over its own connection.
func (s *stack) operatorClients() map[*server]nstancev1.OperatorServiceClient {
	t := s.t
	t.Helper()
	roots, cert := s.registerOperator()
	out := map[*server]nstancev1.OperatorServiceClient{}
	for _, srv := range s.servers {
		// Reconnect at the polling pace: gRPC's default backoff (up to
		// two minutes) would hide a server that serves again.
		conn, err := grpc.NewClient(srv.Operator(), grpc.WithTransportCredentials(credentials.NewTLS(
			pki.ClientTLS(roots, &cert, srv.host))), grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1, MaxDelay: 50 * time.Millisecond}, MinConnectTimeout: 500 * time.Millisecond,
		}))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		out[srv] = nstancev1.NewOperatorServiceClient(conn)
	}
	return out
}

// servedAt is one successful poll: the request was sent at sent and the
// answer received at recv.
type servedAt struct{ sent, recv time.Time }

// poller calls GetConfigStatus on every server every 50ms and records the
// successful calls, so overlaps of two serving leaders can be measured.
type poller struct {
	mu     sync.Mutex
	served map[*server][]servedAt
	stop   context.CancelFunc
	wg     sync.WaitGroup
}

func startPoller(clients map[*server]nstancev1.OperatorServiceClient) *poller {
	ctx, cancel := context.WithCancel(context.Background())
	p := &poller{served: map[*server][]servedAt{}, stop: cancel}
	for srv, c := range clients {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				sent := time.Now()
				cctx, ccancel := context.WithTimeout(ctx, 500*time.Millisecond)
				_, err := c.GetConfigStatus(cctx, &nstancev1.GetConfigStatusRequest{})
				ccancel()
				if err == nil {
					p.mu.Lock()
					p.served[srv] = append(p.served[srv], servedAt{sent: sent, recv: time.Now()})
					p.mu.Unlock()
				}
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}
	return p
}

func (p *poller) Stop() { p.stop(); p.wg.Wait() }

// lastServed returns when srv last answered (zero when never).
func (p *poller) lastServed(srv *server) servedAt {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.served[srv]
	if len(s) == 0 {
		return servedAt{}
	}
	return s[len(s)-1]
}

// firstServedAfter returns when the first call to srv sent after t was
// sent, of those it answered (zero when none).
func (p *poller) firstServedAfter(srv *server, t time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range p.served[srv] {
		if a.sent.After(t) {
			return a.sent
		}
	}
	return time.Time{}
}

// servedSince reports whether srv answered a call sent after t.
func (p *poller) servedSince(srv *server, t time.Time) bool {
	return p.lastServed(srv).sent.After(t)
}

// overlap returns how long old and new both served around a handover at
// cut: the last answer of old received after cut, minus the first call to
// new that it answered after cut. Answers are timed conservatively (old by
// receipt, new by sending), so a positive result is an upper bound of a
// real overlap and zero means none was seen.
func (p *poller) overlap(old, new *server, cut time.Time) (time.Duration, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var lastOld, firstNew time.Time
	for _, a := range p.served[old] {
		if a.recv.After(cut) {
			lastOld = a.recv
		}
	}
	for _, a := range p.served[new] {
		if a.sent.After(cut) {
			firstNew = a.sent
			break
		}
	}
	if firstNew.IsZero() {
		return 0, errors.New("the standby never served after the cut")
	}
	if lastOld.IsZero() || lastOld.Before(firstNew) {
		return 0, nil
	}
	return lastOld.Sub(firstNew), nil
}

// leader waits until exactly one server answers and returns it.
func (s *stack) leader(p *poller, since time.Time, timeout time.Duration) *server {
	s.t.Helper()
	var l *server
	require.Eventually(s.t, func() bool {
		l = nil
		for _, srv := range s.servers {
			if p.servedSince(srv, since) {
				if l != nil {
					return false
				}
				l = srv
			}
		}
		return l != nil
	}, timeout, 20*time.Millisecond, "one server serves")
	return l
}
