package grpcserve

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"runtime/debug"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/authz"
	"github.com/nstance-dev/nstance/internal/server/limits"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Config is everything the listeners need.
type Config struct {
	ClusterID string
	// ServerCert is presented on all three listeners, unless
	// GetCertificate is set (a certificate renewed while serving).
	ServerCert     tls.Certificate
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// ClientCAs verifies client certificates on the mTLS listeners.
	ClientCAs *x509.CertPool
	// Gate, when set, refuses revoked client certificates on the mTLS
	// listeners: at the handshake, on every RPC, and on open streams.
	Gate authz.Gate
	// ClientCAsFunc, when set, replaces ClientCAs and is read at every
	// handshake (the trusted bundle changes during a CA rotation).
	ClientCAsFunc func() *x509.CertPool

	Registration nstancev1.RegistrationServiceServer
	Operator     nstancev1.OperatorServiceServer
	Agent        nstancev1.AgentServiceServer

	// Extra options added to every grpc.Server (e.g. metrics interceptors).
	ServerOptions []grpc.ServerOption
	// OnServer, when set, sees every grpc.Server once its service is
	// registered (the metrics pre-initialise their series per method).
	OnServer func(*grpc.Server)
	// Log receives handler panics (the server answers Internal and keeps serving).
	Log logr.Logger
	// Limits are shard.limits; unset values take their defaults.
	Limits config.Limits
	// OnHandshakeError, when set, hears every failed TLS handshake with the
	// listener's name ("registration", "operator", "agent"), e.g. a client
	// presenting an expired certificate.
	OnHandshakeError func(listener string, err error)
	// listenerNames maps listening ports to listener names (set by Start).
	listenerNames map[string]string
	// PanicHook makes a unary call that carries metadata PanicHookHeader
	// panic after authorization. Test only: the attack suite (test/attack)
	// sets PanicHookEnv to prove the recovery black-box.
	PanicHook bool
}

// PanicHookEnv is the server variable that turns Config.PanicHook on ("1");
// only tests set it.
const PanicHookEnv = "NSTANCE_TEST_PANIC_HOOK"

// PanicHookHeader is the request metadata key that triggers the panic hook.
const PanicHookHeader = "x-nstance-test-panic"

// panicHook panics inside the handler chain when the caller asks for it.
func panicHook(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get(PanicHookHeader)) > 0 {
		panic("test panic hook (" + PanicHookEnv + ") in " + info.FullMethod)
	}
	return h(ctx, req)
}

// Listeners are the three network listeners. Any may be nil to skip that service.
type Listeners struct {
	Registration net.Listener
	Operator     net.Listener
	Agent        net.Listener
}

// Servers are running gRPC servers.
type Servers struct {
	servers []*grpc.Server
	wg      sync.WaitGroup
	mu      sync.Mutex
	errs    []error
}

