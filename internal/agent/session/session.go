package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/agent/files"
	"github.com/nstance-dev/nstance/internal/agent/health"
	"github.com/nstance-dev/nstance/internal/agent/identity"
	"github.com/nstance-dev/nstance/internal/agent/keys"
	"github.com/nstance-dev/nstance/internal/msgsize"
	"github.com/nstance-dev/nstance/internal/pki"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Options configure a Session.
type Options struct {
	Addr       string
	ServerName string
	Identity   *identity.Dir
	Keys       *keys.Store
	Files      *files.Writer
	Sampler    *health.Sampler
	// Interval between health reports.
	Interval time.Duration
	// TerminationFile is read before every report (optional).
	TerminationFile string
	// Termination, when set, is asked before every report for a notice
	// the platform announced (the IMDS spot watcher); a notice in
	// TerminationFile wins.
	Termination func() *nstancev1.TerminationNotice
	// Shutdown, when set, is asked for the last report of a stopping agent:
	// a notice when the host itself is going down (hostdown), which the
	// server acts on at once. A platform notice already in the report wins.
	Shutdown func(ctx context.Context) (*nstancev1.TerminationNotice, error)
	// Backoff paces reconnection: exponential with jitter, so that the
	// agents of a shard whose leader went away do not all dial the new one
	// at the same instant. Zero fields take the defaults (500ms doubling
	// to 30s, jitter 1: each wait is between d and 2d).
	Backoff      wait.Backoff
	AgentVersion string
	Log          logr.Logger
	// FinalReportTimeout bounds the shutdown report (default 2s).
	FinalReportTimeout time.Duration
	// OnApplied, when set, is called after each delivery of files has been
	// applied (the user-data runner starts on the first).
	OnApplied func()
	// Dial, when set, opens each connection to Addr instead of plain TCP
	// (tests with thousands of agents stand in for a leader address that
	// moves without a proxy holding two more sockets per agent).
	Dial func(ctx context.Context, addr string) (net.Conn, error)
}

// Session is the agent's link to the Agent service.
type Session struct {
	o Options

	// soon asks the health loop for a report now (ReportSoon).
	soon chan struct{}

	mu         sync.Mutex
	configHash string
	reports    uint64
	renewals   int
	lost       int
}

// errRenewed ends a connection after the identity was renewed, so the next
// one presents the new certificate.
var errRenewed = errors.New("identity renewed")

// Renewals counts identity certificates installed so far.
func (s *Session) Renewals() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.renewals
}

// Lost counts connections that ended with an error (not counting the
// planned reconnects after a renewal).
func (s *Session) Lost() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lost
}

// New checks the options and returns a Session.
func New(o Options) (*Session, error) {
	if o.Addr == "" || o.Identity == nil || o.Keys == nil || o.Files == nil || o.Sampler == nil {
		return nil, errors.New("session: address, identity, keys, files and sampler are required")
	}
	if o.Interval <= 0 {
		return nil, errors.New("session: report interval must be positive")
	}
	if o.FinalReportTimeout <= 0 {
		o.FinalReportTimeout = 2 * time.Second
	}
	if o.Backoff.Duration <= 0 {
		o.Backoff.Duration = 500 * time.Millisecond
	}
	if o.Backoff.Cap < o.Backoff.Duration {
		o.Backoff.Cap = 30 * time.Second
	}
	if o.Backoff.Factor < 1 {
		o.Backoff.Factor = 2
	}
	if o.Backoff.Jitter <= 0 {
		o.Backoff.Jitter = 1
	}
	if o.Backoff.Steps <= 0 {
		// Grow until the cap (Step stops growing there), never stop.
		o.Backoff.Steps = math.MaxInt32
	}
	return &Session{o: o, soon: make(chan struct{}, 1)}, nil
}

// ReportSoon makes the session send a health report now instead of at the
// next interval (a termination notice appeared).
func (s *Session) ReportSoon() {
	select {
	case s.soon <- struct{}{}:
	default:
	}
}

// ConfigHash is the hash of the last file delivery the agent processed.
func (s *Session) ConfigHash() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.configHash
}

