// Command agents is the Agent service load test: it starts one server (the
// real agentapi behind grpcserve's mTLS listener) as a child process, then
// runs N simulated agents in this process, each with its own TLS connection
// and client certificate and the three long-lived streams a real agent opens
// (KeyGenRequests, ReceiveFiles, ReportHealth), reporting once per interval.
// It prints reports per second seen by the server and the server's CPU and RSS.
//
//	go run ./bench/agents -agents 1000,5000 -duration 30s
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
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	counts := flag.String("agents", "1000", "comma-separated agent counts to measure")
	duration := flag.Duration("duration", 30*time.Second, "measuring time per count, after all agents are connected")
	interval := flag.Duration("interval", time.Second, "report interval per agent")
	memLimit := flag.Int64("memlimit", 0, "soft memory limit of the server child in MiB (debug.SetMemoryLimit, as GOMEMLIMIT); 0 for none")
	flag.Parse()
	if *serve {
		if *memLimit > 0 {
			debug.SetMemoryLimit(*memLimit << 20)
		}
		if err := runServer(); err != nil {
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
		if err := runLoad(n, *duration, *interval, *memLimit); err != nil {
			fmt.Fprintln(os.Stderr, "load:", err)
			os.Exit(1)
		}
	}
}

// runServer serves the Agent service with a one-file template for any
// instance and prints the address, CA and the count of reports on demand.
// The agent listener's small per-connection buffers are grpcserve's own
// defaults, so the bench measures the server as it ships.
func runServer() error {
	ca, err := pki.GenerateCA(clusterID, 24*time.Hour, time.Now())
	if err != nil {
		return err
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(ca.Key)
	if err != nil {
		return err
	}
	var reports atomic.Uint64
	tracker := agentapi.NewTracker()
	tracker.OnReport = func(context.Context, agentapi.Ref, *nstancev1.HealthReport, time.Time) { reports.Add(1) }
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
	api, err := agentapi.New(agentapi.Options{Shard: "bench", Source: src, Keys: agentapi.NewMemKeyStore(), Signer: signer, Health: tracker, Log: logr.Discard()})
	if err != nil {
		return err
	}
	cert, err := ca.ServerKeyPair(pki.ServerIdentity{Shard: "bench", ServerID: "bench"}, []string{"127.0.0.1"}, time.Hour, time.Now())
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv, err := grpcserve.Start(grpcserve.Config{ClusterID: clusterID, ServerCert: cert, ClientCAs: ca.Pool(), Agent: api,
		// Every simulated agent connects from 127.0.0.1.
		Limits: config.Limits{MaxConnectionsPerSource: 1 << 20}}, grpcserve.Listeners{Agent: ln})
	if err != nil {
		return err
	}
	defer srv.Stop()
	b, _ := json.Marshal(hello{Addr: ln.Addr().String(), CACert: string(ca.CertPEM), CAKey: string(keyPEM)})
	fmt.Println(string(b))
	// Each stdin line asks for the report counter; EOF ends the server.
	// A line "m" asks for Go memory figures instead (and writes the heap
	// profile named by NSTANCE_BENCH_HEAPPROFILE, if set).
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() == "m" {
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if path := os.Getenv("NSTANCE_BENCH_HEAPPROFILE"); path != "" {
				if f, err := os.Create(path); err == nil {
					_ = pprof.WriteHeapProfile(f)
					f.Close()
				}
			}
			fmt.Printf("%d %d %d %d\n", runtime.NumGoroutine(), ms.HeapInuse, ms.StackInuse, ms.Sys)
			continue
		}
		fmt.Printf("%d %d\n", reports.Load(), api.Connected())
	}
	return nil
}

type child struct {
	cmd   *exec.Cmd
	in    *os.File
	out   *bufio.Scanner
	hello hello
}

func startServer(memLimit int64) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-serve", "-memlimit="+strconv.FormatInt(memLimit, 10))
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

// mem returns the server's goroutine count and Go heap, stack and total bytes.
func (c *child) mem() (goroutines int, heap, stack, sys uint64, err error) {
	if _, err := fmt.Fprintln(c.in, "m"); err != nil {
		return 0, 0, 0, 0, err
	}
	if !c.out.Scan() {
		return 0, 0, 0, 0, errors.New("server child exited")
	}
	_, err = fmt.Sscanf(c.out.Text(), "%d %d %d %d", &goroutines, &heap, &stack, &sys)
	return goroutines, heap, stack, sys, err
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

func runLoad(n int, duration, interval time.Duration, memLimit int64) error {
	srv, err := startServer(memLimit)
	if err != nil {
		return err
	}
	defer func() { srv.in.Close(); _ = srv.cmd.Wait() }()
	ca, err := pki.LoadCA([]byte(srv.hello.CACert), []byte(srv.hello.CAKey))
	if err != nil {
		return err
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var failures atomic.Int64
	start := time.Now()
	for i := range n {
		id := pki.Identity{ClusterID: clusterID, Tenant: "bench", Role: pki.RoleAgent, ClientID: fmt.Sprintf("bench-%05d", i), Shard: "bench", Group: "g"}
		c, _, err := ca.IssueClient(pki.ClientRequest{Identity: id, PublicKey: pub, Validity: time.Hour}, time.Now())
		if err != nil {
			return err
		}
		tc := tls.Certificate{Certificate: [][]byte{c.Raw}, PrivateKey: priv, Leaf: c}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := agent(ctx, srv.hello.Addr, pki.ClientTLS(ca.Pool(), &tc, "127.0.0.1"), interval); err != nil && ctx.Err() == nil {
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
			return err
		}
		if connected >= n {
			break
		}
		if time.Since(start) > 5*time.Minute {
			return fmt.Errorf("only %d of %d agents connected after 5 minutes", connected, n)
		}
		time.Sleep(500 * time.Millisecond)
	}
	connectTime := time.Since(start)
	time.Sleep(2 * interval) // settle
	r0, _, err := srv.counters()
	if err != nil {
		return err
	}
	t0, _, err := usage(srv.cmd.Process.Pid)
	if err != nil {
		return err
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
		return err
	}
	t1, rss, err := usage(srv.cmd.Process.Pid)
	if err != nil {
		return err
	}
	elapsed := time.Since(began).Seconds()
	const hz = 100.0 // USER_HZ on Linux
	fmt.Printf("memlimit=%dMiB agents=%d connected=%d connect_time=%s reports_per_s=%.0f server_cpu=%.1f%% server_rss=%.1fMiB peak_rss=%.1fMiB stream_failures=%d\n",
		memLimit, n, connected, connectTime.Round(100*time.Millisecond), float64(r1-r0)/elapsed, float64(t1-t0)/hz/elapsed*100,
		float64(rss)/1024, float64(peakRSS)/1024, failures.Load())
	if g, heap, stack, sys, err := srv.mem(); err == nil {
		const mib = 1 << 20
		fmt.Printf("  server goroutines=%d (%.1f per agent) go_heap=%.1fMiB go_stacks=%.1fMiB go_sys=%.1fMiB per_agent_heap+stack=%.1fKiB\n",
			g, float64(g)/float64(n), float64(heap)/mib, float64(stack)/mib, float64(sys)/mib, float64(heap+stack)/float64(n)/1024)
	}
	cancel()
	wg.Wait()
	return nil
}

// agent is one simulated agent: the three streams of a real agent, with a
// fixed report sent every interval.
func agent(ctx context.Context, addr string, tlsCfg *tls.Config, interval time.Duration) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
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
	hash := ""
	d, err := rf.Recv()
	if err != nil {
		return err
	}
	hash = d.GetConfigHash()
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
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
