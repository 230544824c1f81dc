// Command agents is the Agent service load test: it starts one server (the
// real agentapi behind grpcserve's mTLS listener) as a child process, then
// runs N simulated agents in this process, each with its own TLS connection
// and client certificate and the three long-lived streams a real agent opens
// (KeyGenRequests, ReceiveFiles, ReportHealth), reporting once per interval.
// It prints reports per second seen by the server and the server's CPU and RSS.
//
// In the same run and for every count it measures gRPC's own floor for that
// shape: a child serving the Agent service with handlers that keep nothing
// (one KeyGenRequest and one FileDelivery sent, reports counted), behind
// the same TLS 1.3 + mTLS configuration and the same gRPC transport options
// as the agent listener (grpcserve.AgentTransportOptions), and prints the
// ratio server RSS / floor RSS. RSS is read after a GC and
// debug.FreeOSMemory in each child.
//
//	go run ./bench/agents -agents 1000,5000 -duration 30s -runs 3
package main

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/agentapi"
	"github.com/nstance-dev/nstance/internal/server/agentlive"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const clusterID = "bench"

// hello is what the server child prints on its first stdout line.
type hello struct {
	Addr   string `json:"addr"`
	CACert string `json:"ca_cert"`
	CAKey  string `json:"ca_key"`
}

func main() {
	serve := flag.Bool("serve", false, "run as the server child")
	floor := flag.Bool("floor", false, "with -serve: serve the gRPC floor instead of agentapi")
	counts := flag.String("agents", "1000", "comma-separated agent counts to measure")
	duration := flag.Duration("duration", 30*time.Second, "measuring time per count, after all agents are connected")
	interval := flag.Duration("interval", time.Second, "report interval per agent")
	memLimit := flag.Int64("memlimit", 0, "soft memory limit of the server child in MiB (debug.SetMemoryLimit, as GOMEMLIMIT); 0 for none")
	runs := flag.Int("runs", 1, "runs per count (each run measures the server and the floor); medians are printed")
	noFloor := flag.Bool("nofloor", false, "skip the floor variant")
	flag.Parse()
	raiseNoFile()
	if *serve {
		if os.Getenv("NSTANCE_BENCH_HEAPPROFILE") != "" {
			runtime.MemProfileRate = 4 << 10
		}
		if *memLimit > 0 {
			debug.SetMemoryLimit(*memLimit << 20)
		}
		run := runServer
		if *floor {
			run = runFloor
		}
		if err := run(); err != nil {
			fmt.Fprintln(os.Stderr, "server:", err)
			os.Exit(1)
		}
		return
	}
	for _, c := range strings.Split(*counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "bad agent count %q\n", c)
			os.Exit(2)
		}
		var srvs, floors []result
		for r := range *runs {
			res, err := runLoad(n, *duration, *interval, *memLimit, false, r)
			if err != nil {
				fmt.Fprintln(os.Stderr, "load:", err)
				os.Exit(1)
			}
			srvs = append(srvs, res)
			if *noFloor {
				continue
			}
			fl, err := runLoad(n, *duration, *interval, *memLimit, true, r)
			if err != nil {
				fmt.Fprintln(os.Stderr, "load (floor):", err)
				os.Exit(1)
			}
			floors = append(floors, fl)
			fmt.Printf("run=%d agents=%d ratio=%.3f (server %.1fMiB / floor %.1fMiB)\n", r+1, n, res.rssMiB/fl.rssMiB, res.rssMiB, fl.rssMiB)
		}
		med := func(rs []result, f func(result) float64) float64 {
			v := make([]float64, len(rs))
			for i, r := range rs {
				v[i] = f(r)
			}
			sort.Float64s(v)
			return v[len(v)/2]
		}
		rss := func(r result) float64 { return r.rssMiB }
		fmt.Printf("MEDIAN agents=%d runs=%d server_rss=%.1fMiB server_cpu=%.1f%% reports_per_s=%.0f",
			n, len(srvs), med(srvs, rss), med(srvs, func(r result) float64 { return r.cpu }), med(srvs, func(r result) float64 { return r.reportsPerS }))
		if len(floors) > 0 {
			ratios := make([]result, len(floors))
			for i := range floors {
				ratios[i].rssMiB = srvs[i].rssMiB / floors[i].rssMiB
			}
			fmt.Printf(" floor_rss=%.1fMiB floor_cpu=%.1f%% ratio=%.3f", med(floors, rss), med(floors, func(r result) float64 { return r.cpu }), med(ratios, rss))
		}
		fmt.Println()
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

