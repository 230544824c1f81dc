package grpcserve_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/msgsize"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// holding answers every watch with a header and then holds the stream open
// until the client goes away; UpsertGroup echoes the group.
type holding struct {
	nstancev1.UnimplementedOperatorServiceServer
}

func (holding) WatchGroups(_ *nstancev1.WatchGroupsRequest, s nstancev1.OperatorService_WatchGroupsServer) error {
	if err := s.SendHeader(metadata.Pairs("held", "yes")); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (holding) UpsertGroup(_ context.Context, req *nstancev1.UpsertGroupRequest) (*nstancev1.UpsertGroupResponse, error) {
	return &nstancev1.UpsertGroupResponse{Group: &nstancev1.GroupStatus{Spec: req.GetGroup()}}, nil
}

type limitFixture struct {
	ca   *pki.CA
	addr string
}

func startLimited(t *testing.T, lim config.Limits, reg nstancev1.RegistrationServiceServer) limitFixture {
	t.Helper()
	ca, err := pki.GenerateCA("c1", 24*time.Hour, time.Now())
	require.NoError(t, err)
	srvCert, err := ca.ServerKeyPair(pki.ServerIdentity{Shard: "s1", ServerID: "srv"}, []string{"127.0.0.1"}, time.Hour, time.Now())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg := grpcserve.Config{ClusterID: "c1", ServerCert: srvCert, ClientCAs: ca.Pool(), Limits: lim}
	ls := grpcserve.Listeners{}
	if reg != nil {
		cfg.Registration, ls.Registration = reg, ln
	} else {
		cfg.Operator, ls.Operator = holding{}, ln
	}
	srv, err := grpcserve.Start(cfg, ls)
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	return limitFixture{ca: ca, addr: ln.Addr().String()}
}

func readMetric(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// rawStreams opens n gRPC streams on one HTTP/2 connection without waiting
// for the server's stream quota, as a hostile client would, and returns how
// many the server accepted (answered with headers) and refused (RST_STREAM
// REFUSED_STREAM) once every stream has its answer. The connection stays
// open until the test ends, so the accepted streams stay open too.
func rawStreams(t *testing.T, f limitFixture, n int) (accepted, refused int) {
	t.Helper()
	c := dialRawH2(t, f.addr, pki.ClientTLS(f.ca.Pool(), clientCert(t, f.ca, pki.RoleOperator, time.Now()), "127.0.0.1"))

	type answer struct{ accepted, refused int }
	answers := make(chan answer, 1)
	readErr := make(chan error, 1)
	go func() {
		seen := map[uint32]bool{}
		var a answer
		for {
			frame, err := c.fr.ReadFrame()
			if err != nil {
				readErr <- err
				return
			}
			c.control(frame)
			switch fm := frame.(type) {
			case *http2.HeadersFrame:
				if !seen[fm.StreamID] {
					seen[fm.StreamID] = true
					a.accepted++
				}
			case *http2.RSTStreamFrame:
				if fm.ErrCode == http2.ErrCodeRefusedStream && !seen[fm.StreamID] {
					seen[fm.StreamID] = true
					a.refused++
				}
			case *http2.GoAwayFrame:
				readErr <- net.ErrClosed
				return
			}
			if a.accepted+a.refused == n {
				answers <- a
				// Keep answering pings and settings while the test measures.
				for {
					frame, err := c.fr.ReadFrame()
					if err != nil {
						return
					}
					c.control(frame)
				}
			}
		}
	}()

	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	empty := []byte{0, 0, 0, 0, 0} // an empty gRPC message: no compression, length 0
	for i := 0; i < n; i++ {
		id := uint32(2*i + 1)
		headers := grpcHeaders(t, enc, &hb, "/nstance.v1.OperatorService/WatchGroups")
		require.NoError(t, c.write(func(fr *http2.Framer) error {
			if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: headers, EndHeaders: true}); err != nil {
				return err
			}
			return fr.WriteData(id, true, empty)
		}))
	}
	select {
	case a := <-answers:
		return a.accepted, a.refused
	case err := <-readErr:
		t.Fatalf("connection ended before every stream was answered: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatalf("not every one of %d streams was answered within 60s", n)
	}
	return 0, 0
}

// TestStreamsPerConnectionRefusedBeyondLimit opens 10,000 streams on one
// connection: the server runs at most max_concurrent_streams of them and
// refuses the rest, so its goroutines and heap stay bounded. Without the
// limit every stream gets a handler goroutine (over 10,000; the bounds below
// fail).
func TestStreamsPerConnectionRefusedBeyondLimit(t *testing.T) {
	const n, limit = 10000, 100
	f := startLimited(t, config.Limits{MaxConcurrentStreams: limit, MaxWatchesPerOperator: 1 << 16}, nil)
	runtime.GC()
	g0 := readMetric("/sched/goroutines:goroutines")
	h0 := readMetric("/gc/heap/live:bytes")

	accepted, refused := rawStreams(t, f, n)
	require.LessOrEqual(t, accepted, limit)
	require.GreaterOrEqual(t, refused, n-limit)
	require.Positive(t, accepted)

	runtime.GC()
	g1 := readMetric("/sched/goroutines:goroutines")
	h1 := readMetric("/gc/heap/live:bytes")
	t.Logf("streams accepted %d refused %d; goroutines %d -> %d; live heap %d KiB -> %d KiB", accepted, refused, g0, g1, h0>>10, h1>>10)
	require.Less(t, int(g1)-int(g0), 5*limit, "goroutines grew with refused streams")
	require.Less(t, int64(h1)-int64(h0), int64(16<<20), "live heap grew with refused streams")

	// The server still serves a well-behaved client.
	c := nstancev1.NewOperatorServiceClient(dialLimited(t, f))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "g"}})
	require.NoError(t, err)
}

