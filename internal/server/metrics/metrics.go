package metrics

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/util/workqueue"

	"github.com/nstance-dev/nstance/internal/server/authz"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/version"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const ns = "nstance_server"

// Elections are the label values of the election label.
const (
	ElectionShard   = "shard"
	ElectionCluster = "cluster"
)

// Process is what the server reports about itself at scrape time; every
// function may be nil.
type Process struct {
	// ServerID and Shard name this server in nstance_server_info; Cluster
	// returns the cluster id once the config is loaded ("" before).
	ServerID, Shard string
	Cluster         func() string
	Ready           func() bool
	// ShardElection and ClusterElection return the election snapshots.
	ShardElection, ClusterElection func() (leading bool, term int64)
	// ServerCertNotAfter and CANotAfter return zero before the material
	// is loaded.
	ServerCertNotAfter func() time.Time
	CANotAfter         func() time.Time
}

// Server holds the collectors of one nstance-server.
type Server struct {
	reg         prometheus.Registerer
	grpc        *grpcprom.ServerMetrics
	handshakes  *prometheus.CounterVec
	registered  *prometheus.CounterVec
	transitions *prometheus.CounterVec
	provCalls   *prometheus.CounterVec
	provErrors  *prometheus.CounterVec
	provTime    *prometheus.HistogramVec
	lbCalls     *prometheus.CounterVec
	queue       queueMetrics
	fleet       *fleetCollector
	agentCerts  agentCerts
}

// New creates the server collectors and registers them (with the Go and
// process collectors) on reg.
func New(reg prometheus.Registerer, p Process) *Server {
	s := &Server{reg: reg}
	s.grpc = grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
		grpcprom.WithHistogramBuckets([]float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}),
	))
	s.handshakes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "tls_handshake_failures_total",
		Help: "Failed TLS handshakes on the gRPC listeners, by listener and reason (expired: the client certificate had expired).",
	}, []string{"listener", "reason"})
	s.registered = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "registrations_total",
		Help: "Registration calls by kind (agent, operator) and outcome (ok or the gRPC status code in snake case).",
	}, []string{"kind", "outcome"})
	s.transitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "leadership_transitions_total",
		Help: "Times this server acquired or lost leadership, by election (shard, cluster) and direction (acquired, lost).",
	}, []string{"election", "direction"})
	s.provCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "provider_calls_total", Help: "Calls to the infrastructure provider, by operation.",
	}, []string{"operation"})
	s.provErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "provider_errors_total", Help: "Provider calls that failed, by operation (status of a missing instance is no failure).",
	}, []string{"operation"})
	s.lbCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "load_balancer_calls_total",
		Help: "Calls to load balancers, by load_balancers entry, operation (register, deregister, remove, remove_stranger) and outcome (ok, error).",
	}, []string{"load_balancer", "operation", "outcome"})
	s.provTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Name: "provider_call_duration_seconds", Help: "Duration of provider calls, by operation.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"operation"})
	for _, op := range []string{"create", "status", "list", "delete"} {
		s.provCalls.WithLabelValues(op)
		s.provErrors.WithLabelValues(op)
	}
	for _, e := range []string{ElectionShard, ElectionCluster} {
		for _, d := range []string{"acquired", "lost"} {
			s.transitions.WithLabelValues(e, d)
		}
	}
	for _, k := range []string{"agent", "operator"} {
		s.registered.WithLabelValues(k, "ok")
	}
	s.queue.init()
	s.fleet = &fleetCollector{certs: &s.agentCerts, leading: func() bool {
		if p.ShardElection == nil {
			return true
		}
		leading, _ := p.ShardElection()
		return leading
	}}
	reg.MustRegister(s.grpc, s.handshakes, s.registered, s.transitions, s.provCalls, s.provErrors, s.provTime, s.lbCalls,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&processCollector{p: p, certs: &s.agentCerts, fleet: s.fleet}, s.fleet)
	s.queue.register(reg)
	return s
}

// ServerOptions are the interceptors to add to every gRPC server: the
// grpc-ecosystem server metrics, registration outcomes and the agent
// certificates seen.
func (s *Server) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(s.grpc.UnaryServerInterceptor(), s.unary),
		grpc.ChainStreamInterceptor(s.grpc.StreamServerInterceptor(), s.stream),
	}
}

// InitializeGRPC creates the gRPC series of every method srv serves at
// zero, so rates and alerts see them before the first call.
func (s *Server) InitializeGRPC(srv *grpc.Server) { s.grpc.InitializeMetrics(srv) }

