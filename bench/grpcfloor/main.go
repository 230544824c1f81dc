// Command grpcfloor measures what grpc-go itself costs per long-lived
// connection on the server side, independent of the Agent API.
//
// The parent process generates a throwaway ECDSA certificate, then for each
// variant starts a fresh server child (this binary re-executed with -child),
// opens N TLS 1.3 client connections to it (mTLS by default), opens the
// variant's streams on every connection and exchanges one small message per
// stream. The child then waits 5 s, runs runtime.GC and debug.FreeOSMemory
// and reports its own RSS and Go runtime figures, so the numbers are the
// server's alone.
//
// The service has no .proto: a grpc.ServiceDesc with hand-written stream
// handlers and a codec that passes []byte through unchanged.
//
//	go run ./bench/grpcfloor -n 10000
//	go run ./bench/grpcfloor -n 2000 -variants bidi,bidi-lean
//
// GRPCFLOOR_HEAPPROFILE=path makes each child write a heap profile to
// path.<variant> after measuring.
package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
)

const (
	envCert = "GRPCFLOOR_CERT_PEM"
	envKey  = "GRPCFLOOR_KEY_PEM"
)

// variant describes one measured server configuration.
type variant struct {
	name  string
	desc  string
	three bool // three streams per connection instead of one bidi stream
	lean  bool // memory-lean server options
	bufs  int  // read/write buffer size when lean
	work  bool // grpc.NumStreamWorkers
}

var variants = []variant{
	{name: "3streams", desc: "2 server-streams + 1 client-stream, default options", three: true},
	{name: "bidi", desc: "1 bidi stream, default options"},
	{name: "bidi-lean", desc: "1 bidi stream, lean options, 4 KiB buffers", lean: true, bufs: 4 << 10},
	{name: "bidi-lean0", desc: "1 bidi stream, lean options, 0 buffers", lean: true, bufs: 0},
	{name: "bidi-lean-workers", desc: "bidi-lean + NumStreamWorkers(NumCPU)", lean: true, bufs: 4 << 10, work: true},
}

func findVariant(name string) (variant, bool) {
	for _, v := range variants {
		if v.name == name {
			return v, true
		}
	}
	return variant{}, false
}

// rawCodec moves []byte messages without any encoding.
type rawCodec struct{}

func (rawCodec) Name() string { return "raw" }

func (rawCodec) Marshal(v any) ([]byte, error) {
	switch m := v.(type) {
	case []byte:
		return m, nil
	case *[]byte:
		return *m, nil
	}
	return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	p, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("raw codec: cannot unmarshal into %T", v)
	}
	*p = append((*p)[:0], data...)
	return nil
}

// stats is what the child reports to the parent.
type stats struct {
	BaseRSS    uint64 `json:"base_rss"`
	RSS        uint64 `json:"rss"`
	HeapInuse  uint64 `json:"heap_inuse"`
	StackInuse uint64 `json:"stack_inuse"`
	Goroutines int    `json:"goroutines"`
	Received   int64  `json:"received"`
}

func main() {
	child := flag.Bool("child", false, "run as the server child (internal)")
	vname := flag.String("variant", "", "variant for the child (internal)")
	n := flag.Int("n", 10000, "client connections per variant")
	list := flag.String("variants", "", "comma-separated variants (default all)")
	mtls := flag.Bool("mtls", true, "require and verify a client certificate")
	par := flag.Int("parallel", 16, "concurrent connection setups")
	settle := flag.Duration("settle", 5*time.Second, "wait before measuring")
	flag.Parse()

	raiseNoFile()
	var err error
	if *child {
		err = runChild(*vname, *mtls, *settle)
	} else {
		err = runParent(*n, *list, *mtls, *par, *settle)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpcfloor:", err)
		os.Exit(1)
	}
}

func raiseNoFile() {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return
	}
	lim.Cur = lim.Max
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
}

