package workloadca

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// DefaultTTL is how long a loaded CA or transition state is reused.
const DefaultTTL = 10 * time.Second

// Transition is cluster/workload-ca-transition.json.
type Transition struct {
	// Fingerprint (SHA-256 of the DER) names the shared CA it is about.
	Fingerprint string `json:"fingerprint"`
	// StartedAt is when the first server of per-tenant CAs found the
	// shared CA; from then on nothing signs with it.
	StartedAt time.Time `json:"started_at"`
	// TrustedUntil: the shared CA is in every tenant's bundle until then
	// (every certificate it signed has expired by then).
	TrustedUntil time.Time `json:"trusted_until"`
}

// Store hands out each tenant's workload CA and bundle. It is used by the
// shard leader's Agent service; it creates a tenant's CA the first time the
// tenant needs one (key first, both create-only, so two leaders racing end
// with one CA: the loser reloads the winner's).
type Store struct {
	Objects objstore.Store
	// Secrets seals the CA keys like every other cluster secret.
	Secrets   *secrets.Store
	Keys      layout.Keys
	ClusterID string
	// Validity of a CA created here.
	Validity time.Duration
	// TransitionGrace is how long, from the moment the first server finds
	// the shared workload CA of an older cluster, that CA stays in the
	// tenants' bundles: the longest workload certificate validity of any
	// shard plus a margin. Nil or not positive: one day; an error is logged
	// and the duration it came with used.
	TransitionGrace func(ctx context.Context) (time.Duration, error)
	// TTL of the cache (default DefaultTTL): a replaced CA applies within it.
	TTL time.Duration
	Now func() time.Time
	Log logr.Logger

	mu     sync.Mutex
	cas    map[string]entry
	shared *sharedEntry
}

type entry struct {
	ca *pki.CA
	at time.Time
}

type sharedEntry struct {
	// cert is the shared CA while it is still trusted (nil: none, or its
	// transition is over).
	cert *x509.Certificate
	at   time.Time
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Store) ttl() time.Duration {
	if s.TTL > 0 {
		return s.TTL
	}
	return DefaultTTL
}

// CA returns tenant's workload CA, creating it when the tenant has none.
func (s *Store) CA(ctx context.Context, tenant string) (*pki.CA, error) {
	if err := layout.ValidateID("tenant", tenant); err != nil {
		return nil, err
	}
	s.mu.Lock()
	e, ok := s.cas[tenant]
	s.mu.Unlock()
	if ok && s.now().Sub(e.at) < s.ttl() {
		return e.ca, nil
	}
	ca, err := s.loadOrCreate(ctx, tenant)
	if err != nil {
		// A failure is not remembered: the next call retries.
		return nil, err
	}
	s.mu.Lock()
	if s.cas == nil {
		s.cas = map[string]entry{}
	}
	s.cas[tenant] = entry{ca: ca, at: s.now()}
	s.mu.Unlock()
	return ca, nil
}

// Bundle is what tenant's instances trust for workload certificates (their
// ca_bundle files): the tenant's own CA and, during the transition of a
// cluster that had one shared workload CA, that CA too.
func (s *Store) Bundle(ctx context.Context, tenant string) ([]byte, error) {
	ca, err := s.CA(ctx, tenant)
	if err != nil {
		return nil, err
	}
	shared, err := s.sharedCA(ctx)
	if err != nil {
		return nil, err
	}
	out := append([]byte(nil), ca.CertPEM...)
	if shared != nil {
		out = append(out, pki.EncodeBundle(shared)...)
	}
	return out, nil
}