func (s *Server) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	s.seeAgent(ctx, info.FullMethod)
	resp, err := h(ctx, req)
	switch info.FullMethod {
	case nstancev1.RegistrationService_RegisterAgent_FullMethodName:
		s.registered.WithLabelValues("agent", outcome(err)).Inc()
	case nstancev1.RegistrationService_RegisterOperator_FullMethodName:
		s.registered.WithLabelValues("operator", outcome(err)).Inc()
	}
	return resp, err
}

func (s *Server) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	s.seeAgent(ss.Context(), info.FullMethod)
	return h(srv, ss)
}

// seeAgent remembers the expiry of the certificate an agent presented.
func (s *Server) seeAgent(ctx context.Context, method string) {
	if !strings.HasPrefix(method, "/"+nstancev1.AgentService_ServiceDesc.ServiceName+"/") {
		return
	}
	if leaf, ok := authz.PeerCertificate(ctx); ok && leaf.Subject.CommonName != "" {
		s.agentCerts.see(leaf.Subject.CommonName, leaf.NotAfter)
	}
}

// outcome is "ok" or the snake-case gRPC code of err.
func outcome(err error) string {
	c := status.Code(err)
	if c == codes.OK {
		return "ok"
	}
	var b strings.Builder
	for i, r := range c.String() {
		if r >= 'A' && r <= 'Z' {
			if i > 0 {
				b.WriteByte('_')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// HandshakeFailed counts a failed TLS handshake and returns its reason:
// expired (the client certificate had expired), certificate (refused for
// another certificate reason), closed (the client hung up) or other.
func (s *Server) HandshakeFailed(listener string, err error) string {
	reason := "other"
	var inv x509.CertificateInvalidError
	var unk x509.UnknownAuthorityError
	switch {
	case errors.As(err, &inv) && inv.Reason == x509.Expired:
		reason = "expired"
	case errors.As(err, &inv), errors.As(err, &unk), strings.Contains(err.Error(), "certificate"):
		reason = "certificate"
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), errors.Is(err, syscall.ECONNRESET):
		reason = "closed"
	}
	s.handshakes.WithLabelValues(listener, reason).Inc()
	return reason
}

// Leading wraps an election's OnLeading hook so acquisitions and losses are
// counted; a nil inner hook waits for the term to end.
func (s *Server) Leading(election string, inner func(ctx context.Context, term int64)) func(ctx context.Context, term int64) {
	return func(ctx context.Context, term int64) {
		s.transitions.WithLabelValues(election, "acquired").Inc()
		defer s.transitions.WithLabelValues(election, "lost").Inc()
		if inner == nil {
			<-ctx.Done()
			return
		}
		inner(ctx, term)
	}
}

// Provider returns the observer for provider.Instrumented.
func (s *Server) Provider() provider.Observer { return providerObserver{s} }

type providerObserver struct{ s *Server }

func (o providerObserver) ObserveCall(op string, d time.Duration, err error) {
	o.s.provCalls.WithLabelValues(op).Inc()
	o.s.provTime.WithLabelValues(op).Observe(d.Seconds())
	if err != nil && !(op == "status" && errors.Is(err, provider.ErrNotFound)) {
		o.s.provErrors.WithLabelValues(op).Inc()
	}
}

// QueueMetrics is the work-queue metrics provider for the reconciler.
func (s *Server) QueueMetrics() workqueue.MetricsProvider { return &s.queue }

// agentCerts keeps the latest expiry each agent (by certificate common
// name, the instance id) presented.
type agentCerts struct {
	mu sync.Mutex
	m  map[string]time.Time
}

func (a *agentCerts) see(id string, notAfter time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[string]time.Time{}
	}
	if notAfter.After(a.m[id]) {
		a.m[id] = notAfter
	}
}

// soonest drops agents not in live (unless live is nil) and returns the
// earliest expiry of the rest (zero when none).
func (a *agentCerts) soonest(live map[string]bool) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	var min time.Time
	for id, t := range a.m {
		if live != nil && !live[id] {
			delete(a.m, id)
			continue
		}
		if min.IsZero() || t.Before(min) {
			min = t
		}
	}
	return min
}

// processCollector reads readiness, elections and certificates at scrape
// time.
type processCollector struct {
	p     Process
	certs *agentCerts
	fleet *fleetCollector
}

var (
	descInfo = prometheus.NewDesc(ns+"_info", "Always 1: names this server, its shard and cluster, and its version (join on instance to add the shard to other series).",
		[]string{"cluster", "shard", "server", "version"}, nil)
	descReady         = prometheus.NewDesc(ns+"_ready", "1 when the config is loaded and the cache synced.", nil, nil)
	descShardLeader   = prometheus.NewDesc(ns+"_shard_leader", "1 while this server leads its shard.", nil, nil)
	descClusterLeader = prometheus.NewDesc(ns+"_cluster_leader", "1 while this server leads the cluster.", nil, nil)
	descTerm          = prometheus.NewDesc(ns+"_election_term", "Term of the lease this server last saw, by election (shard, cluster).", []string{"election"}, nil)
	descCertExpiry    = prometheus.NewDesc(ns+"_certificate_expiry_timestamp_seconds",
		"Unix time a certificate expires: server (this server's), ca (the signing cluster CA), agent_soonest (the earliest among connected agents' client certificates).", []string{"certificate"}, nil)
)

func (c *processCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInfo, descReady, descShardLeader, descClusterLeader, descTerm, descCertExpiry} {
		ch <- d
	}
}