// floorAgent is the Agent service reduced to gRPC's own work: the same
// three streams, one message sent on each server stream, reports counted
// and dropped. It keeps no state per agent.
type floorAgent struct {
	nstancev1.UnimplementedAgentServiceServer
	reports   atomic.Uint64
	connected atomic.Int64
}

func (f *floorAgent) KeyGenRequests(_ *nstancev1.KeyGenRequestsRequest, s nstancev1.AgentService_KeyGenRequestsServer) error {
	if err := s.Send(&nstancev1.KeyGenRequest{ConfigHash: "floor", SentAt: timestamppb.Now()}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (f *floorAgent) ReceiveFiles(_ *nstancev1.ReceiveFilesRequest, s nstancev1.AgentService_ReceiveFilesServer) error {
	f.connected.Add(1)
	defer f.connected.Add(-1)
	content := []byte("NODE=floor\n")
	if err := s.Send(&nstancev1.FileDelivery{ConfigHash: "floor", SentAt: timestamppb.Now(),
		Files: []*nstancev1.DeliveredFile{{Path: "node.env", Content: content, Mode: 0o644, Kind: nstancev1.FileKind_FILE_KIND_ENV}}}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (f *floorAgent) ReportHealth(s nstancev1.AgentService_ReportHealthServer) error {
	for {
		if _, err := s.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return s.SendAndClose(&nstancev1.ReportHealthResponse{})
			}
			return err
		}
		f.reports.Add(1)
	}
}

// runFloor serves floorAgent with the agent listener's TLS and transport
// options and answers the same stdin protocol as runServer.
func runFloor() error {
	ca, keyPEM, cert, err := benchPKI()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	opts := append([]grpc.ServerOption{grpc.Creds(credentials.NewTLS(pki.ServerTLS(cert, ca.Pool(), true)))},
		grpcserve.AgentTransportOptions(config.Limits{})...)
	g := grpc.NewServer(opts...)
	fa := &floorAgent{}
	nstancev1.RegisterAgentServiceServer(g, fa)
	go func() { _ = g.Serve(ln) }()
	defer g.Stop()
	return childLoop(ln.Addr().String(), ca, keyPEM, func() (uint64, int) { return fa.reports.Load(), int(fa.connected.Load()) })
}

func benchPKI() (*pki.CA, []byte, tls.Certificate, error) {
	ca, err := pki.GenerateCA(clusterID, 24*time.Hour, time.Now())
	if err != nil {
		return nil, nil, tls.Certificate{}, err
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(ca.Key)
	if err != nil {
		return nil, nil, tls.Certificate{}, err
	}
	cert, err := ca.ServerKeyPair(pki.ServerIdentity{Shard: "bench", ServerID: "bench"}, []string{"127.0.0.1"}, time.Hour, time.Now())
	if err != nil {
		return nil, nil, tls.Certificate{}, err
	}
	return ca, keyPEM, cert, nil
}

// childLoop prints the hello line, then answers stdin: each line asks for
// the report counter and connected agents; "m" asks for Go memory figures
// and RSS after a few GCs and FreeOSMemory (and writes the heap profile named by
// NSTANCE_BENCH_HEAPPROFILE, if set). EOF ends the child.
func childLoop(addr string, ca *pki.CA, keyPEM []byte, counters func() (uint64, int)) error {
	b, _ := json.Marshal(hello{Addr: addr, CACert: string(ca.CertPEM), CAKey: string(keyPEM)})
	fmt.Println(string(b))
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() == "m" {
			// A GC shrinks a goroutine's stack by half at most; a few
			// cycles give the steady state of a server that has run for a
			// while (both children are measured the same way).
			for range 4 {
				runtime.GC()
			}
			debug.FreeOSMemory()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if path := os.Getenv("NSTANCE_BENCH_HEAPPROFILE"); path != "" {
				if f, err := os.Create(path); err == nil {
					_ = pprof.WriteHeapProfile(f)
					f.Close()
				}
			}
			if path := os.Getenv("NSTANCE_BENCH_GOROUTINES"); path != "" {
				if f, err := os.Create(path); err == nil {
					_ = pprof.Lookup("goroutine").WriteTo(f, 2)
					f.Close()
				}
			}
			_, rss, _ := usage(os.Getpid())
			fmt.Printf("%d %d %d %d %d\n", runtime.NumGoroutine(), ms.HeapInuse, ms.StackInuse, ms.Sys, rss)
			continue
		}
		r, c := counters()
		fmt.Printf("%d %d\n", r, c)
	}
	return nil
}

// runServer serves the Agent service with a one-file template for any
// instance and prints the address, CA and the count of reports on demand.
// The agent listener's small per-connection buffers are grpcserve's own
// defaults, so the bench measures the server as it ships.
func runServer() error {
	ca, keyPEM, cert, err := benchPKI()
	if err != nil {
		return err
	}
	live := agentlive.New()
	tmpl := config.Template{Files: map[string]config.TemplateFile{"node.env": {Kind: "env", Content: "NODE={{ .InstanceID }}\n"}}}
	src := &agentapi.TemplateSource{Lookup: func(_ context.Context, ref agentapi.Ref) (*agentapi.TemplateInput, error) {
		return &agentapi.TemplateInput{Template: tmpl, Data: agentapi.TemplateData{InstanceID: ref.InstanceID}}, nil
	}}
	wca, err := pki.GenerateWorkloadCA(clusterID, 24*time.Hour, time.Now())
	if err != nil {
		return err
	}
	signer := &agentapi.WorkloadSigner{CA: wca, MaxValidity: time.Hour, Policy: func() pki.WorkloadPolicy {
		return pki.WorkloadPolicy{TrustDomain: clusterID, ServerHosts: []string{"127.0.0.1"}}
	}}
	api, err := agentapi.New(agentapi.Options{Shard: "bench", Source: src, Keys: agentapi.NewMemKeyStore(), Signer: signer, Live: live, Log: logr.Discard()})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv, err := grpcserve.Start(grpcserve.Config{ClusterID: clusterID, ServerCert: cert, ClientCAs: ca.Pool(), Agent: api,
		// The simulated agents share a few loopback source addresses.
		Limits: config.Limits{MaxConnectionsPerSource: 1 << 20}}, grpcserve.Listeners{Agent: ln})
	if err != nil {
		return err
	}
	defer srv.Stop()
	return childLoop(ln.Addr().String(), ca, keyPEM, func() (uint64, int) { return live.Reports(), live.Connected() })
}

type child struct {
	cmd   *exec.Cmd
	in    *os.File
	out   *bufio.Scanner
	hello hello
}

func startServer(memLimit int64, floor bool) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-serve", "-floor="+strconv.FormatBool(floor), "-memlimit="+strconv.FormatInt(memLimit, 10))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, out: bufio.NewScanner(stdout)}
	c.in = stdin.(*os.File)
	if !c.out.Scan() {
		return nil, errors.New("server child printed nothing")
	}
	if err := json.Unmarshal(c.out.Bytes(), &c.hello); err != nil {
		return nil, fmt.Errorf("server hello: %w", err)
	}
	return c, nil
}

// mem returns the server's goroutine count, Go heap, stack and total bytes
// and its RSS in KiB after a GC and FreeOSMemory.
func (c *child) mem() (goroutines int, heap, stack, sys, rssKiB uint64, err error) {
	if _, err := fmt.Fprintln(c.in, "m"); err != nil {
		return 0, 0, 0, 0, 0, err
	}
	if !c.out.Scan() {
		return 0, 0, 0, 0, 0, errors.New("server child exited")
	}
	_, err = fmt.Sscanf(c.out.Text(), "%d %d %d %d %d", &goroutines, &heap, &stack, &sys, &rssKiB)
	return goroutines, heap, stack, sys, rssKiB, err
}

func (c *child) counters() (reports uint64, connected int, err error) {
	if _, err := fmt.Fprintln(c.in, "?"); err != nil {
		return 0, 0, err
	}
	if !c.out.Scan() {
		return 0, 0, errors.New("server child exited")
	}
	_, err = fmt.Sscanf(c.out.Text(), "%d %d", &reports, &connected)
	return reports, connected, err
}

// usage reads CPU ticks (user+system) and RSS of a process from /proc.
func usage(pid int) (ticks uint64, rssKiB uint64, err error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	s, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(s), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			rssKiB, _ = strconv.ParseUint(strings.Fields(v)[0], 10, 64)
		}
	}
	return ut + st, rssKiB, nil
}

