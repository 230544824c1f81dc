package agenttest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/agentapi"
	"github.com/nstance-dev/nstance/internal/server/agentlive"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/registration"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Names used by the test shard.
const (
	ClusterID = "test-cluster"
	ShardID   = "dev-1"
	Tenant    = "acme"
)

// Instance is a test instance: its template and vars.
type Instance struct {
	ID       string
	Group    string
	Template config.Template
	Vars     map[string]string
}

// Shard is the in-process server side.
type Shard struct {
	// CA is the cluster CA; WorkloadCA signs what templates ask for.
	CA         *pki.CA
	WorkloadCA *pki.CA
	nonceKey   ed25519.PrivateKey
	objects    *memstore.Store
	// Records are the instance records registration admits agents against.
	Records *instances.Store
	log     logr.Logger

	// RepushInterval is passed to agentapi (set before Start).
	RepushInterval time.Duration
	// AgentValidity of issued agent certificates (default 1h; set before
	// Start). Identity renewal through the Agent streams is on.
	AgentValidity time.Duration
	// FileStreams counts ReceiveFiles streams opened (an agent that keeps
	// reconnecting makes it grow).
	FileStreams atomic.Int64
	// HandshakeFailures counts TLS handshakes refused on both listeners for
	// the client's certificate (or any reason but the client hanging up).
	HandshakeFailures atomic.Int64
	// HandshakesAborted counts handshakes the client broke off (EOF,
	// connection reset): a client killed mid-handshake, not a refusal.
	HandshakesAborted atomic.Int64
	// Refused counts deliveries the Agent service refused to send (Refusals).
	Refused atomic.Int64
	// Revoked counts instances whose agent certificates the Agent service
	// revoked (RevokeInstance: two holders of one identity).
	Revoked atomic.Int64
	// TwoHolderGrace is passed to agentapi (set before Start).
	TwoHolderGrace time.Duration
	// Now, when set before Start, is agentapi's clock (tests that step
	// through a grace period); certificates are still issued at real time.
	Now func() time.Time

	mu        sync.Mutex
	instances map[string]*Instance
	servers   *grpcserve.Servers
	regAddr   string
	agentAddr string
	Agent     *agentapi.Server
	Keys      *agentapi.MemKeyStore
	Health    *agentlive.Table
}

// New creates the CA and nonce key; call Start to serve.
func New(log logr.Logger) (*Shard, error) {
	ca, err := pki.GenerateCA(ClusterID, 24*time.Hour, time.Now())
	if err != nil {
		return nil, err
	}
	wca, err := pki.GenerateWorkloadCA(ClusterID, 24*time.Hour, time.Now())
	if err != nil {
		return nil, err
	}
	_, nk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	objects := memstore.New()
	return &Shard{CA: ca, WorkloadCA: wca, nonceKey: nk, objects: objects, Records: instances.NewStore(objects, layout.New(""), ShardID, nil),
		log: log, instances: map[string]*Instance{}}, nil
}

// RegistrationAddr and AgentAddr are the listening addresses (stable across restarts).
func (s *Shard) RegistrationAddr() string { s.mu.Lock(); defer s.mu.Unlock(); return s.regAddr }

// AgentAddr is the Agent service address.
func (s *Shard) AgentAddr() string { s.mu.Lock(); defer s.mu.Unlock(); return s.agentAddr }

func listen(addr string) (net.Listener, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var err error
	for range 50 { // a just-closed port can take a moment to be free again
		var ln net.Listener
		if ln, err = net.Listen("tcp", addr); err == nil {
			return ln, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, err
}

// Start serves both services, on the previous ports when restarting. Every
// start has fresh agentapi state (key store, health tracker), as a real
// server restart would.
func (s *Shard) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.servers != nil {
		return fmt.Errorf("agenttest: already running")
	}
	regLn, err := listen(s.regAddr)
	if err != nil {
		return err
	}
	agLn, err := listen(s.agentAddr)
	if err != nil {
		regLn.Close()
		return err
	}
	s.regAddr, s.agentAddr = regLn.Addr().String(), agLn.Addr().String()
	keys := layout.New("")
	validity := s.AgentValidity
	if validity <= 0 {
		validity = time.Hour
	}
	issuer := &registration.Issuer{CA: s.CA, ClusterID: ClusterID, AgentValidity: validity, OperatorValidity: time.Hour}
	reg := registration.New(registration.Options{
		ClusterID: ClusterID, Shard: ShardID, ServerID: "test-server", Issuer: issuer, NonceKey: s.nonceKey.Public().(ed25519.PublicKey),
		Store: s.objects, Keys: keys, Instances: &registration.InstanceGate{Records: s.Records}, Log: s.log.WithName("registration"),
	})
	s.Keys = agentapi.NewMemKeyStore()
	s.Health = agentlive.New()
	src := &agentapi.TemplateSource{Lookup: s.lookup, CABundle: s.WorkloadCA.CertPEM}
	policy := func() pki.WorkloadPolicy {
		return pki.WorkloadPolicy{TrustDomain: ClusterID, ServerHosts: []string{"127.0.0.1", "::1", "localhost"}}
	}
	s.Agent, err = agentapi.New(agentapi.Options{
		Shard: ShardID, Source: src, Keys: s.Keys, Signer: &agentapi.WorkloadSigner{CA: s.WorkloadCA, MaxValidity: time.Hour, Policy: policy},
		Live: s.Health, Log: s.log.WithName("agentapi"), RepushInterval: s.RepushInterval,
		Refusals:      refusalCounter{&s.Refused},
		RenewIdentity: issuer.RenewAgentPEM, TwoHolderGrace: s.TwoHolderGrace, Now: s.Now,
		RevokeInstance: func(context.Context, string, string) error {
			s.Revoked.Add(1)
			return nil
		},
	})
	if err != nil {
		return err
	}
	cert, err := s.CA.ServerKeyPair(pki.ServerIdentity{Shard: ShardID, ServerID: "nstance-server"}, []string{"127.0.0.1"}, time.Hour, time.Now())
	if err != nil {
		return err
	}
	s.servers, err = grpcserve.Start(grpcserve.Config{
		ClusterID: ClusterID, ServerCert: cert, ClientCAs: s.CA.Pool(), Registration: reg, Agent: s.Agent, Log: s.log.WithName("grpc"),
		ServerOptions: []grpc.ServerOption{grpc.ChainStreamInterceptor(s.countFileStreams)},
		OnHandshakeError: func(_ string, err error) {
			if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) {
				s.HandshakesAborted.Add(1)
				return
			}
			s.HandshakeFailures.Add(1)
		},
	}, grpcserve.Listeners{Registration: regLn, Agent: agLn})
	return err
}

