// Command registration measures RegisterAgent throughput and latency of an
// in-process nstance-server over real TLS on loopback. Every registration
// verifies an EdDSA nonce, reads the instance record, signs a certificate,
// records the nonce as used with a conditional create and binds the key to
// the instance record in object storage (dev-s3 over HTTP by default).
//
//	go run ./bench/registration -n 3000 -c 16 -storage s3
//
// Besides the rate and latencies it prints cpu/op, the CPU time of the
// whole process (server, dev-s3 and clients) per registration over the
// timed phase: on a shared machine the rate follows the load of others,
// cpu/op much less; allocs/op (heap allocations per registration) not at
// all. -cpuprofile profiles the same phase, and -perf-ctl lets perf stat
// count just that phase (system calls per registration, for example).
//
// -storm D is the registration storm instead: n agents arrive evenly spread
// over D, each with a fresh TLS connection from a loopback source address
// of its own (127.1.x.y) and a distinct nonce, under the shard's default
// per-source limits (the source-address check is off: the mock provider
// reports 127.0.0.1 for every instance). Like an agent, a client retries
// an Unavailable answer with jittered backoff (counted and printed); any
// other error fails the run. Latency is from the first dial to the
// certificate, retries included.
//
//	go run ./bench/registration -n 10000 -storm 1m -storage s3
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpccreds "google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const encKey = "thisisatest32bytekey123456789012"

// config has one static group of %d instances on the mock provider; create
// rates are lifted so the reconciler creates them at once.
const config = `{
  "cluster": {"id": "bench"},
  "shard": {"id": "s1", "infra": {"provider": "mock"},
    "bind": {"health_addr": "127.0.0.1:0", "election_addr": "127.0.0.1:0", "registration_addr": "127.0.0.1:0", "operator_addr": "127.0.0.1:0", "agent_addr": "127.0.0.1:0"},
    "subnet_pools": {"default": {"subnets": ["bench-a"]}},
    "create_rate_limit": {"per_minute": 1000000, "burst": 1000000},
    %s"limits": {%s"tenant_create_rate": {"per_minute": 1000000, "burst": 1000000}}},
  "templates": {"worker": {"kind": "worker", "arch": "amd64", "instance_type": "bench.small", "subnet_pool": "default"}},
  "groups": {"default": {"g": {"template": "worker", "size": %d}}},
}`

func main() {
	n := flag.Int("n", 3000, "registrations to perform")
	conc := flag.Int("c", 16, "concurrent clients")
	storageKind := flag.String("storage", "s3", "s3 (in-process dev-s3 over HTTP) or mem")
	conns := flag.Int("conns", 4, "TLS connections shared by the clients")
	storm := flag.Duration("storm", 0, "registration storm: spread n agents, each with its own connection and source address, over this window")
	flag.StringVar(&perfCtl, "perf-ctl", "", "a perf stat --control fifo: \"enable\" and \"disable\" are written to it around the timed phase (count syscalls: perf stat -e raw_syscalls:sys_enter -D -1 --control fifo:F)")
	flag.StringVar(&memProfile, "memprofile", "", "write heap profiles to this file at the end of the timed phase and to FILE.before at its start (go tool pprof -sample_index=alloc_objects -diff_base FILE.before BIN FILE)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the timed phase (server, dev-s3 and clients; not the set-up) to this file")
	flag.Parse()
	why := newReasons()
	profilePath = *cpuProfile
	err := run(*n, *conc, *conns, *storageKind, *storm, why)
	why.print()
	if err != nil {
		fmt.Fprintln(os.Stderr, "registration bench:", err)
		os.Exit(1)
	}
}

// cpuTime is the CPU time (user and system) this process has used so far:
// the whole process is the server, dev-s3 and the clients, so CPU per
// registration is comparable between runs on a shared, busy machine where
// the rate is not.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// profilePath, when set, receives a CPU profile of the timed phase.
var profilePath string