// result is one measured child.
type result struct {
	rssMiB      float64 // after GC + FreeOSMemory
	cpu         float64 // % of one core while measuring
	reportsPerS float64
}

// sources are the loopback source addresses the simulated agents dial
// from, so that 10,000 connections per child (and the sockets of the
// previous child in TIME_WAIT) never run short of ephemeral ports.
const sources = 32

func runLoad(n int, duration, interval time.Duration, memLimit int64, floor bool, run int) (result, error) {
	srv, err := startServer(memLimit, floor)
	if err != nil {
		return result{}, err
	}
	defer func() { srv.in.Close(); _ = srv.cmd.Wait() }()
	ca, err := pki.LoadCA([]byte(srv.hello.CACert), []byte(srv.hello.CAKey))
	if err != nil {
		return result{}, err
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return result{}, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var failures atomic.Int64
	sentBase := sentReports.Load()
	start := time.Now()
	// Each run and variant dials from its own range of source addresses.
	base := 10 + (2*run+btoi(floor))%6*sources
	for i := range n {
		id := pki.Identity{ClusterID: clusterID, Tenant: "bench", Role: pki.RoleAgent, ClientID: fmt.Sprintf("bench-%05d", i), Shard: "bench", Group: "g"}
		c, _, err := ca.IssueClient(pki.ClientRequest{Identity: id, PublicKey: pub, Validity: time.Hour}, time.Now())
		if err != nil {
			return result{}, err
		}
		tc := tls.Certificate{Certificate: [][]byte{c.Raw}, PrivateKey: priv, Leaf: c}
		src := net.IPv4(127, 0, byte(base+i%sources), 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := agent(ctx, srv.hello.Addr, src, pki.ClientTLS(ca.Pool(), &tc, "127.0.0.1"), interval); err != nil && ctx.Err() == nil {
				failures.Add(1)
			}
		}()
		if i%200 == 199 {
			time.Sleep(50 * time.Millisecond) // spread the handshakes
		}
	}
	for {
		_, connected, err := srv.counters()
		if err != nil {
			return result{}, err
		}
		if connected >= n {
			break
		}
		if time.Since(start) > 5*time.Minute {
			return result{}, fmt.Errorf("only %d of %d agents connected after 5 minutes", connected, n)
		}
		time.Sleep(500 * time.Millisecond)
	}
	connectTime := time.Since(start)
	time.Sleep(2 * interval) // settle
	r0, _, err := srv.counters()
	if err != nil {
		return result{}, err
	}
	s0 := sentReports.Load()
	t0, _, err := usage(srv.cmd.Process.Pid)
	if err != nil {
		return result{}, err
	}
	began := time.Now()
	var peakRSS uint64
	for time.Since(began) < duration {
		time.Sleep(time.Second)
		_, rss, err := usage(srv.cmd.Process.Pid)
		if err == nil && rss > peakRSS {
			peakRSS = rss
		}
	}
	r1, connected, err := srv.counters()
	if err != nil {
		return result{}, err
	}
	s1 := sentReports.Load()
	t1, _, err := usage(srv.cmd.Process.Pid)
	if err != nil {
		return result{}, err
	}
	elapsed := time.Since(began).Seconds()
	const hz = 100.0 // USER_HZ on Linux
	res := result{cpu: float64(t1-t0) / hz / elapsed * 100, reportsPerS: float64(r1-r0) / elapsed}
	g, heap, stack, sys, rss, err := srv.mem()
	if err != nil {
		return result{}, err
	}
	res.rssMiB = float64(rss) / 1024
	name := "server"
	if floor {
		name = "floor"
	}
	const mib = 1 << 20
	fmt.Printf("%s run=%d agents=%d connected=%d connect_time=%s reports_sent=%d received=%d reports_per_s=%.0f cpu=%.1f%% rss_after_gc=%.1fMiB peak_rss=%.1fMiB stream_failures=%d\n",
		name, run+1, n, connected, connectTime.Round(100*time.Millisecond), s1-s0, r1-r0, res.reportsPerS, res.cpu, res.rssMiB, float64(peakRSS)/1024, failures.Load())
	fmt.Printf("  %s goroutines=%d (%.1f per agent) go_heap=%.1fMiB go_stacks=%.1fMiB go_sys=%.1fMiB per_agent_heap+stack=%.1fKiB\n",
		name, g, float64(g)/float64(n), float64(heap)/mib, float64(stack)/mib, float64(sys)/mib, float64(heap+stack)/float64(n)/1024)
	if failures.Load() > 0 {
		return result{}, fmt.Errorf("%d agents' streams failed", failures.Load())
	}
	// Every report the simulated agents sent reaches the server: a starved
	// server (or load process) may lag behind, so wait for it to catch up
	// with what was sent up to the end of the window.
	want := s1 - sentBase
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		got, _, err := srv.counters()
		if err != nil {
			return result{}, err
		}
		if got >= want {
			break
		}
		if time.Now().After(deadline) {
			return result{}, fmt.Errorf("%s received %d of the %d reports sent", name, got, want)
		}
	}
	cancel()
	wg.Wait()
	return res, nil
}

