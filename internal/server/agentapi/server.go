package agentapi

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/keytype"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/agentlive"
	"github.com/nstance-dev/nstance/internal/server/authz"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Request limits.
const (
	maxSubmittedKeys = 64
	maxPublicKeyPEM  = 16 << 10
	maxReportFiles   = 4096
)

// Options configure a Server.
type Options struct {
	// Shard is the shard this server runs; agents whose certificate names
	// another shard are refused.
	Shard  string
	Source Source
	Keys   KeyStore
	Signer Signer
	// Live is the term's live table: every accepted health report and
	// every open stream is recorded there.
	Live *agentlive.Table
	Log  logr.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// RepushInterval is the shortest gap between two drift-triggered pushes
	// to one instance, and how long after a push a differing hash is still
	// considered in flight (default 30s).
	RepushInterval time.Duration
	// RenewFraction: a certificate is re-issued once less than this share of
	// its lifetime remains (default 1/3).
	RenewFraction float64
	// MaxFileBytes caps the total file content of one delivery
	// (shard.limits.max_file_bytes; default config.DefaultMaxFileBytes). A
	// larger delivery is not sent: the server logs why, tells Refusals,
	// and the agent keeps its stream and its current files.
	MaxFileBytes int
	// Refusals, when set, hears once per file set why a delivery was not
	// sent, and once per change of the set of files whose source (secret
	// store, AWS, storage object) failed or is stale (the fleet reports it
	// to the instance's tenant).
	Refusals Refusals
	// RenewIdentity, when set, renews agents' identity certificates
	// through the streams (see identity.go); nil turns renewal off.
	RenewIdentity RenewIdentityFunc
	// IdentityRenewAfter is the share of an identity certificate's lifetime
	// after which it is renewed (default 2/3).
	IdentityRenewAfter float64
	// IdentityRetry is the longest wait before asking again for an identity
	// key the agent has not submitted (default 1m; shorter for short-lived
	// certificates).
	IdentityRetry time.Duration
	// RevokeInstance revokes the agent certificates of an instance issued
	// so far; it is called when two holders of one identity show up (see
	// holders.go). Nil: the caller is only refused.
	RevokeInstance func(ctx context.Context, instanceID, reason string) error
	// TwoHolderGrace is how long after a renewed identity certificate was
	// first presented a call with the certificate it superseded is still
	// taken for the same agent's old connection (default 30s; holders.go).
	TwoHolderGrace time.Duration
}

// Server implements nstancev1.AgentServiceServer.
type Server struct {
	nstancev1.UnimplementedAgentServiceServer
	o       Options
	hub     hub
	holders holders
}

var _ nstancev1.AgentServiceServer = (*Server)(nil)