func dialLimited(t *testing.T, f limitFixture) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(credentials.NewTLS(
		pki.ClientTLS(f.ca.Pool(), clientCert(t, f.ca, pki.RoleOperator, time.Now()), "127.0.0.1"))), msgsize.DialOption())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestWatchesPerOperatorRefusedBeyondLimit opens 10,000 watches as one
// operator over one connection: the first max_watches_per_operator are held
// open, every other one is refused with ResourceExhausted, and closing one
// makes room for another.
func TestWatchesPerOperatorRefusedBeyondLimit(t *testing.T) {
	const n, limit = 10000, 32
	f := startLimited(t, config.Limits{MaxWatchesPerOperator: limit}, nil)
	c := nstancev1.NewOperatorServiceClient(dialLimited(t, f))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runtime.GC()
	g0 := readMetric("/sched/goroutines:goroutines")
	var held []context.CancelFunc
	refused := 0
	for i := 0; i < n; i++ {
		wctx, wcancel := context.WithCancel(ctx)
		ws, err := c.WatchGroups(wctx, &nstancev1.WatchGroupsRequest{})
		require.NoError(t, err)
		md, err := ws.Header()
		require.NoError(t, err)
		if len(md.Get("held")) > 0 {
			held = append(held, wcancel)
			continue
		}
		_, err = ws.Recv()
		wcancel()
		require.Equal(t, codes.ResourceExhausted, status.Code(err), "watch %d: %v", i, err)
		require.Contains(t, status.Convert(err).Message(), "max_watches_per_operator")
		refused++
	}
	require.Len(t, held, limit)
	require.Equal(t, n-limit, refused)
	g1 := readMetric("/sched/goroutines:goroutines")
	t.Logf("watches held %d refused %d; goroutines %d -> %d", len(held), refused, g0, g1)
	require.Less(t, int(g1)-int(g0), 10*limit)

	// Closing a watch frees its slot (the server sees the cancel asynchronously).
	held[0]()
	require.Eventually(t, func() bool {
		ws, err := c.WatchGroups(ctx, &nstancev1.WatchGroupsRequest{})
		if err != nil {
			return false
		}
		md, _ := ws.Header()
		return len(md.Get("held")) > 0
	}, 10*time.Second, 10*time.Millisecond)
	for _, h := range held[1:] {
		h()
	}
}

// TestConnectionsPerSourceCapped: connections beyond the cap from one
// address are closed before the TLS handshake.
func TestConnectionsPerSourceCapped(t *testing.T) {
	f := startLimited(t, config.Limits{MaxConnectionsPerSource: 2}, nil)
	tcfg := pki.ClientTLS(f.ca.Pool(), clientCert(t, f.ca, pki.RoleOperator, time.Now()), "127.0.0.1").Clone()
	tcfg.NextProtos = []string{"h2"} // as gRPC clients do; the server closes connections without it
	var open []*tls.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for i := 0; i < 2; i++ {
		c, err := tls.Dial("tcp", f.addr, tcfg)
		require.NoError(t, err, "connection %d", i)
		open = append(open, c)
	}
	_, err := tls.Dial("tcp", f.addr, tcfg)
	require.Error(t, err, "third connection from one source")
	// The first two are served: the server's HTTP/2 settings arrive.
	for _, c := range open {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		_, err := c.Read(make([]byte, 1))
		require.NoError(t, err)
	}
	open[0].Close()
	require.Eventually(t, func() bool {
		c, err := tls.Dial("tcp", f.addr, tcfg)
		if err != nil {
			return false
		}
		open = append(open, c)
		return true
	}, 10*time.Second, 20*time.Millisecond)
}