// Run connects and reconnects until ctx ends; it returns nil then. It returns
// an error only when the agent can no longer authenticate (no usable
// certificate).
func (s *Session) Run(ctx context.Context) error {
	b := s.o.Backoff
	for {
		start := time.Now()
		err := s.connect(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, identity.ErrNotRegistered) {
			s.o.Log.Error(err, "!!! the agent identity certificate is unusable (expired?): this agent cannot connect any more; the instance needs a new registration",
				"dir", s.o.Identity.Path(""))
			return err
		}
		if errors.Is(err, errRenewed) {
			s.o.Log.Info("reconnecting with the renewed identity", "addr", s.o.Addr)
			b = s.o.Backoff
			continue
		}
		if time.Since(start) > 4*s.o.Interval+s.o.Backoff.Cap {
			b = s.o.Backoff // the connection had been up: start again from the shortest wait
		}
		s.mu.Lock()
		s.lost++
		s.mu.Unlock()
		d := b.Step()
		s.o.Log.Error(err, "agent connection lost; reconnecting", "addr", s.o.Addr, "after", d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// connect runs one connection until a stream fails or ctx ends.
func (s *Session) connect(ctx context.Context) error {
	tlsCfg, err := s.o.Identity.AgentTLS(s.o.ServerName)
	if err != nil {
		return err
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)), msgsize.DialOption(),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
	}
	if s.o.Dial != nil {
		opts = append(opts, grpc.WithContextDialer(s.o.Dial))
	}
	conn, err := grpc.NewClient(s.o.Addr, opts...)
	if err != nil {
		return fmt.Errorf("session: dialing %s: %w", s.o.Addr, err)
	}
	defer conn.Close()
	client := nstancev1.NewAgentServiceClient(conn)

	// Streams live on their own context so the final report can still be
	// sent after ctx ends.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	kick := make(chan struct{}, 1)
	errs := make(chan error, 3)
	var wg sync.WaitGroup
	run := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- f()
		}()
	}
	run(func() error { return s.keyLoop(sctx, client) })
	run(func() error { return s.fileLoop(sctx, client, kick) })
	run(func() error { return s.healthLoop(ctx, sctx, client, kick) })
	var first error
	select {
	case first = <-errs:
	case <-ctx.Done():
		// Let the health loop send its final report, bounded.
		select {
		case first = <-errs:
		case <-time.After(s.o.FinalReportTimeout + time.Second):
		}
	}
	cancel()
	wg.Wait()
	return first
}

func (s *Session) keyLoop(ctx context.Context, c nstancev1.AgentServiceClient) error {
	names, err := s.o.Keys.Names()
	if err != nil {
		return err
	}
	stream, err := c.KeyGenRequests(ctx, &nstancev1.KeyGenRequestsRequest{ExistingKeyNames: names})
	if err != nil {
		return fmt.Errorf("key requests: %w", err)
	}
	for {
		req, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("key requests: %w", err)
		}
		req, idSpec := splitIdentityKey(req)
		pubs, err := s.o.Keys.Apply(req)
		if err != nil {
			// A request the agent cannot honour is logged; the next one may
			// be fine. The identity renewal goes ahead regardless.
			s.o.Log.Error(err, "cannot apply key request", "hash", req.GetConfigHash())
			if idSpec == nil {
				continue
			}
			pubs = nil
		}
		if idSpec != nil {
			pem, err := s.o.Identity.PendingPublicKeyPEM()
			if err != nil {
				s.o.Log.Error(err, "cannot create the identity renewal key; the server will ask again")
			} else {
				s.o.Log.Info("server asked for a new identity key; submitting it")
				pubs = append(pubs, &nstancev1.PublicKey{Name: idSpec.GetName(), Type: idSpec.GetType(), PublicKeyPem: pem})
			}
		}
		resp, err := c.SubmitPublicKeys(ctx, &nstancev1.SubmitPublicKeysRequest{Keys: pubs})
		if err != nil {
			return fmt.Errorf("submitting public keys: %w", err)
		}
		for _, r := range resp.GetRejected() {
			s.o.Log.Error(errors.New(r.GetReason()), "server rejected a public key", "key", r.GetName())
		}
		s.o.Log.V(1).Info("public keys submitted", "accepted", len(resp.GetAccepted()))
	}
}

func (s *Session) fileLoop(ctx context.Context, c nstancev1.AgentServiceClient, kick chan<- struct{}) error {
	stream, err := c.ReceiveFiles(ctx, &nstancev1.ReceiveFilesRequest{ConfigHash: s.ConfigHash()})
	if err != nil {
		return fmt.Errorf("receive files: %w", err)
	}
	for {
		d, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("receive files: %w", err)
		}
		d, idFile := splitIdentityFile(d)
		renewed, idErr := false, error(nil)
		if idFile != nil {
			renewed, idErr = s.o.Identity.InstallRenewed(idFile.GetContent())
			if idErr != nil {
				// Keep the old hash so the server's drift check sends it again.
				s.o.Log.Error(idErr, "cannot install the renewed identity certificate; keeping the current one")
			}
		}
		bad := 0
		for _, st := range s.o.Files.Apply(d) {
			if st.GetState() != nstancev1.FileState_FILE_STATE_OK {
				bad++
				s.o.Log.Error(errors.New(st.GetMessage()), "delivered file rejected", "path", st.GetPath())
			}
		}
		s.mu.Lock()
		if idErr == nil {
			s.configHash = d.GetConfigHash()
		}
		if renewed {
			s.renewals++
		}
		s.mu.Unlock()
		s.o.Log.Info("files applied", "files", len(d.GetFiles()), "rejected", bad, "hash", d.GetConfigHash())
		if s.o.OnApplied != nil {
			s.o.OnApplied()
		}
		if renewed {
			if c, err := s.o.Identity.Certificate(time.Now()); err == nil {
				s.o.Log.Info("identity certificate renewed", "serial", c.Leaf.SerialNumber.String(), "not_after", c.Leaf.NotAfter)
			}
			return errRenewed
		}
		select {
		case kick <- struct{}{}:
		default:
		}
	}
}