// memProfile, when set, receives heap profiles (see -memprofile).
var memProfile string

// writeHeap writes the heap profile (allocations since the start) to name
// when -memprofile is set.
func writeHeap(name string) error {
	if memProfile == "" {
		return nil
	}
	f, err := os.Create(name)
	if err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	defer f.Close()
	return pprof.Lookup("allocs").WriteTo(f, 0)
}

// perfCtl, when set, is a perf stat control fifo (see -perf-ctl).
var perfCtl string

// perfControl writes cmd ("enable" or "disable") to the perf control fifo.
func perfControl(cmd string) error {
	if perfCtl == "" {
		return nil
	}
	f, err := os.OpenFile(perfCtl, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("perf control: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(cmd + "\n"); err != nil {
		return fmt.Errorf("perf control: %w", err)
	}
	return nil
}

// mallocs is the number of heap allocations made so far.
func mallocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs
}

// startProfile starts the CPU profile of the timed phase, when asked for;
// the returned func stops it.
func startProfile() (stop func(), err error) {
	if profilePath == "" {
		return func() {}, nil
	}
	f, err := os.Create(profilePath)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

func openStore(ctx context.Context, kind string) (objstore.Store, func(), error) {
	switch kind {
	case "mem":
		return memstore.New(), func() {}, nil
	case "s3":
		dir, err := os.MkdirTemp("", "bench-registration-")
		if err != nil {
			return nil, nil, err
		}
		st, stop, err := devs3test.Serve(ctx, dir, 64)
		if err != nil {
			return nil, nil, err
		}
		return st, func() { stop(); _ = os.RemoveAll(dir) }, nil
	}
	return nil, nil, fmt.Errorf("unknown storage %q", kind)
}

// run starts the server and measures; why collects the server's refusal
// reasons and errors.
func run(n, conc, nconns int, storageKind string, storm time.Duration, why *reasons) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The store outlives the server: the server releases its leases on the
	// way out, so dev-s3 must not stop with the server's context.
	store, cleanup, err := openStore(context.WithoutCancel(ctx), storageKind)
	if err != nil {
		return err
	}
	defer cleanup()
	// Every client of the throughput benchmark comes from 127.0.0.1: lift the
	// per-source rate. The storm keeps the defaults (one source per agent).
	extra, lim := "", `"registration_rate": {"per_minute": 1048576, "burst": 1048576}, `
	if storm > 0 {
		// The mock provider reports 127.0.0.1 for every instance, and each
		// storm agent dials from an address of its own: the source check
		// cannot match, so it is off; the per-source limits stay at their
		// defaults.
		extra, lim = `"registration": {"source_address_check": "off"}, `, ""
	}
	if _, err := store.Put(ctx, "config/s1.jsonc", []byte(fmt.Sprintf(config, extra, lim, n)), objstore.PutOptions{}); err != nil {
		return err
	}
	a, err := app.New(app.Options{
		ServerID: "bench", Shard: "s1", Store: store, Keys: layout.New(""), Bind: app.BindOverrides{Health: "127.0.0.1:0"},
		Getenv: func(string) string { return encKey }, Log: why.logger(),
	})
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for !a.ServingGRPC() {
		select {
		case err := <-done:
			return fmt.Errorf("server stopped: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
	}

	// Every registering agent has an instance record: the reconciler creates
	// the group's instances (mock provider) before the clock starts;
	// registration reads the record and records the agent's key on it.
	var ids []string
	for len(ids) < n {
		if built := a.Assembly(); built != nil {
			ids = ids[:0]
			for _, r := range built.Instances.List(func(r *instances.Record) bool { return r.State == instances.StateRunning }) {
				ids = append(ids, r.ID)
			}
		}
		select {
		case err := <-done:
			return fmt.Errorf("server stopped: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	caPEM, nonceKey, err := material(ctx, store)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	if storm > 0 {
		return runStorm(ctx, a.Addrs().Registration, pool, nonceKey, ids[:n], storm, storageKind)
	}
	clients := make([]nstancev1.RegistrationServiceClient, nconns)
	conns := make([]*grpc.ClientConn, 0, nconns)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for i := range clients {
		conn, err := grpc.NewClient(a.Addrs().Registration, grpc.WithTransportCredentials(grpccreds.NewTLS(pki.ClientTLS(pool, nil, "127.0.0.1"))))
		if err != nil {
			return err
		}
		conns = append(conns, conn)
		clients[i] = nstancev1.NewRegistrationServiceClient(conn)
	}

	// Prepare nonces and keys up front so only the RPC is timed.
	type job struct{ nonce, pub string }
	jobs := make([]job, n)
	for i := range jobs {
		tok, err := nonce.Mint(nonceKey, nonce.Claims{Kind: nonce.KindAgent, ClusterID: "bench", Tenant: "default", Shard: "s1", Group: "g",
			RegisteredClaims: jwt.RegisteredClaims{Subject: ids[i]}}, 15*time.Minute, time.Now())
		if err != nil {
			return err
		}
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return err
		}
		p, err := pki.MarshalPublicKeyPEM(pub)
		if err != nil {
			return err
		}
		jobs[i] = job{tok, string(p)}
	}
	// Warm up the connections.
	for _, c := range clients {
		_, _ = c.RegisterAgent(ctx, &nstancev1.RegisterAgentRequest{})
	}

	lat := make([]time.Duration, n)
	var next atomic.Int64
	var failures atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	stopProfile, err := startProfile()
	if err != nil {
		return err
	}
	if err := perfControl("enable"); err != nil {
		return err
	}
	if err := writeHeap(memProfile + ".before"); err != nil {
		return err
	}
	allocs0 := mallocs()
	cpu0 := cpuTime()
	began := time.Now()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c := clients[w%len(clients)]
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				t0 := time.Now()
				_, err := c.RegisterAgent(ctx, &nstancev1.RegisterAgentRequest{Nonce: jobs[i].nonce, PublicKeyPem: jobs[i].pub})
				lat[i] = time.Since(t0)
				if err != nil {
					failures.Add(1)
					errOnce.Do(func() { firstErr = err })
				}
			}
		}(w)
	}
	wg.Wait()
	elapsed := time.Since(began)
	cpu := cpuTime() - cpu0
	allocs := mallocs() - allocs0
	stopProfile()
	if err := writeHeap(memProfile); err != nil {
		return err
	}
	if err := perfControl("disable"); err != nil {
		return err
	}
	if failures.Load() > 0 {
		return fmt.Errorf("%d of %d registrations failed, first: %w", failures.Load(), n, firstErr)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(float64(len(lat))*p))] }
	fmt.Printf("storage=%s n=%d concurrency=%d conns=%d elapsed=%s rate=%.0f/s cpu/op=%s allocs/op=%d p50=%s p90=%s p99=%s max=%s\n",
		storageKind, n, conc, nconns, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), (cpu / time.Duration(n)).Round(time.Microsecond), allocs/uint64(n),
		pct(0.50).Round(10*time.Microsecond), pct(0.90).Round(10*time.Microsecond), pct(0.99).Round(10*time.Microsecond), lat[len(lat)-1].Round(10*time.Microsecond))
	return nil
}