// Start serves each non-nil listener in its own goroutine.
func Start(cfg Config, ls Listeners) (*Servers, error) {
	if cfg.ClientCAs == nil && cfg.ClientCAsFunc == nil {
		return nil, errors.New("grpcserve: client CA pool is required")
	}
	lim := cfg.Limits.WithDefaults()
	ka := transportOptions(lim)
	s := &Servers{}
	cfg.listenerNames = listenerNames(ls)
	newServer := func(tlsCfg *tls.Config, extra ...grpc.ServerOption) *grpc.Server {
		if cfg.GetCertificate != nil {
			tlsCfg.Certificates, tlsCfg.GetCertificate = nil, cfg.GetCertificate
		}
		creds := cfg.observed(credentials.NewTLS(tlsCfg))
		// Recovery first, so a panic anywhere below (other interceptors,
		// handlers) ends only its own RPC.
		opts := append([]grpc.ServerOption{grpc.Creds(creds),
			grpc.ChainUnaryInterceptor(RecoverUnary(cfg.Log)), grpc.ChainStreamInterceptor(RecoverStream(cfg.Log))}, ka...)
		opts = append(opts, cfg.ServerOptions...)
		opts = append(opts, cfg.gateOptions(tlsCfg)...)
		opts = append(opts, extra...)
		if cfg.PanicHook {
			opts = append(opts, grpc.ChainUnaryInterceptor(panicHook))
		}
		return grpc.NewServer(opts...)
	}
	if ls.Registration != nil {
		if cfg.Registration == nil {
			return nil, errors.New("grpcserve: registration listener without a service")
		}
		rl := limits.NewKeyedRate(lim.RegistrationRate.PerMinute, lim.RegistrationRate.Burst, lim.RegistrationSources, nil)
		regOpts := append(registrationTransport(lim),
			grpc.ChainUnaryInterceptor(limits.RatePerSource(rl, "shard.limits.registration_rate")))
		g := newServer(pki.ServerTLS(cfg.ServerCert, nil, false), regOpts...)
		nstancev1.RegisterRegistrationServiceServer(g, cfg.Registration)
		cfg.registered(g)
		s.serve("registration", g, s.limitSources(cfg.Log, "registration", ls.Registration, lim.MaxConnectionsPerSource))
	}
	if ls.Operator != nil {
		if cfg.Operator == nil {
			s.Stop()
			return nil, errors.New("grpcserve: operator listener without a service")
		}
		// The watch limit comes after authentication: it counts per identity.
		watches := limits.NewCounter(lim.MaxWatchesPerOperator)
		opOpts := append(authz.Policy{Roles: []pki.Role{pki.RoleOperator, pki.RoleAdmin}, ClusterID: cfg.ClusterID}.ServerOptions(),
			grpc.ChainStreamInterceptor(limits.StreamsPerKey(watches, identityKey, "shard.limits.max_watches_per_operator")))
		g := newServer(mtlsConfig(cfg), opOpts...)
		nstancev1.RegisterOperatorServiceServer(g, cfg.Operator)
		cfg.registered(g)
		s.serve("operator", g, s.limitSources(cfg.Log, "operator", ls.Operator, lim.MaxConnectionsPerSource))
	}
	if ls.Agent != nil {
		if cfg.Agent == nil {
			s.Stop()
			return nil, errors.New("grpcserve: agent listener without a service")
		}
		// Thousands of agents keep a connection each: small per-connection
		// buffers and a shared write buffer cut the server's memory by about
		// a quarter (bench/agents) at no cost for their small messages.
		agentStreams := limits.NewCounter(lim.MaxStreamsPerAgent)
		agentOpts := append(authz.Policy{Roles: []pki.Role{pki.RoleAgent}, ClusterID: cfg.ClusterID}.ServerOptions(),
			grpc.ChainStreamInterceptor(limits.StreamsPerKey(agentStreams, identityKey, "shard.limits.max_streams_per_agent")))
		agentOpts = append(agentOpts, agentBuffers()...)
		g := newServer(mtlsConfig(cfg), agentOpts...)
		nstancev1.RegisterAgentServiceServer(g, cfg.Agent)
		cfg.registered(g)
		s.serve("agent", g, s.limitSources(cfg.Log, "agent", ls.Agent, lim.MaxConnectionsPerSource))
	}
	return s, nil
}

func (cfg Config) registered(g *grpc.Server) {
	if cfg.OnServer != nil {
		cfg.OnServer(g)
	}
}

// transportOptions are the keepalive and size options of every listener.
func transportOptions(lim config.Limits) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		// A client opening more streams than this on one connection gets
		// them refused (RST_STREAM REFUSED_STREAM); gRPC clients queue instead.
		grpc.MaxConcurrentStreams(uint32(lim.MaxConcurrentStreams)),
		grpc.MaxRecvMsgSize(lim.MaxMessageBytes),
		grpc.MaxSendMsgSize(lim.MaxMessageBytes),
	}
}