func (s *Store) loadOrCreate(ctx context.Context, tenant string) (*pki.CA, error) {
	certKey, keyKey := s.Keys.TenantWorkloadCACert(tenant), s.Keys.TenantWorkloadCAKey(tenant)
	what := "workload CA of tenant " + tenant
	// Private key first: it is written first, and a certificate without its key is useless.
	keyPEM, err := s.Secrets.Get(ctx, keyKey)
	switch {
	case errors.Is(err, objstore.ErrNotFound):
		_, priv, gerr := ed25519.GenerateKey(rand.Reader)
		if gerr != nil {
			return nil, fmt.Errorf("generating the %s key: %w", what, gerr)
		}
		p, merr := pki.MarshalPrivateKeyPEM(priv)
		if merr != nil {
			return nil, merr
		}
		if perr := s.Secrets.Put(ctx, keyKey, p, objstore.PutOptions{IfNoneMatch: true}); perr != nil && !errors.Is(perr, objstore.ErrPreconditionFailed) {
			return nil, fmt.Errorf("storing the %s key: %w", what, perr)
		}
		if keyPEM, err = s.Secrets.Get(ctx, keyKey); err != nil {
			return nil, fmt.Errorf("reloading the %s key: %w", what, err)
		}
		s.Log.Info("created the "+what+" key", "key", keyKey)
	case err != nil:
		return nil, fmt.Errorf("loading the %s key: %w", what, err)
	}
	obj, err := s.Objects.Get(ctx, certKey)
	switch {
	case errors.Is(err, objstore.ErrNotFound):
		signer, perr := pki.ParsePrivateKeyPEM(keyPEM)
		if perr != nil {
			return nil, fmt.Errorf("%s key: %w", what, perr)
		}
		edKey, ok := signer.(ed25519.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("%s key is %T, want Ed25519", what, signer)
		}
		fresh, cerr := pki.SelfSignTenantWorkloadCA(s.ClusterID, tenant, edKey, s.Validity, s.now())
		if cerr != nil {
			return nil, cerr
		}
		if _, perr := s.Objects.Put(ctx, certKey, fresh.CertPEM, objstore.PutOptions{IfNoneMatch: true}); perr != nil && !errors.Is(perr, objstore.ErrPreconditionFailed) {
			return nil, fmt.Errorf("storing the %s certificate: %w", what, perr)
		}
		s.Log.Info("created the "+what, "key", certKey, "sha256", pki.Fingerprint(fresh.Cert))
		if obj, err = s.Objects.Get(ctx, certKey); err != nil {
			return nil, fmt.Errorf("reloading the %s certificate: %w", what, err)
		}
	case err != nil:
		return nil, fmt.Errorf("loading the %s certificate: %w", what, err)
	}
	ca, err := pki.LoadCA(obj.Body, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s in %s / %s: %w", what, certKey, keyKey, err)
	}
	if td := ca.TrustDomain(); td != "" {
		return nil, fmt.Errorf("%s in %s names trust domain %q: a workload CA names none", what, certKey, td)
	}
	if cn := pki.TenantWorkloadCACommonName(s.ClusterID, tenant); ca.Cert.Subject.CommonName != cn {
		return nil, fmt.Errorf("%s in %s is %q, want %q (another tenant's or cluster's CA?)", what, certKey, ca.Cert.Subject.CommonName, cn)
	}
	return ca, nil
}

// sharedCA is the shared workload CA of a cluster from before per-tenant
// CAs while its transition lasts, else nil. The first call that finds it
// records the transition (create-only), so every server ends it at the same
// time.
func (s *Store) sharedCA(ctx context.Context) (*x509.Certificate, error) {
	s.mu.Lock()
	e := s.shared
	s.mu.Unlock()
	if e != nil && s.now().Sub(e.at) < s.ttl() {
		return e.cert, nil
	}
	cert, err := s.loadShared(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.shared = &sharedEntry{cert: cert, at: s.now()}
	s.mu.Unlock()
	return cert, nil
}

func (s *Store) loadShared(ctx context.Context) (*x509.Certificate, error) {
	obj, err := s.Objects.Get(ctx, s.Keys.WorkloadCACert())
	if errors.Is(err, objstore.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the shared workload CA: %w", err)
	}
	cert, err := pki.ParseCertificatePEM(obj.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Keys.WorkloadCACert(), err)
	}
	tr, err := s.transition(ctx, cert)
	if err != nil {
		return nil, err
	}
	if !s.now().Before(tr.TrustedUntil) {
		return nil, nil
	}
	return cert, nil
}

// transition reads the transition record, writing it when absent.
func (s *Store) transition(ctx context.Context, shared *x509.Certificate) (Transition, error) {
	key := s.Keys.WorkloadCATransition()
	fp := pki.Fingerprint(shared)
	for attempt := 0; attempt < 2; attempt++ {
		obj, err := s.Objects.Get(ctx, key)
		if err == nil {
			var tr Transition
			if err := json.Unmarshal(obj.Body, &tr); err != nil {
				return Transition{}, fmt.Errorf("%s is not a valid transition record: %w", key, err)
			}
			if tr.Fingerprint != fp {
				// Another shared CA than the one recorded (put back by hand):
				// it signed nothing since, so it is not trusted.
				return Transition{Fingerprint: fp}, nil
			}
			return tr, nil
		}
		if !errors.Is(err, objstore.ErrNotFound) {
			return Transition{}, fmt.Errorf("reading %s: %w", key, err)
		}
		grace := 24 * time.Hour
		if s.TransitionGrace != nil {
			g, gerr := s.TransitionGrace(ctx)
			if g > 0 {
				grace = g
			}
			if gerr != nil {
				s.Log.Error(gerr, "reading the workload certificate validities of every shard; the shared workload CA stays trusted for this server's", "grace", grace)
			}
		}
		now := s.now().UTC()
		tr := Transition{Fingerprint: fp, StartedAt: now, TrustedUntil: now.Add(grace)}
		b, err := json.MarshalIndent(tr, "", "  ")
		if err != nil {
			return Transition{}, err
		}
		_, err = s.Objects.Put(ctx, key, append(b, '\n'), objstore.PutOptions{IfNoneMatch: true})
		if err == nil {
			s.Log.Info("the shared workload CA signs nothing any more; it stays in every tenant's bundle until its certificates have expired",
				"sha256", fp, "trustedUntil", tr.TrustedUntil)
			return tr, nil
		}
		if !errors.Is(err, objstore.ErrPreconditionFailed) {
			return Transition{}, fmt.Errorf("writing %s: %w", key, err)
		}
		// Another server wrote it first: read theirs.
	}
	return Transition{}, fmt.Errorf("%s changed while reading it", key)
}