// runStorm registers one agent per id, arriving evenly over window, each on
// its own TLS connection from its own loopback source address.
func runStorm(ctx context.Context, addr string, pool *x509.CertPool, nonceKey ed25519.PrivateKey, ids []string, window time.Duration, storageKind string) error {
	n := len(ids)
	type job struct{ nonce, pub string }
	jobs := make([]job, n)
	for i := range jobs {
		tok, err := nonce.Mint(nonceKey, nonce.Claims{Kind: nonce.KindAgent, ClusterID: "bench", Tenant: "default", Shard: "s1", Group: "g",
			RegisteredClaims: jwt.RegisteredClaims{Subject: ids[i]}}, 15*time.Minute, time.Now())
		if err != nil {
			return err
		}
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return err
		}
		p, err := pki.MarshalPublicKeyPEM(pub)
		if err != nil {
			return err
		}
		jobs[i] = job{tok, string(p)}
	}
	lat := make([]time.Duration, n)
	byCode := map[codes.Code]int{}
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	var retries atomic.Int64
	stopProfile, err := startProfile()
	if err != nil {
		return err
	}
	defer stopProfile()
	began := time.Now()
	for i := range n {
		if d := time.Until(began.Add(window * time.Duration(i) / time.Duration(n))); d > 0 {
			time.Sleep(d)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := net.IPv4(127, 1, byte(i/250), byte(i%250+1))
			dialer := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}}
			t0 := time.Now()
			conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(grpccreds.NewTLS(pki.ClientTLS(pool, nil, "127.0.0.1"))),
				grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return dialer.DialContext(ctx, "tcp", a) }))
			if err == nil {
				// Like an agent (internal/agent/register): Unavailable means
				// "retry later" and is retried with the same nonce and key,
				// with jittered backoff; any other error is final.
				b := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 1, Cap: 30 * time.Second, Steps: 1 << 30}
				for {
					var resp *nstancev1.RegisterAgentResponse
					resp, err = nstancev1.NewRegistrationServiceClient(conn).RegisterAgent(ctx, &nstancev1.RegisterAgentRequest{Nonce: jobs[i].nonce, PublicKeyPem: jobs[i].pub})
					if err == nil && resp.GetCertificatePem() == "" {
						err = errors.New("no certificate in the answer")
					}
					if status.Code(err) != codes.Unavailable {
						break
					}
					retries.Add(1)
					time.Sleep(b.Step())
				}
				conn.Close()
			}
			lat[i] = time.Since(t0)
			if err != nil {
				mu.Lock()
				byCode[status.Code(err)]++
				if firstErr == nil {
					firstErr = fmt.Errorf("agent %d (%s): %w", i, ids[i], err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(began)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(float64(len(lat))*p))] }
	failed := 0
	for _, c := range byCode {
		failed += c
	}
	fmt.Printf("storm storage=%s n=%d window=%s elapsed=%s registered=%d refused_or_failed=%d %v retried_unavailable=%d rate=%.0f/s p50=%s p90=%s p99=%s max=%s\n",
		storageKind, n, window, elapsed.Round(time.Millisecond), n-failed, failed, byCode, retries.Load(), float64(n)/elapsed.Seconds(),
		pct(0.50).Round(10*time.Microsecond), pct(0.90).Round(10*time.Microsecond), pct(0.99).Round(10*time.Microsecond), lat[len(lat)-1].Round(10*time.Microsecond))
	if failed > 0 {
		return fmt.Errorf("%d of %d registrations failed, first: %w", failed, n, firstErr)
	}
	return nil
}

func material(ctx context.Context, store objstore.Store) ([]byte, ed25519.PrivateKey, error) {
	keys := layout.New("")
	ca, err := store.Get(ctx, keys.CACert())
	if err != nil {
		return nil, nil, err
	}
	k, err := secrets.ParseKey([]byte(encKey))
	if err != nil {
		return nil, nil, err
	}
	ring, err := secrets.NewKeyring(k)
	if err != nil {
		return nil, nil, err
	}
	p, err := (&secrets.Store{Objects: store, Ring: ring}).Get(ctx, keys.NonceSigningKey())
	if err != nil {
		return nil, nil, err
	}
	signer, err := pki.ParsePrivateKeyPEM(p)
	if err != nil {
		return nil, nil, err
	}
	key, ok := signer.(ed25519.PrivateKey)
	if !ok {
		return nil, nil, errors.New("nonce key is not Ed25519")
	}
	return ca.Body, key, nil
}