// Transport bounds of the anonymous Registration listener. A client may
// hold open at most registrationStreams streams per connection, each with at
// most registrationWindow bytes in flight beyond the message being read.
const (
	registrationStreams = 8
	// registrationWindow is both the stream and the connection window: the
	// HTTP/2 minimum (smaller values are ignored by grpc-go). Setting it
	// turns off grpc-go's bandwidth-delay estimate, which would otherwise
	// grow every window to 16 MiB for a client that sends fast.
	registrationWindow = 64 << 10
	// registrationHeaderBytes bounds a request's header list (grpc-go
	// accepts 16 MiB by default); a registration sends a few hundred bytes.
	registrationHeaderBytes = 16 << 10
	// registrationHandshake bounds the TLS and HTTP/2 handshake (grpc-go
	// waits 120 s by default).
	registrationHandshake = 10 * time.Second
	// A registration is one short call: an idle connection is closed after
	// a minute, any connection after five (a stream whose message never
	// completes ends with it).
	registrationIdle     = time.Minute
	registrationMaxAge   = 5 * time.Minute
	registrationAgeGrace = 30 * time.Second
	// registrationWorkers registrations run on goroutines kept between
	// calls (grpc-go stream workers; more at once get a goroutine each, as
	// without workers). A registration's storage writes go deep (the S3
	// SDK's middleware stack), and a fresh goroutine per call grew its
	// stack every time: 8 % of the CPU of bench/registration with dev-s3.
	registrationWorkers = 16
)

// registrationTransport overrides transportOptions on the anonymous
// Registration listener so that what one connection makes the server hold
// stays small. grpc-go reads a message's 5-byte header, checks the length
// against the receive limit and then grants the stream flow-control window
// for the whole announced length (rpc_util.go recvMsg, inFlow.maybeAdjust):
// with max_message_bytes, a client announcing 15 MiB may send, and have the
// server buffer, 15 MiB per stream, all before any interceptor (the rate
// limit) runs. max_registration_message_bytes refuses such a header at
// once; the static windows bound a stream that never announces a length.
func registrationTransport(lim config.Limits) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(lim.MaxRegistrationMessageBytes),
		grpc.MaxConcurrentStreams(uint32(min(lim.MaxConcurrentStreams, registrationStreams))),
		grpc.InitialWindowSize(registrationWindow),
		grpc.InitialConnWindowSize(registrationWindow),
		grpc.MaxHeaderListSize(registrationHeaderBytes),
		grpc.ConnectionTimeout(registrationHandshake),
		grpc.NumStreamWorkers(registrationWorkers),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second,
			MaxConnectionIdle: registrationIdle, MaxConnectionAge: registrationMaxAge, MaxConnectionAgeGrace: registrationAgeGrace}),
	}
}

// agentBuffers are the agent listener's per-connection buffer options.
func agentBuffers() []grpc.ServerOption {
	// (grpc-go shares its write buffers by default.)
	return []grpc.ServerOption{grpc.ReadBufferSize(4 << 10), grpc.WriteBufferSize(4 << 10)}
}

// AgentTransportOptions are the gRPC transport options of the agent
// listener (keepalive, stream and message limits, buffers) without its
// interceptors: bench/agents serves its gRPC floor with exactly these.
func AgentTransportOptions(lim config.Limits) []grpc.ServerOption {
	return append(transportOptions(lim.WithDefaults()), agentBuffers()...)
}

// mtlsConfig is the TLS configuration of the mutual-TLS listeners: client
// certificates verified against the client CA pool (read at each handshake
// when it can change) and admitted by the revocation gate when there is one.
func mtlsConfig(cfg Config) *tls.Config {
	c := pki.ServerTLS(cfg.ServerCert, cfg.ClientCAs, true)
	if cfg.Gate != nil {
		// A revoked certificate gets no connection.
		c.VerifyConnection = AdmitConnection(cfg.ClusterID, cfg.Gate)
	}
	if cfg.ClientCAsFunc != nil {
		// Last: the per-handshake config copies c as set up here.
		pki.DynamicClientCAs(c, cfg.ClientCAsFunc)
	}
	return c
}