func (s *Shard) countFileStreams(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if info.FullMethod == nstancev1.AgentService_ReceiveFiles_FullMethodName {
		s.FileStreams.Add(1)
	}
	return h(srv, ss)
}

// Stop closes listeners and every connection at once.
func (s *Shard) Stop() {
	s.mu.Lock()
	srv := s.servers
	s.servers = nil
	s.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

func (s *Shard) lookup(_ context.Context, ref agentapi.Ref) (*agentapi.TemplateInput, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, ok := s.instances[ref.InstanceID]
	if !ok {
		return nil, fmt.Errorf("%w: %s", agentapi.ErrUnknownInstance, ref.InstanceID)
	}
	return &agentapi.TemplateInput{Template: in.Template, Data: agentapi.TemplateData{
		InstanceID: in.ID, Tenant: ref.Tenant, Shard: ref.Shard, Group: in.Group, Vars: maps.Clone(in.Vars),
	}}, nil
}

// Add records an instance and prepares its identity directory (nonce and CA
// files, as the local providers do) under dir/<id>/identity. It returns the
// agent's environment.
func (s *Shard) Add(in Instance, dir string) ([]string, error) {
	tok, err := nonce.Mint(s.nonceKey, nonce.Claims{Kind: nonce.KindAgent, ClusterID: ClusterID, Tenant: Tenant, Shard: ShardID, Group: in.Group,
		RegisteredClaims: nonceSubject(in.ID)}, 10*time.Minute, time.Now())
	if err != nil {
		return nil, err
	}
	// The instance's record, as the reconciler writes it before the provider
	// starts the instance; its agent connects from loopback.
	err = s.Records.Create(context.Background(), &instances.Record{ID: in.ID, Tenant: Tenant, GroupID: in.Group, Shard: ShardID,
		State: instances.StateCreating, Addresses: []string{"127.0.0.1"}, CreatedAt: time.Now().UTC()})
	if err != nil {
		return nil, err
	}
	idDir := filepath.Join(dir, in.ID, "identity")
	if err := os.MkdirAll(idDir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(idDir, "nonce.jwt"), []byte(tok), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(idDir, "ca.crt"), s.CA.CertPEM, 0o644); err != nil {
		return nil, err
	}
	s.mu.Lock()
	c := in
	c.Vars = maps.Clone(in.Vars)
	s.instances[in.ID] = &c
	s.mu.Unlock()
	return []string{
		"NSTANCE_INSTANCE_ID=" + in.ID,
		"NSTANCE_SHARD=" + ShardID,
		"NSTANCE_IDENTITY_DIR=" + idDir,
		"NSTANCE_REGISTRATION_ADDR=" + s.RegistrationAddr(),
		"NSTANCE_AGENT_ADDR=" + s.AgentAddr(),
	}, nil
}

// SetVars replaces an instance's vars and tells connected agents.
func (s *Shard) SetVars(id string, vars map[string]string) {
	s.mu.Lock()
	if in, ok := s.instances[id]; ok {
		in.Vars = maps.Clone(vars)
	}
	agent := s.Agent
	s.mu.Unlock()
	agent.Notify(id)
}

// SetTemplate replaces an instance's template without telling anyone (to
// exercise drift detection through health reports) unless notify is set.
func (s *Shard) SetTemplate(id string, t config.Template, notify bool) {
	s.mu.Lock()
	if in, ok := s.instances[id]; ok {
		in.Template = t
	}
	agent := s.Agent
	s.mu.Unlock()
	if notify {
		agent.Notify(id)
	}
}

// refusalCounter counts what the Agent service refused (Shard.Refused).
type refusalCounter struct{ n *atomic.Int64 }

func (c refusalCounter) ReportInstanceError(string, string, string, error) { c.n.Add(1) }