// Report builds one health report from a fresh sample.
func (s *Session) Report(now time.Time) (*nstancev1.HealthReport, error) {
	r, err := s.o.Sampler.Sample(now)
	if err != nil {
		return nil, err
	}
	r.Files = s.o.Files.Status()
	r.ConfigHash = s.ConfigHash()
	r.AgentVersion = s.o.AgentVersion
	if n, err := health.ReadTermination(s.o.TerminationFile); err != nil {
		s.o.Log.Error(err, "reading termination notice")
	} else {
		r.Termination = n
	}
	if r.Termination == nil && s.o.Termination != nil {
		r.Termination = s.o.Termination()
	}
	return r, nil
}

func (s *Session) healthLoop(parent, ctx context.Context, c nstancev1.AgentServiceClient, kick <-chan struct{}) error {
	stream, err := c.ReportHealth(ctx)
	if err != nil {
		return fmt.Errorf("report health: %w", err)
	}
	send := func() error {
		r, err := s.Report(time.Now())
		if err != nil {
			s.o.Log.Error(err, "sampling health")
			return nil
		}
		if err := stream.Send(r); err != nil {
			if errors.Is(err, io.EOF) {
				_, err = stream.CloseAndRecv()
			}
			return fmt.Errorf("report health: %w", err)
		}
		s.mu.Lock()
		s.reports++
		s.mu.Unlock()
		return nil
	}
	if err := send(); err != nil {
		return err
	}
	t := time.NewTicker(s.o.Interval)
	defer t.Stop()
	for {
		select {
		case <-parent.Done():
			return s.final(stream)
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		case <-kick:
		case <-s.soon:
		}
		if err := send(); err != nil {
			return err
		}
	}
}

// final sends a last report and closes the stream. It carries a termination
// notice only when the platform announced one or the host is shutting down
// (Options.Shutdown): an agent process stopping (an upgrade, a restart under
// Air) says nothing about the VM, and the server replaces instances whose VM
// is going away.
func (s *Session) final(stream nstancev1.AgentService_ReportHealthClient) error {
	r, err := s.Report(time.Now())
	if err != nil {
		return err
	}
	if r.Termination == nil && s.o.Shutdown != nil {
		ctx, cancel := context.WithTimeout(context.Background(), s.o.FinalReportTimeout)
		n, err := s.o.Shutdown(ctx)
		cancel()
		if err != nil {
			s.o.Log.Error(err, "could not tell whether the host is shutting down; the last report says nothing")
		}
		r.Termination = n
	}
	done := make(chan error, 1)
	go func() {
		if err := stream.Send(r); err != nil {
			done <- err
			return
		}
		resp, err := stream.CloseAndRecv()
		if err == nil {
			s.o.Log.Info("health stream closed", "reports_received", resp.GetReportsReceived())
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(s.o.FinalReportTimeout):
		return errors.New("final health report timed out")
	}
}

// splitIdentityKey takes the identity renewal key out of a key request:
// it is kept in the identity directory, not in the key store.
func splitIdentityKey(req *nstancev1.KeyGenRequest) (*nstancev1.KeyGenRequest, *nstancev1.KeySpec) {
	var id *nstancev1.KeySpec
	rest := make([]*nstancev1.KeySpec, 0, len(req.GetKeys()))
	for _, k := range req.GetKeys() {
		if k.GetName() == pki.AgentIdentityKeyName && k.GetCertificate() == nil {
			id = k
			continue
		}
		rest = append(rest, k)
	}
	if id == nil {
		return req, nil
	}
	return &nstancev1.KeyGenRequest{Keys: rest, ConfigHash: req.GetConfigHash(), SentAt: req.GetSentAt()}, id
}

// splitIdentityFile takes a renewed identity certificate out of a delivery:
// it goes to the identity directory, never among the agent's files.
func splitIdentityFile(d *nstancev1.FileDelivery) (*nstancev1.FileDelivery, *nstancev1.DeliveredFile) {
	var id *nstancev1.DeliveredFile
	rest := make([]*nstancev1.DeliveredFile, 0, len(d.GetFiles()))
	for _, f := range d.GetFiles() {
		if f.GetKind() == nstancev1.FileKind_FILE_KIND_AGENT_IDENTITY {
			id = f
			continue
		}
		rest = append(rest, f)
	}
	if id == nil {
		return d, nil
	}
	return &nstancev1.FileDelivery{Files: rest, ConfigHash: d.GetConfigHash(), SentAt: d.GetSentAt(), PendingPaths: d.GetPendingPaths()}, id
}