// identityKey is what the per-caller stream limits count against: the
// caller's certificate identity (tenant, role and client id).
func identityKey(ctx context.Context) (string, bool) {
	id, ok := authz.IdentityFrom(ctx)
	if !ok {
		return "", false
	}
	return id.Tenant + "/" + string(id.Role) + "/" + id.ClientID, true
}

// limitSources caps connections per source address on ln, logging refusals
// at most once a minute per listener.
func (s *Servers) limitSources(log logr.Logger, name string, ln net.Listener, max int) net.Listener {
	sl := limits.LimitSources(ln, max)
	var mu sync.Mutex
	var last time.Time
	sl.OnRefused = func(src string) {
		mu.Lock()
		defer mu.Unlock()
		if now := time.Now(); now.Sub(last) >= time.Minute {
			last = now
			log.Info("refusing connections beyond shard.limits.max_connections_per_source", "listener", name, "source", src, "max", max)
		}
	}
	return sl
}

// RecoverUnary turns a panic in a unary handler into codes.Internal and logs
// it with the method and stack; the server keeps serving.
func RecoverUnary(log logr.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				resp, err = nil, panicked(log, info.FullMethod, r)
			}
		}()
		return h(ctx, req)
	}
}

// RecoverStream is RecoverUnary for streaming handlers.
func RecoverStream(log logr.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = panicked(log, info.FullMethod, r)
			}
		}()
		return h(srv, ss)
	}
}

func panicked(log logr.Logger, method string, r any) error {
	log.Error(fmt.Errorf("panic: %v", r), "gRPC handler panicked; answering Internal", "method", method, "stack", string(debug.Stack()))
	return status.Error(codes.Internal, "internal error")
}

func (s *Servers) serve(name string, g *grpc.Server, ln net.Listener) {
	s.servers = append(s.servers, g)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := g.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.mu.Lock()
			s.errs = append(s.errs, fmt.Errorf("%s listener: %w", name, err))
			s.mu.Unlock()
		}
	}()
}

// Stop closes every listener and connection at once.
func (s *Servers) Stop() {
	for _, g := range s.servers {
		g.Stop()
	}
	s.wg.Wait()
}

// GracefulStop stops accepting, lets running RPCs finish for up to timeout,
// then stops hard (long-lived streams would otherwise block forever).
func (s *Servers) GracefulStop(timeout time.Duration) {
	done := make(chan struct{})
	go func() {
		for _, g := range s.servers {
			g.GracefulStop()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		s.Stop()
	}
	s.wg.Wait()
}

// Err returns serve errors seen so far.
func (s *Servers) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}

// gateOptions are the per-RPC and stream interceptors that make an mTLS
// server (one that requires client certificates) consult cfg.Gate; the
// handshake consults it through mtlsConfig. None without a gate or for the
// Registration listener.
func (cfg Config) gateOptions(tlsCfg *tls.Config) []grpc.ServerOption {
	if cfg.Gate == nil || tlsCfg.ClientAuth != tls.RequireAndVerifyClientCert {
		return nil
	}
	return authz.GateOptions(cfg.ClusterID, cfg.Gate)
}

// AdmitConnection is a tls.Config.VerifyConnection that refuses client
// certificates the gate does not admit. Certificates that carry no client
// identity are left to the role check of the interceptors.
func AdmitConnection(clusterID string, gate authz.Gate) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
			return nil
		}
		leaf := cs.VerifiedChains[0][0]
		id, err := pki.IdentityFromCert(leaf, clusterID)
		if err != nil {
			return nil
		}
		return gate.AdmitHandshake(leaf, id)
	}
}