func (c *processCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	cluster := ""
	if c.p.Cluster != nil {
		cluster = c.p.Cluster()
	}
	gauge(descInfo, 1, cluster, c.p.Shard, c.p.ServerID, version.Version)
	if c.p.Ready != nil {
		gauge(descReady, b2f(c.p.Ready()))
	}
	for _, e := range []struct {
		name string
		desc *prometheus.Desc
		f    func() (bool, int64)
	}{{ElectionShard, descShardLeader, c.p.ShardElection}, {ElectionCluster, descClusterLeader, c.p.ClusterElection}} {
		leading, term := false, int64(0)
		if e.f != nil {
			leading, term = e.f()
		}
		gauge(e.desc, b2f(leading))
		gauge(descTerm, float64(term), e.name)
	}
	cert := func(name string, f func() time.Time) {
		if f == nil {
			return
		}
		if t := f(); !t.IsZero() {
			gauge(descCertExpiry, float64(t.Unix()), name)
		}
	}
	cert("server", c.p.ServerCertNotAfter)
	cert("ca", c.p.CANotAfter)
	cert("agent_soonest", func() time.Time { return c.certs.soonest(c.fleet.instanceIDs()) })
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// queueMetrics implements workqueue.MetricsProvider with fixed series; the
// depth is that of the newest queue (a new one is built per term).
type queueMetrics struct {
	depth       atomic.Pointer[depthGauge]
	adds        prometheus.Counter
	retries     prometheus.Counter
	wait        prometheus.Histogram
	work        prometheus.Histogram
	unfinished  prometheus.Gauge
	longestProc prometheus.Gauge
}

type depthGauge struct{ n atomic.Int64 }

func (g *depthGauge) Inc() { g.n.Add(1) }
func (g *depthGauge) Dec() { g.n.Add(-1) }

func (q *queueMetrics) init() {
	buckets := []float64{.0005, .001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	q.depth.Store(&depthGauge{})
	q.adds = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "reconcile_enqueued_total", Help: "Items added to the reconcile queue."})
	q.retries = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "reconcile_retries_total", Help: "Reconcile items re-queued after a failure."})
	q.wait = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "reconcile_queue_wait_seconds", Help: "Time an item waited in the reconcile queue.", Buckets: buckets})
	q.work = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "reconcile_duration_seconds", Help: "Time one reconcile of a group or instance took.", Buckets: buckets})
	q.unfinished = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "reconcile_unfinished_seconds", Help: "Seconds of reconcile work in progress not yet finished."})
	q.longestProc = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "reconcile_longest_running_seconds", Help: "Seconds the longest running reconcile has been running."})
}

func (q *queueMetrics) register(reg prometheus.Registerer) {
	reg.MustRegister(q.adds, q.retries, q.wait, q.work, q.unfinished, q.longestProc,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "reconcile_queue_depth", Help: "Items waiting in the reconcile queue."},
			func() float64 { return float64(q.depth.Load().n.Load()) }))
}

func (q *queueMetrics) NewDepthMetric(string) workqueue.GaugeMetric {
	g := &depthGauge{}
	q.depth.Store(g)
	return g
}
func (q *queueMetrics) NewAddsMetric(string) workqueue.CounterMetric      { return q.adds }
func (q *queueMetrics) NewLatencyMetric(string) workqueue.HistogramMetric { return q.wait }
func (q *queueMetrics) NewRetriesMetric(string) workqueue.CounterMetric   { return q.retries }
func (q *queueMetrics) NewWorkDurationMetric(string) workqueue.HistogramMetric {
	return q.work
}
func (q *queueMetrics) NewUnfinishedWorkSecondsMetric(string) workqueue.SettableGaugeMetric {
	return q.unfinished
}
func (q *queueMetrics) NewLongestRunningProcessorSecondsMetric(string) workqueue.SettableGaugeMetric {
	return q.longestProc
}

// LoadBalancerCall counts one load balancer call and its outcome (the
// reconciler's Options.LBCalls).
func (s *Server) LoadBalancerCall(lb, op string, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	s.lbCalls.WithLabelValues(lb, op, outcome).Inc()
}
