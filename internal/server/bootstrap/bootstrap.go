package bootstrap

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// Cluster is the loaded cluster key material.
type Cluster struct {
	// CA is the cluster CA: control-plane identities only. (Workload CAs
	// are per tenant and created on first use: internal/workloadca.)
	CA       *pki.CA
	NonceKey ed25519.PrivateKey
	// CABundlePEM is cluster/ca-bundle.crt: every cluster CA to trust
	// (two during a CA rotation); nil when there is none (CA alone).
	CABundlePEM []byte
}

// Options configures Ensure.
type Options struct {
	ClusterID  string
	Objects    objstore.Store
	Secrets    *secrets.Store
	Keys       layout.Keys
	CAValidity time.Duration
	// IsLeader reports whether this server may create missing material.
	IsLeader func() bool
	// RetryInterval is the wait between attempts while material is missing.
	RetryInterval time.Duration
	Log           logr.Logger
	Now           func() time.Time
}

// ErrMissing reports that material is absent and this server may not create it.
var ErrMissing = errors.New("cluster secrets are not created yet")

// Ensure loads the cluster material, creating it when this server leads,
// and retries until it succeeds or ctx ends.
func Ensure(ctx context.Context, o Options) (*Cluster, error) {
	wait := o.RetryInterval
	if wait <= 0 {
		wait = time.Second
	}
	for {
		c, err := Once(ctx, o)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, ErrMissing) {
			o.Log.Error(err, "loading cluster secrets; retrying", "in", wait)
		} else {
			o.Log.V(1).Info("waiting for the cluster leader to create the cluster secrets")
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("bootstrap: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

// Once makes a single attempt.
func Once(ctx context.Context, o Options) (*Cluster, error) {
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	leader := o.IsLeader != nil && o.IsLeader()

	nonceKey, err := loadOrCreateNonceKey(ctx, o, leader)
	if err != nil {
		return nil, err
	}
	ca, err := loadOrCreateCA(ctx, o, leader, now(), clusterCA)
	if err != nil {
		return nil, err
	}
	bundle, err := loadBundle(ctx, o)
	if err != nil {
		return nil, err
	}
	return &Cluster{CA: ca, NonceKey: nonceKey, CABundlePEM: bundle}, nil
}

func loadBundle(ctx context.Context, o Options) ([]byte, error) {
	obj, err := o.Objects.Get(ctx, o.Keys.CABundle())
	if errors.Is(err, objstore.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("loading the CA bundle: %w", err)
	}
	return obj.Body, nil
}

// LoadTrust reads the signing cluster CA and the CA bundle as they are now
// (nothing is created): what a running server re-reads to follow a CA
// rotation.
func LoadTrust(ctx context.Context, o Options) (*pki.CA, []byte, error) {
	ca, err := loadOrCreateCA(ctx, o, false, time.Time{}, clusterCA)
	if err != nil {
		return nil, nil, err
	}
	bundle, err := loadBundle(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	return ca, bundle, nil
}

// WatchTrust re-reads the signing CA and bundle every interval until ctx
// ends and applies them to trust; onSignerChange runs after the signing CA
// changed. A read that fails, or a pair that does not match (a rotation
// step between its two writes), leaves the trust as it was until the next
// read.
func WatchTrust(ctx context.Context, o Options, trust *pki.Trust, interval time.Duration, onSignerChange func()) {
	_ = wait.PollUntilContextCancel(ctx, interval, false, func(ctx context.Context) (bool, error) {
		ca, bundle, err := LoadTrust(ctx, o)
		if err == nil {
			var changed bool
			before := trust.Fingerprints()
			changed, err = trust.Update(ca, bundle)
			if err == nil {
				if after := trust.Fingerprints(); changed || !slices.Equal(before, after) {
					o.Log.Info("cluster CA trust changed", "signer", after[0], "trusted", after, "signerChanged", changed)
				}
				if changed && onSignerChange != nil {
					onSignerChange()
				}
				return false, nil
			}
		}
		if ctx.Err() == nil {
			o.Log.Error(err, "re-reading the cluster CA; keeping the current trust")
		}
		return false, nil // every interval until ctx ends
	})
}

// caKind describes a CA bootstrap creates (the cluster CA).
type caKind struct {
	name     string
	certKey  func(layout.Keys) string
	keyKey   func(layout.Keys) string
	selfSign func(clusterID string, priv ed25519.PrivateKey, validity time.Duration, now time.Time) (*pki.CA, error)
	// trustDomain is what the loaded CA must name: the cluster id for the
	// cluster CA.
	trustDomain func(clusterID string) string
}

var clusterCA = caKind{
	name: "cluster CA", certKey: layout.Keys.CACert, keyKey: layout.Keys.CAKey, selfSign: pki.SelfSignCA,
	trustDomain: func(id string) string { return id },
}

func loadOrCreateNonceKey(ctx context.Context, o Options, leader bool) (ed25519.PrivateKey, error) {
	key := o.Keys.NonceSigningKey()
	for attempt := 0; attempt < 2; attempt++ {
		pemBytes, err := o.Secrets.Get(ctx, key)
		if err == nil {
			return parseEd25519(pemBytes)
		}
		if !errors.Is(err, objstore.ErrNotFound) {
			return nil, fmt.Errorf("loading nonce-signing key: %w", err)
		}
		if !leader {
			return nil, fmt.Errorf("%w: %s is missing", ErrMissing, key)
		}
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("generating nonce-signing key: %w", err)
		}
		p, err := pki.MarshalPrivateKeyPEM(priv)
		if err != nil {
			return nil, err
		}
		err = o.Secrets.Put(ctx, key, p, objstore.PutOptions{IfNoneMatch: true})
		if err == nil {
			o.Log.Info("created the cluster nonce-signing key", "key", key)
			return priv, nil
		}
		if !errors.Is(err, objstore.ErrPreconditionFailed) {
			return nil, fmt.Errorf("storing nonce-signing key: %w", err)
		}
		// Someone else created it first: load theirs.
	}
	return nil, fmt.Errorf("nonce-signing key at %s changed while loading", key)
}

func parseEd25519(p []byte) (ed25519.PrivateKey, error) {
	k, err := pki.ParsePrivateKeyPEM(p)
	if err != nil {
		return nil, fmt.Errorf("nonce-signing key: %w", err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("nonce-signing key is %T, want Ed25519", k)
	}
	return ek, nil
}

func loadOrCreateCA(ctx context.Context, o Options, leader bool, now time.Time, kind caKind) (*pki.CA, error) {
	certKey, keyKey := kind.certKey(o.Keys), kind.keyKey(o.Keys)
	// Private key first: it is written first, and a certificate without its key is useless.
	keyPEM, err := o.Secrets.Get(ctx, keyKey)
	switch {
	case errors.Is(err, objstore.ErrNotFound):
		if !leader {
			return nil, fmt.Errorf("%w: %s is missing", ErrMissing, keyKey)
		}
		_, priv, gerr := ed25519.GenerateKey(rand.Reader)
		if gerr != nil {
			return nil, fmt.Errorf("generating %s key: %w", kind.name, gerr)
		}
		p, merr := pki.MarshalPrivateKeyPEM(priv)
		if merr != nil {
			return nil, merr
		}
		if perr := o.Secrets.Put(ctx, keyKey, p, objstore.PutOptions{IfNoneMatch: true}); perr != nil && !errors.Is(perr, objstore.ErrPreconditionFailed) {
			return nil, fmt.Errorf("storing %s key: %w", kind.name, perr)
		}
		if keyPEM, err = o.Secrets.Get(ctx, keyKey); err != nil {
			return nil, fmt.Errorf("reloading %s key: %w", kind.name, err)
		}
		o.Log.Info("created the "+kind.name+" key", "key", keyKey)
	case err != nil:
		return nil, fmt.Errorf("loading %s key: %w", kind.name, err)
	}
	obj, err := o.Objects.Get(ctx, certKey)
	switch {
	case errors.Is(err, objstore.ErrNotFound):
		if !leader {
			return nil, fmt.Errorf("%w: %s is missing", ErrMissing, certKey)
		}
		signer, perr := pki.ParsePrivateKeyPEM(keyPEM)
		if perr != nil {
			return nil, fmt.Errorf("%s key: %w", kind.name, perr)
		}
		edKey, ok := signer.(ed25519.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("%s key is %T, want Ed25519", kind.name, signer)
		}
		fresh, cerr := kind.selfSign(o.ClusterID, edKey, o.CAValidity, now)
		if cerr != nil {
			return nil, cerr
		}
		if _, perr := o.Objects.Put(ctx, certKey, fresh.CertPEM, objstore.PutOptions{IfNoneMatch: true}); perr != nil && !errors.Is(perr, objstore.ErrPreconditionFailed) {
			return nil, fmt.Errorf("storing %s certificate: %w", kind.name, perr)
		}
		o.Log.Info("created the "+kind.name+" certificate", "key", certKey)
		if obj, err = o.Objects.Get(ctx, certKey); err != nil {
			return nil, fmt.Errorf("reloading %s certificate: %w", kind.name, err)
		}
	case err != nil:
		return nil, fmt.Errorf("loading %s certificate: %w", kind.name, err)
	}
	ca, err := pki.LoadCA(obj.Body, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s in %s / %s: %w", kind.name, certKey, keyKey, err)
	}
	if got, want := ca.TrustDomain(), kind.trustDomain(o.ClusterID); got != want {
		return nil, fmt.Errorf("%s in %s names trust domain %q, want %q", kind.name, certKey, got, want)
	}
	return ca, nil
}
