package agentapi

import (
	"context"
	"crypto"
	"errors"
	"time"

	"github.com/nstance-dev/nstance/internal/server/agentlive"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// ErrUnknownInstance is returned by a Source for an instance it does not know.
var ErrUnknownInstance = errors.New("unknown instance")

// Ref identifies the calling agent's instance, taken from its certificate.
type Ref = agentlive.Ref

// FileSpec is one file an instance should hold. Either Content is set, or Key
// names a generated key whose issued certificate is the content.
type FileSpec struct {
	Path    string
	Kind    nstancev1.FileKind
	Mode    uint32
	Content []byte
	Key     string
	// Err says why the content of a secret or storage file could not be
	// read: the file is left pending (the agent keeps what it holds at
	// Path) and the error is reported. Warn says why the content delivered
	// is stale.
	Err, Warn error
}

// Plan is everything an instance should hold right now.
type Plan struct {
	Keys  []*nstancev1.KeySpec
	Files []FileSpec
}

// Source computes the plan of an instance from its template and vars.
type Source interface {
	Plan(ctx context.Context, ref Ref) (*Plan, error)
}

// StoredKey is a public key submitted by an agent and the certificate issued for it.
type StoredKey struct {
	Type         nstancev1.KeyType
	PublicKeyPEM string
	CertPEM      []byte
	// CertSpecHash identifies the CertificateSpec the certificate was issued for.
	CertSpecHash string
	NotBefore    time.Time
	NotAfter     time.Time
}

// KeyStore keeps submitted public keys and issued certificates per instance.
type KeyStore interface {
	// PutKey stores a public key, dropping any certificate issued for an older key of that name.
	PutKey(ctx context.Context, ref Ref, name string, k StoredKey) error
	// PutCertificate attaches an issued certificate to a stored key whose
	// public key is still pubPEM; otherwise it reports false.
	PutCertificate(ctx context.Context, ref Ref, name, pubPEM string, certPEM []byte, specHash string, notBefore, notAfter time.Time) (bool, error)
	// Keys returns the stored keys of an instance by name.
	Keys(ctx context.Context, ref Ref) (map[string]StoredKey, error)
	// Forget drops everything stored for an instance (it was deleted).
	Forget(instanceID string)
}

// Signer issues a certificate for a public key.
type Signer interface {
	Sign(ctx context.Context, ref Ref, spec *nstancev1.CertificateSpec, pub crypto.PublicKey) (certPEM []byte, notBefore, notAfter time.Time, err error)
}

// Refusals hears what the service refused an instance, for its tenant
// (the reconciler reports it as the instance's error).
type Refusals interface {
	ReportInstanceError(tenant, group, instanceID string, err error)
}