// ---- server child ----

var received atomic.Int64

// firstMsg receives one message and counts it.
func firstMsg(ss grpc.ServerStream) error {
	var b []byte
	if err := ss.RecvMsg(&b); err != nil {
		return err
	}
	received.Add(1)
	return nil
}

// serverStream: one request in, one reply out, then hold the stream open
// like KeyGenRequests/ReceiveFiles do.
func serverStream(_ any, ss grpc.ServerStream) error {
	if err := firstMsg(ss); err != nil {
		return err
	}
	if err := ss.SendMsg([]byte("ok")); err != nil {
		return err
	}
	<-ss.Context().Done()
	return nil
}

// clientStream: keep receiving like ReportHealth does.
func clientStream(_ any, ss grpc.ServerStream) error {
	if err := firstMsg(ss); err != nil {
		return err
	}
	var b []byte
	for {
		if err := ss.RecvMsg(&b); err != nil {
			if errors.Is(err, io.EOF) {
				return ss.SendMsg([]byte("done"))
			}
			return err
		}
	}
}

// bidiStream: one message each way, then keep receiving.
func bidiStream(_ any, ss grpc.ServerStream) error {
	if err := firstMsg(ss); err != nil {
		return err
	}
	if err := ss.SendMsg([]byte("ok")); err != nil {
		return err
	}
	var b []byte
	for {
		if err := ss.RecvMsg(&b); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

var (
	descKeys    = grpc.StreamDesc{StreamName: "Keys", Handler: serverStream, ServerStreams: true}
	descFiles   = grpc.StreamDesc{StreamName: "Files", Handler: serverStream, ServerStreams: true}
	descHealth  = grpc.StreamDesc{StreamName: "Health", Handler: clientStream, ClientStreams: true}
	descSession = grpc.StreamDesc{StreamName: "Session", Handler: bidiStream, ServerStreams: true, ClientStreams: true}
)

var serviceDesc = grpc.ServiceDesc{
	ServiceName: "floor.Floor",
	HandlerType: (*any)(nil),
	Streams:     []grpc.StreamDesc{descKeys, descFiles, descHealth, descSession},
	Metadata:    "none",
}

func readRSS() uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseUint(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

func settledRSS() uint64 {
	runtime.GC()
	debug.FreeOSMemory()
	return readRSS()
}

func runChild(name string, mtls bool, settle time.Duration) error {
	v, ok := findVariant(name)
	if !ok {
		return fmt.Errorf("unknown variant %q", name)
	}
	cert, pool, err := loadCert()
	if err != nil {
		return err
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}}
	if mtls {
		tc.ClientAuth = tls.RequireAndVerifyClientCert
		tc.ClientCAs = pool
	}
	opts := []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tc)), grpc.ForceServerCodec(rawCodec{})}
	if v.lean {
		opts = append(opts,
			grpc.ReadBufferSize(v.bufs),
			grpc.WriteBufferSize(v.bufs),
			grpc.InitialWindowSize(64<<10),
			grpc.InitialConnWindowSize(64<<10),
			grpc.MaxConcurrentStreams(4),
			// Same keepalive settings as internal/server/grpcserve.
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
			grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		)
	}
	if v.work {
		opts = append(opts, grpc.NumStreamWorkers(uint32(runtime.NumCPU())))
	}
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&serviceDesc, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go func() { _ = srv.Serve(ln) }()
	base := settledRSS()
	fmt.Printf("ADDR %s\n", ln.Addr())

	// Commands on stdin: "MEASURE <expected messages>".
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) != 2 || f[0] != "MEASURE" {
			continue
		}
		want, _ := strconv.ParseInt(f[1], 10, 64)
		deadline := time.Now().Add(time.Minute)
		for received.Load() < want && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(settle)
		runtime.GC()
		debug.FreeOSMemory()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		st := stats{
			BaseRSS:    base,
			RSS:        readRSS(),
			HeapInuse:  ms.HeapInuse,
			StackInuse: ms.StackInuse,
			Goroutines: runtime.NumGoroutine(),
			Received:   received.Load(),
		}
		if path := os.Getenv("GRPCFLOOR_HEAPPROFILE"); path != "" {
			if f, err := os.Create(path + "." + name); err == nil {
				_ = pprof.WriteHeapProfile(f)
				f.Close()
			}
		}
		b, _ := json.Marshal(st)
		fmt.Printf("STATS %s\n", b)
	}
	srv.Stop()
	return nil
}