// countingRegistration answers every RegisterAgent.
type countingRegistration struct {
	nstancev1.UnimplementedRegistrationServiceServer
	mu sync.Mutex
	n  int
}

func (r *countingRegistration) RegisterAgent(context.Context, *nstancev1.RegisterAgentRequest) (*nstancev1.RegisterAgentResponse, error) {
	r.mu.Lock()
	r.n++
	r.mu.Unlock()
	return &nstancev1.RegisterAgentResponse{}, nil
}

// TestRegistrationRatePerSource: a burst of attempts from one address is
// served, the rest answered ResourceExhausted without reaching the service.
func TestRegistrationRatePerSource(t *testing.T) {
	reg := &countingRegistration{}
	f := startLimited(t, config.Limits{RegistrationRate: config.RateLimit{PerMinute: 1, Burst: 5}}, reg)
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientTLS(f.ca.Pool(), nil, "127.0.0.1"))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	c := nstancev1.NewRegistrationServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	codesSeen := map[codes.Code]int{}
	for i := 0; i < 50; i++ {
		_, err := c.RegisterAgent(ctx, &nstancev1.RegisterAgentRequest{})
		codesSeen[status.Code(err)]++
		if err != nil {
			require.Contains(t, status.Convert(err).Message(), "too many attempts from this address")
		}
	}
	require.Equal(t, map[codes.Code]int{codes.OK: 5, codes.ResourceExhausted: 45}, codesSeen)
	require.Equal(t, 5, reg.n)
}

// TestMessageSizes: with the default limits a 5 MiB request and response
// (above gRPC's 4 MiB default) pass both ways; a request above
// max_message_bytes is refused with ResourceExhausted and the connection
// keeps serving.
func TestMessageSizes(t *testing.T) {
	f := startLimited(t, config.Limits{}, nil)
	c := nstancev1.NewOperatorServiceClient(dialLimited(t, f))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	big := strings.Repeat("x", 5<<20)
	resp, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "g", Vars: map[string]string{"big": big}}})
	require.NoError(t, err)
	require.Len(t, resp.GetGroup().GetSpec().GetVars()["big"], 5<<20)

	tooBig := strings.Repeat("x", config.DefaultMaxMessageBytes+1)
	_, err = c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "g", Vars: map[string]string{"big": tooBig}}})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	_, err = c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "g"}})
	require.NoError(t, err)
}

// holdingAgent holds every ReceiveFiles stream open after its header.
type holdingAgent struct {
	nstancev1.UnimplementedAgentServiceServer
}

func (holdingAgent) ReceiveFiles(_ *nstancev1.ReceiveFilesRequest, s nstancev1.AgentService_ReceiveFilesServer) error {
	if err := s.SendHeader(metadata.Pairs("held", "yes")); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// TestStreamsPerAgentCapped: one agent identity gets max_streams_per_agent
// concurrent file streams, the rest ResourceExhausted.
func TestStreamsPerAgentCapped(t *testing.T) {
	ca, err := pki.GenerateCA("c1", 24*time.Hour, time.Now())
	require.NoError(t, err)
	srvCert, err := ca.ServerKeyPair(pki.ServerIdentity{Shard: "s1", ServerID: "srv"}, []string{"127.0.0.1"}, time.Hour, time.Now())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := grpcserve.Start(grpcserve.Config{ClusterID: "c1", ServerCert: srvCert, ClientCAs: ca.Pool(), Agent: holdingAgent{},
		Limits: config.Limits{MaxStreamsPerAgent: 4}}, grpcserve.Listeners{Agent: ln})
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	c := nstancev1.NewAgentServiceClient(dial(t, ln.Addr().String(), ca, clientCert(t, ca, pki.RoleAgent, time.Now())))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held, refused := 0, 0
	for i := 0; i < 50; i++ {
		fs, err := c.ReceiveFiles(ctx, &nstancev1.ReceiveFilesRequest{})
		require.NoError(t, err)
		md, err := fs.Header()
		require.NoError(t, err)
		if len(md.Get("held")) > 0 {
			held++
			continue
		}
		_, err = fs.Recv()
		require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
		require.Contains(t, status.Convert(err).Message(), "shard.limits.max_streams_per_agent")
		refused++
	}
	require.Equal(t, 4, held)
	require.Equal(t, 46, refused)
}