// sentReports counts the reports the simulated agents of this process sent.
var sentReports atomic.Uint64

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// agent is one simulated agent: the three streams of a real agent, with a
// fixed report sent every interval.
func agent(ctx context.Context, addr string, src net.IP, tlsCfg *tls.Config, interval time.Duration) error {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}))
	if err != nil {
		return err
	}
	defer conn.Close()
	c := nstancev1.NewAgentServiceClient(conn)
	kg, err := c.KeyGenRequests(ctx, &nstancev1.KeyGenRequestsRequest{})
	if err != nil {
		return err
	}
	rf, err := c.ReceiveFiles(ctx, &nstancev1.ReceiveFilesRequest{})
	if err != nil {
		return err
	}
	first, err := rf.Recv()
	if err != nil {
		return err
	}
	hash := first.GetConfigHash()
	go func() {
		for {
			if _, err := kg.Recv(); err != nil {
				return
			}
		}
	}()
	go func() {
		for {
			if _, err := rf.Recv(); err != nil {
				return
			}
		}
	}()
	hs, err := c.ReportHealth(ctx)
	if err != nil {
		return err
	}
	report := &nstancev1.HealthReport{
		Uptime: durationpb.New(time.Hour), Cpu: &nstancev1.CpuStats{Load1: 0.1, Load5: 0.1, Load15: 0.1, Cores: 2, UsagePercent: 3},
		Memory:            &nstancev1.MemoryStats{TotalBytes: 4 << 30, UsedBytes: 1 << 30, AvailableBytes: 3 << 30},
		NetworkInterfaces: []*nstancev1.NetworkInterfaceStats{{Name: "eth0", RxBytes: 1 << 20, TxBytes: 1 << 19}},
		Disks:             []*nstancev1.DiskStats{{MountPoint: "/", TotalBytes: 20 << 30, UsedBytes: 5 << 30}},
		Files:             []*nstancev1.FileStatus{{Path: "node.env", State: nstancev1.FileState_FILE_STATE_OK}},
		ConfigHash:        hash, AgentVersion: "bench",
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		report.Timestamp = timestamppb.Now()
		if err := hs.Send(report); err != nil {
			return err
		}
		sentReports.Add(1)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