// ---- certificate ----

// makeCert creates a self-signed ECDSA P-256 certificate usable as server
// certificate, client certificate and the CA that verifies both.
func makeCert() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "grpcfloor"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

func loadCert() (tls.Certificate, *x509.CertPool, error) {
	cp, kp := os.Getenv(envCert), os.Getenv(envKey)
	cert, err := tls.X509KeyPair([]byte(cp), []byte(kp))
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("certificate from environment: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(cp))
	return cert, pool, nil
}

// ---- parent ----

type result struct {
	v       variant
	n       int
	st      stats
	connect time.Duration
	err     error
}

func runParent(n int, list string, mtls bool, par int, settle time.Duration) error {
	cp, kp, err := makeCert()
	if err != nil {
		return err
	}
	os.Setenv(envCert, string(cp))
	os.Setenv(envKey, string(kp))

	var run []variant
	if list == "" {
		run = variants
	} else {
		for _, name := range strings.Split(list, ",") {
			v, ok := findVariant(strings.TrimSpace(name))
			if !ok {
				return fmt.Errorf("unknown variant %q", name)
			}
			run = append(run, v)
		}
	}
	fmt.Printf("# grpcfloor: N=%d mtls=%v %s GOMAXPROCS=%d\n", n, mtls, runtime.Version(), runtime.GOMAXPROCS(0))
	var results []result
	for _, v := range run {
		r := measure(v, n, mtls, par, settle)
		results = append(results, r)
		printResult(r)
	}
	fmt.Println()
	fmt.Println("| variant | N | server RSS | RSS over idle | Go heap in use | Go stacks | goroutines | KiB/conn (RSS over idle) | heap+stack KiB/conn | goroutines/conn |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range results {
		if r.err != nil {
			fmt.Printf("| %s | %d | failed: %v |\n", r.v.name, r.n, r.err)
			continue
		}
		s, fn := r.st, float64(r.n)
		fmt.Printf("| %s | %d | %.0f MiB | %.0f MiB | %.0f MiB | %.0f MiB | %d | %.1f | %.1f | %.2f |\n",
			r.v.name, r.n, mib(s.RSS), mib(s.RSS-s.BaseRSS), mib(s.HeapInuse), mib(s.StackInuse), s.Goroutines,
			float64(s.RSS-s.BaseRSS)/1024/fn, float64(s.HeapInuse+s.StackInuse)/1024/fn, float64(s.Goroutines)/fn)
	}
	return nil
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

func printResult(r result) {
	if r.err != nil {
		fmt.Printf("%-18s N=%d FAILED after %v: %v\n", r.v.name, r.n, r.connect.Round(time.Millisecond), r.err)
		return
	}
	s := r.st
	fmt.Printf("%-18s N=%d connect=%v rss=%.0fMiB (idle %.0fMiB) heap=%.0fMiB stack=%.0fMiB goroutines=%d received=%d  [%s]\n",
		r.v.name, r.n, r.connect.Round(time.Millisecond), mib(s.RSS), mib(s.BaseRSS), mib(s.HeapInuse), mib(s.StackInuse),
		s.Goroutines, s.Received, r.v.desc)
}

func measure(v variant, n int, mtls bool, par int, settle time.Duration) (res result) {
	res = result{v: v, n: n}
	self, err := os.Executable()
	if err != nil {
		res.err = err
		return
	}
	cmd := exec.Command(self, "-child", "-variant", v.name, "-mtls="+strconv.FormatBool(mtls), "-settle", settle.String())
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		res.err = err
		return
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		res.err = err
		return
	}
	if err := cmd.Start(); err != nil {
		res.err = err
		return
	}
	defer func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	out := bufio.NewScanner(stdout)
	readLine := func(prefix string) (string, error) {
		for out.Scan() {
			if rest, ok := strings.CutPrefix(out.Text(), prefix+" "); ok {
				return rest, nil
			}
		}
		return "", fmt.Errorf("child exited before %s", prefix)
	}
	addr, err := readLine("ADDR")
	if err != nil {
		res.err = err
		return
	}

	cert, pool, err := loadCert()
	if err != nil {
		res.err = err
		return
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: "127.0.0.1"}
	if mtls {
		tc.Certificates = []tls.Certificate{cert}
	}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tc)),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})),
		grpc.WithNoProxy(),
		// Keep the load side light; these do not change the server's buffers.
		grpc.WithReadBufferSize(4 << 10),
		grpc.WithWriteBufferSize(4 << 10),
	}

	conns := make([]*grpc.ClientConn, n)
	jobs := make(chan int)
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
		failed   atomic.Bool
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	for w := 0; w < par; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				if failed.Load() {
					continue
				}
				cc, err := openConn(ctx, addr, dial, v.three)
				if err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("connection %d: %w", i, err) })
					failed.Store(true)
					continue
				}
				conns[i] = cc
			}
		}()
	}
	for i := 0; i < n; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	res.connect = time.Since(start)
	defer func() {
		for _, cc := range conns {
			if cc != nil {
				cc.Close()
			}
		}
		runtime.GC()
	}()
	if firstErr != nil {
		res.err = firstErr
		return
	}

	want := int64(n)
	if v.three {
		want = int64(3 * n)
	}
	fmt.Fprintf(stdin, "MEASURE %d\n", want)
	line, err := readLine("STATS")
	if err != nil {
		res.err = err
		return
	}
	if err := json.Unmarshal([]byte(line), &res.st); err != nil {
		res.err = err
		return
	}
	if res.st.Received < want {
		res.err = fmt.Errorf("server received %d of %d first messages", res.st.Received, want)
	}
	return
}