// New checks the options and returns a Server.
func New(o Options) (*Server, error) {
	if o.Shard == "" || o.Source == nil || o.Keys == nil || o.Signer == nil || o.Live == nil {
		return nil, errors.New("agentapi: shard, source, key store, signer and live table are required")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.RepushInterval <= 0 {
		o.RepushInterval = 30 * time.Second
	}
	if o.RenewFraction <= 0 || o.RenewFraction >= 1 {
		o.RenewFraction = 1.0 / 3
	}
	if o.MaxFileBytes <= 0 {
		o.MaxFileBytes = config.DefaultMaxFileBytes
	}
	if o.IdentityRenewAfter <= 0 || o.IdentityRenewAfter >= 1 {
		o.IdentityRenewAfter = 2.0 / 3
	}
	if o.IdentityRetry <= 0 {
		o.IdentityRetry = time.Minute
	}
	if o.TwoHolderGrace <= 0 {
		o.TwoHolderGrace = 30 * time.Second
	}
	return &Server{o: o, hub: hub{byID: map[string]*instanceState{}}}, nil
}

// Forget drops what the service holds for a deleted instance: its
// submitted keys and issued certificates, and which renewed identity it
// uses. (The live table is forgotten by its owner.)
func (s *Server) Forget(instanceID string) {
	s.o.Keys.Forget(instanceID)
	s.holders.forget(instanceID)
}

// Notify makes the open streams of the given instances re-plan and push
// whatever changed (template or var change). With no ids, every connected
// instance is re-planned.
func (s *Server) Notify(instanceIDs ...string) {
	if len(instanceIDs) == 0 {
		s.hub.notifyAll()
		return
	}
	for _, id := range instanceIDs {
		s.hub.notify(id, false)
	}
}

func (s *Server) refFrom(ctx context.Context) (Ref, error) {
	id, ok := authz.IdentityFrom(ctx)
	if !ok {
		return Ref{}, status.Error(codes.Unauthenticated, "no caller identity")
	}
	if id.Role != pki.RoleAgent {
		return Ref{}, status.Errorf(codes.PermissionDenied, "role %q may not use the agent service", id.Role)
	}
	if id.Shard != s.o.Shard {
		s.o.Log.Info("agent of another shard refused", "instance", id.ClientID, "tenant", id.Tenant, "certificate_shard", id.Shard)
		return Ref{}, status.Error(codes.PermissionDenied, "the agent certificate was not issued for this shard")
	}
	ref := Ref{InstanceID: id.ClientID, Tenant: id.Tenant, Shard: id.Shard, Group: id.Group}
	if err := s.checkHolder(ctx, ref); err != nil {
		return Ref{}, err
	}
	return ref, nil
}

func (s *Server) plan(ctx context.Context, ref Ref) (*Plan, error) {
	p, err := s.o.Source.Plan(ctx, ref)
	switch {
	case errors.Is(err, ErrUnknownInstance):
		return nil, status.Errorf(codes.NotFound, "instance %s is not known to this shard", ref.InstanceID)
	case err != nil:
		return nil, status.Errorf(codes.Unavailable, "planning instance %s: %v", ref.InstanceID, err)
	}
	return p, nil
}

// KeyGenRequests implements nstancev1.AgentServiceServer.
func (s *Server) KeyGenRequests(req *nstancev1.KeyGenRequestsRequest, stream nstancev1.AgentService_KeyGenRequestsServer) error {
	ctx := stream.Context()
	ref, err := s.refFrom(ctx)
	if err != nil {
		return err
	}
	w := s.hub.add(ref.InstanceID)
	defer s.hub.remove(ref.InstanceID, w)
	defer s.o.Live.Connect(ref)()
	last := ""
	var asked time.Time
	for {
		var (
			keys []*nstancev1.KeySpec
			id   identityStatus
			h    string
		)
		now := s.o.Now()
		// Planning renders templates and hashes; it runs on a goroutine of
		// its own so this long-lived handler's stack stays small.
		err := offStack(func() error {
			p, err := s.plan(ctx, ref)
			if err != nil {
				return err
			}
			keys, id = p.Keys, s.identityStatus(ctx, ref)
			if id.due(now) {
				keys = append(append([]*nstancev1.KeySpec{}, keys...), identityKeySpec())
			}
			h = hashKeys(keys)
			return nil
		})
		if err != nil {
			return err
		}
		due := id.due(now)
		if h != last || (due && now.Sub(asked) >= s.identityRetry(id)) {
			msg := &nstancev1.KeyGenRequest{Keys: keys, ConfigHash: h, SentAt: timestamppb.New(now)}
			if err := stream.Send(msg); err != nil {
				return err
			}
			last = h
			if due {
				if !asked.IsZero() {
					s.o.Log.Info("agent has not submitted its new identity key yet; asking again", "instance", ref.InstanceID,
						"not_after", id.leaf.NotAfter)
				}
				asked = now
			}
		}
		if !due {
			asked = time.Time{}
		}
		var timer *time.Timer
		switch {
		case due:
			timer = time.NewTimer(s.identityRetry(id))
		case !id.renewAt.IsZero():
			timer = time.NewTimer(max(id.renewAt.Sub(now), 0) + 10*time.Millisecond)
		default:
			timer = time.NewTimer(time.Hour)
		}
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-w.ch:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// SubmitPublicKeys implements nstancev1.AgentServiceServer.
func (s *Server) SubmitPublicKeys(ctx context.Context, req *nstancev1.SubmitPublicKeysRequest) (*nstancev1.SubmitPublicKeysResponse, error) {
	ref, err := s.refFrom(ctx)
	if err != nil {
		return nil, err
	}
	if len(req.GetKeys()) > maxSubmittedKeys {
		return nil, status.Errorf(codes.InvalidArgument, "keys: more than %d entries", maxSubmittedKeys)
	}
	p, err := s.plan(ctx, ref)
	if err != nil {
		return nil, err
	}
	specs := map[string]*nstancev1.KeySpec{}
	for _, k := range p.Keys {
		specs[k.GetName()] = k
	}
	resp := &nstancev1.SubmitPublicKeysResponse{}
	seen := map[string]bool{}
	reject := func(name, format string, args ...any) {
		resp.Rejected = append(resp.Rejected, &nstancev1.RejectedKey{Name: name, Reason: fmt.Sprintf(format, args...)})
	}
	for _, k := range req.GetKeys() {
		name := k.GetName()
		spec, ok := specs[name]
		switch {
		case name == pki.AgentIdentityKeyName && !seen[name]:
			seen[name] = true
			if ok, why := s.renewIdentity(ctx, ref, k); ok {
				resp.Accepted = append(resp.Accepted, name)
			} else {
				reject(name, "%s", why)
			}
			continue
		case seen[name]:
			reject(name, "submitted twice")
			continue
		case !ok:
			reject(name, "the instance template asks for no key of this name")
			continue
		case k.GetType() != spec.GetType():
			reject(name, "type %s does not match the requested %s", k.GetType(), spec.GetType())
			continue
		case len(k.GetPublicKeyPem()) > maxPublicKeyPEM:
			reject(name, "public key PEM longer than %d bytes", maxPublicKeyPEM)
			continue
		}
		seen[name] = true
		pub, err := parsePublicKey(k.GetPublicKeyPem())
		if err != nil {
			reject(name, "%v", err)
			continue
		}
		if got := keytype.Of(pub); got != spec.GetType() {
			reject(name, "public key is %s, requested %s", got, spec.GetType())
			continue
		}
		if err := s.o.Keys.PutKey(ctx, ref, name, StoredKey{Type: k.GetType(), PublicKeyPEM: k.GetPublicKeyPem()}); err != nil {
			return nil, status.Errorf(codes.Unavailable, "storing key %s: %v", name, err)
		}
		resp.Accepted = append(resp.Accepted, name)
	}
	changed, err := s.issue(ctx, ref, p)
	if err != nil {
		return nil, err
	}
	if changed {
		s.hub.notify(ref.InstanceID, false)
	}
	s.o.Log.V(1).Info("public keys submitted", "instance", ref.InstanceID, "accepted", len(resp.Accepted), "rejected", len(resp.Rejected))
	return resp, nil
}

// issue signs every certificate the plan asks for that is missing, was issued
// for another spec, or is due for renewal. It reports whether any changed.
func (s *Server) issue(ctx context.Context, ref Ref, p *Plan) (bool, error) {
	stored, err := s.o.Keys.Keys(ctx, ref)
	if err != nil {
		return false, status.Errorf(codes.Unavailable, "reading stored keys: %v", err)
	}
	now := s.o.Now()
	changed := false
	for _, spec := range p.Keys {
		cs := spec.GetCertificate()
		if cs == nil {
			continue
		}
		sk, ok := stored[spec.GetName()]
		if !ok || sk.Type != spec.GetType() {
			continue
		}
		specHash := hashMessage(cs)
		if len(sk.CertPEM) > 0 && sk.CertSpecHash == specHash && !s.renewDue(sk, now) {
			continue
		}
		pub, err := parsePublicKey(sk.PublicKeyPEM)
		if err != nil {
			s.o.Log.Error(err, "stored public key unusable", "instance", ref.InstanceID, "key", spec.GetName())
			continue
		}
		certPEM, nb, na, err := s.o.Signer.Sign(ctx, ref, cs, pub)
		if err != nil {
			s.o.Log.Error(err, "issuing certificate", "instance", ref.InstanceID, "key", spec.GetName())
			continue
		}
		ok, err = s.o.Keys.PutCertificate(ctx, ref, spec.GetName(), sk.PublicKeyPEM, certPEM, specHash, nb, na)
		if err != nil {
			return changed, status.Errorf(codes.Unavailable, "storing certificate %s: %v", spec.GetName(), err)
		}
		changed = changed || ok
	}
	return changed, nil
}

func (s *Server) renewDue(k StoredKey, now time.Time) bool {
	life := k.NotAfter.Sub(k.NotBefore)
	return life <= 0 || k.NotAfter.Sub(now) < time.Duration(float64(life)*s.o.RenewFraction)
}

// Files returns the complete file set of an instance and its hash, issuing
// any certificate that is missing or due for renewal first. Certificate files
// whose certificate is not issued yet are left out (see Delivery).
func (s *Server) Files(ctx context.Context, ref Ref) ([]*nstancev1.DeliveredFile, string, error) {
	d, err := s.Delivery(ctx, ref)
	if err != nil {
		return nil, "", err
	}
	return d.GetFiles(), d.GetConfigHash(), nil
}

// Delivery is the file delivery of an instance: its complete file set, the
// paths whose content is not ready yet (so the agent keeps what it has
// there), and the hash.
func (s *Server) Delivery(ctx context.Context, ref Ref) (*nstancev1.FileDelivery, error) {
	d, _, err := s.delivery(ctx, ref)
	return d, err
}

// delivery is Delivery with the problems of the files whose source failed
// (left pending) or served a stale value.
func (s *Server) delivery(ctx context.Context, ref Ref) (*nstancev1.FileDelivery, []error, error) {
	p, err := s.plan(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	if _, err := s.issue(ctx, ref, p); err != nil {
		return nil, nil, err
	}
	stored, err := s.o.Keys.Keys(ctx, ref)
	if err != nil {
		return nil, nil, status.Errorf(codes.Unavailable, "reading stored keys: %v", err)
	}
	out := make([]*nstancev1.DeliveredFile, 0, len(p.Files))
	var pending []string
	var problems []error
	for _, f := range p.Files {
		if f.Err != nil {
			// Its source failed: the agent keeps what it has; a later
			// re-plan (drift check, notify) delivers it once readable.
			pending, problems = append(pending, f.Path), append(problems, f.Err)
			continue
		}
		if f.Warn != nil {
			problems = append(problems, f.Warn)
		}
		content := f.Content
		if f.Key != "" {
			sk, ok := stored[f.Key]
			if !ok || len(sk.CertPEM) == 0 {
				pending = append(pending, f.Path) // not issued yet; a later push carries it
				continue
			}
			content = sk.CertPEM
		}
		sum := sha256.Sum256(content)
		out = append(out, &nstancev1.DeliveredFile{Path: f.Path, Content: content, Mode: f.Mode, Kind: f.Kind, Sha256: hex.EncodeToString(sum[:])})
	}
	if f := identityFile(s.identityStatus(ctx, ref)); f != nil {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	sort.Strings(pending)
	return &nstancev1.FileDelivery{Files: out, PendingPaths: pending, ConfigHash: HashFiles(out)}, problems, nil
}

// ReceiveFiles implements nstancev1.AgentServiceServer.
func (s *Server) ReceiveFiles(req *nstancev1.ReceiveFilesRequest, stream nstancev1.AgentService_ReceiveFilesServer) error {
	ctx := stream.Context()
	ref, err := s.refFrom(ctx)
	if err != nil {
		return err
	}
	w := s.hub.add(ref.InstanceID)
	defer s.hub.remove(ref.InstanceID, w)
	defer s.o.Live.Connect(ref)()
	last, refusing, reported := req.GetConfigHash(), false, ""
	for {
		var (
			d        *nstancev1.FileDelivery
			problems []error
		)
		// Off this long-lived handler's stack, like KeyGenRequests' plan.
		if err := offStack(func() (err error) { d, problems, err = s.delivery(ctx, ref); return err }); err != nil {
			return err
		}
		reported = s.reportFileProblems(ref, problems, reported)
		h := d.GetConfigHash()
		s.hub.setDesired(ref.InstanceID, h)
		if size := deliverySize(d); size > s.o.MaxFileBytes {
			// Sending it would exceed the message limit and the agent would
			// fail and reconnect for ever; keep the stream instead. Said once
			// each time deliveries start being refused, however often drift
			// re-plans it or the set changes (an issued certificate arriving)
			// while it stays too large.
			w.force.Store(false)
			if !refusing {
				refusing = true
				err := fmt.Errorf("files of instance %s total %d bytes, more than shard.limits.max_file_bytes (%d); not delivered, the agent keeps its current files",
					ref.InstanceID, size, s.o.MaxFileBytes)
				s.o.Log.Error(err, "file delivery refused", "instance", ref.InstanceID, "tenant", ref.Tenant, "hash", h)
				if s.o.Refusals != nil {
					s.o.Refusals.ReportInstanceError(ref.Tenant, ref.Group, ref.InstanceID, err)
				}
			}
		} else {
			refusing = false
			if h != last || w.force.Swap(false) {
				d.SentAt = timestamppb.New(s.o.Now())
				if err := stream.Send(d); err != nil {
					return err
				}
				s.hub.sent(ref.InstanceID, s.o.Now())
				s.o.Log.V(1).Info("files pushed", "instance", ref.InstanceID, "files", len(d.GetFiles()), "pending", len(d.GetPendingPaths()), "hash", h)
				last = h
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-w.ch:
		}
	}
}

func deliverySize(d *nstancev1.FileDelivery) int {
	n := 0
	for _, f := range d.GetFiles() {
		n += len(f.GetContent())
	}
	return n
}

// ReportHealth implements nstancev1.AgentServiceServer.
func (s *Server) ReportHealth(stream nstancev1.AgentService_ReportHealthServer) error {
	ctx := stream.Context()
	ref, err := s.refFrom(ctx)
	if err != nil {
		return err
	}
	var n uint64
	var last time.Time
	for {
		r, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			resp := &nstancev1.ReportHealthResponse{ReportsReceived: n}
			if n > 0 {
				resp.LastReportAt = timestamppb.New(last)
			}
			return stream.SendAndClose(resp)
		}
		if err != nil {
			return err
		}
		if len(r.GetFiles()) > maxReportFiles {
			return status.Errorf(codes.InvalidArgument, "files: more than %d entries", maxReportFiles)
		}
		last = s.o.Now()
		if err := s.o.Live.RecordHealth(ctx, ref, r, last); err != nil {
			return status.Errorf(codes.Unavailable, "recording health: %v", err)
		}
		n++
		if s.hub.checkDue(ref.InstanceID, last, s.o.RepushInterval) {
			// Re-plan now and then, so a change nobody announced is still noticed.
			var h string
			if offStack(func() (err error) { _, h, err = s.Files(ctx, ref); return err }) == nil {
				s.hub.setDesired(ref.InstanceID, h)
			}
		}
		switch {
		case !hasFileErrors(r.GetFiles()):
			s.hub.fileFixReset(ref.InstanceID)
		case s.hub.fileFixDue(ref.InstanceID, last, s.o.RepushInterval):
			if err := offStack(func() error { _, err := s.RemedyFiles(ctx, ref, r.GetFiles()); return err }); err != nil {
				s.o.Log.Error(err, "remedying files reported in error", "instance", ref.InstanceID)
			}
		}
		if s.hub.drifted(ref.InstanceID, r.GetConfigHash(), last, s.o.RepushInterval) {
			s.o.Log.Info("runtime config drift, pushing files again", "instance", ref.InstanceID, "agent_hash", r.GetConfigHash())
		}
	}
}

// offStack runs f on a short-lived goroutine and waits for it. The stream
// handlers live as long as the agent's connection and a goroutine's stack
// keeps the size its deepest call needed (a GC halves it only while less
// than a quarter is in use), so the deep work (template rendering, signing,
// hashing) runs where its stack is freed right after. A panic in f is
// re-raised in the caller, where the recovery interceptor sees it.
func offStack(f func() error) error {
	var (
		err      error
		panicked any
		done     = make(chan struct{})
	)
	go func() {
		defer close(done)
		defer func() { panicked = recover() }()
		err = f()
	}()
	<-done
	if panicked != nil {
		panic(panicked)
	}
	return err
}

// HashFiles is the config hash of a complete file set: SHA-256 over the
// sorted paths with kind, mode and content hash.
func HashFiles(files []*nstancev1.DeliveredFile) string {
	sorted := append([]*nstancev1.DeliveredFile(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	h := sha256.New()
	for _, f := range sorted {
		fmt.Fprintf(h, "%s\x00%d\x00%o\x00%s\n", f.GetPath(), f.GetKind(), f.GetMode(), f.GetSha256())
	}
	return hex.EncodeToString(h.Sum(nil))
}

func hashKeys(keys []*nstancev1.KeySpec) string {
	h := sha256.New()
	for _, k := range keys {
		h.Write([]byte(hashMessage(k)))
	}
	return hex.EncodeToString(h.Sum(nil))
}

func hashMessage(m proto.Message) string {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func parsePublicKey(s string) (crypto.PublicKey, error) {
	b, rest := pem.Decode([]byte(s))
	if b == nil || b.Type != "PUBLIC KEY" {
		return nil, errors.New("no PUBLIC KEY PEM block")
	}
	if len(strings.TrimSpace(string(rest))) != 0 {
		return nil, errors.New("data after the PUBLIC KEY block")
	}
	pub, err := x509.ParsePKIXPublicKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing public key: %w", err)
	}
	return pub, nil
}

// hub tracks the open streams of each instance so changes can wake them.
type hub struct {
	mu   sync.Mutex
	byID map[string]*instanceState
}

type instanceState struct {
	watchers   map[*watcher]struct{}
	desired    string
	lastSent   time.Time
	lastRepush time.Time
	lastCheck  time.Time
	// lastFileFix is when files reported in error were last remedied,
	// fileFixGap the wait before the next remedy (fileFixDue).
	lastFileFix time.Time
	fileFixGap  time.Duration
}

type watcher struct {
	ch    chan struct{}
	force atomic.Bool
}

func (h *hub) state(id string) *instanceState {
	st, ok := h.byID[id]
	if !ok {
		st = &instanceState{watchers: map[*watcher]struct{}{}}
		h.byID[id] = st
	}
	return st
}

func (h *hub) add(id string) *watcher {
	w := &watcher{ch: make(chan struct{}, 1)}
	h.mu.Lock()
	h.state(id).watchers[w] = struct{}{}
	h.mu.Unlock()
	return w
}

func (h *hub) remove(id string, w *watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.byID[id]
	if st == nil {
		return
	}
	delete(st.watchers, w)
	if len(st.watchers) == 0 {
		delete(h.byID, id)
	}
}

func wake(w *watcher, force bool) {
	if force {
		w.force.Store(true)
	}
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

func (h *hub) notify(id string, force bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if st := h.byID[id]; st != nil {
		for w := range st.watchers {
			wake(w, force)
		}
	}
}

func (h *hub) notifyAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, st := range h.byID {
		for w := range st.watchers {
			wake(w, false)
		}
	}
}

func (h *hub) setDesired(id, hash string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if st := h.byID[id]; st != nil {
		st.desired = hash
	}
}

// checkDue reports whether the desired hash of an instance with open streams
// should be recomputed (at most once per gap).
func (h *hub) checkDue(id string, now time.Time, gap time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.byID[id]
	if st == nil || now.Sub(st.lastCheck) < gap {
		return false
	}
	st.lastCheck = now
	return true
}

func (h *hub) sent(id string, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if st := h.byID[id]; st != nil {
		st.lastSent = at
	}
}

// drifted reports (and acts on) an agent hash that differs from the desired
// one long enough after the last push: the file streams are forced to push.
func (h *hub) drifted(id, agentHash string, now time.Time, gap time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.byID[id]
	if st == nil || st.desired == "" || st.desired == agentHash {
		return false
	}
	if now.Sub(st.lastSent) < gap || now.Sub(st.lastRepush) < gap {
		return false
	}
	st.lastRepush = now
	for w := range st.watchers {
		wake(w, true)
	}
	return true
}
