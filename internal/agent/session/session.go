package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/nstance-dev/nstance/internal/agent/backoff"
	"github.com/nstance-dev/nstance/internal/agent/files"
	"github.com/nstance-dev/nstance/internal/agent/health"
	"github.com/nstance-dev/nstance/internal/agent/identity"
	"github.com/nstance-dev/nstance/internal/agent/keys"
	"github.com/nstance-dev/nstance/internal/msgsize"
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
	Backoff         backoff.Backoff
	AgentVersion    string
	Log             logr.Logger
	// FinalReportTimeout bounds the shutdown report (default 2s).
	FinalReportTimeout time.Duration
}

// Session is the agent's link to the Agent service.
type Session struct {
	o Options

	mu         sync.Mutex
	configHash string
	connects   int
	reports    uint64
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
	if o.Backoff.Min <= 0 {
		o.Backoff.Min = 500 * time.Millisecond
	}
	if o.Backoff.Max < o.Backoff.Min {
		o.Backoff.Max = 30 * time.Second
	}
	if o.Backoff.Jitter == 0 {
		o.Backoff.Jitter = 0.2
	}
	return &Session{o: o}, nil
}

// ConfigHash is the hash of the last file delivery the agent processed.
func (s *Session) ConfigHash() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.configHash
}

// Connects counts connections established so far.
func (s *Session) Connects() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.connects
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
			return err
		}
		if time.Since(start) > 4*s.o.Interval+b.Max {
			b.Reset()
		}
		s.o.Log.Error(err, "agent connection lost; reconnecting", "addr", s.o.Addr)
		if b.Wait(ctx) != nil {
			return nil
		}
	}
}

// connect runs one connection until a stream fails or ctx ends.
func (s *Session) connect(ctx context.Context) error {
	tlsCfg, err := s.o.Identity.AgentTLS(s.o.ServerName)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(s.o.Addr,
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)), msgsize.DialOption(),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
	)
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
	s.mu.Lock()
	s.connects++
	s.mu.Unlock()
	for {
		req, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("key requests: %w", err)
		}
		pubs, err := s.o.Keys.Apply(req)
		if err != nil {
			// A request the agent cannot honour is logged; the next one may be fine.
			s.o.Log.Error(err, "cannot apply key request", "hash", req.GetConfigHash())
			continue
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
		bad := 0
		for _, st := range s.o.Files.Apply(d) {
			if st.GetState() != nstancev1.FileState_FILE_STATE_OK {
				bad++
				s.o.Log.Error(errors.New(st.GetMessage()), "delivered file rejected", "path", st.GetPath())
			}
		}
		s.mu.Lock()
		s.configHash = d.GetConfigHash()
		s.mu.Unlock()
		s.o.Log.Info("files applied", "files", len(d.GetFiles()), "rejected", bad, "hash", d.GetConfigHash())
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
		}
		if err := send(); err != nil {
			return err
		}
	}
}

// final sends a last report and closes the stream. It carries a termination
// notice only when the platform announced one: an agent process stopping
// (an upgrade, a restart under Air) says nothing about the VM, and the server
// replaces instances whose VM is going away.
func (s *Session) final(stream nstancev1.AgentService_ReportHealthClient) error {
	r, err := s.Report(time.Now())
	if err != nil {
		return err
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