// openConn opens one connection and its streams, exchanging one message on
// each. Streams stay open until ctx is cancelled or the connection closes.
func openConn(ctx context.Context, addr string, dial []grpc.DialOption, three bool) (*grpc.ClientConn, error) {
	cc, err := grpc.NewClient("passthrough:///"+addr, dial...)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*grpc.ClientConn, error) {
		cc.Close()
		return nil, err
	}
	msg := []byte("hello")
	if !three {
		s, err := cc.NewStream(ctx, &descSession, "/floor.Floor/Session")
		if err != nil {
			return fail(err)
		}
		var b []byte
		if err := s.SendMsg(msg); err != nil {
			return fail(err)
		}
		if err := s.RecvMsg(&b); err != nil {
			return fail(err)
		}
		return cc, nil
	}
	for _, m := range []string{"Keys", "Files"} {
		desc := descKeys
		s, err := cc.NewStream(ctx, &desc, "/floor.Floor/"+m)
		if err != nil {
			return fail(err)
		}
		var b []byte
		if err := s.SendMsg(msg); err != nil {
			return fail(err)
		}
		if err := s.CloseSend(); err != nil {
			return fail(err)
		}
		if err := s.RecvMsg(&b); err != nil {
			return fail(err)
		}
	}
	s, err := cc.NewStream(ctx, &descHealth, "/floor.Floor/Health")
	if err != nil {
		return fail(err)
	}
	if err := s.SendMsg(msg); err != nil {
		return fail(err)
	}
	return cc, nil
}
