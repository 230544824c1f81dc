package bootstrap

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/regoutcome"
)

// Keys inside the ConfigMap and Secrets.
const (
	CAKey         = "ca.crt"
	PrivateKeyKey = "private.key"
	PublicKeyKey  = "public.key"
	NonceKey      = "nonce.jwt"
	CertKey       = corev1.TLSCertKey       // tls.crt
	CertKeyKey    = corev1.TLSPrivateKeyKey // tls.key
)

// ErrNonceMissing is returned when registration is needed and the nonce
// Secret (or its nonce.jwt key) does not exist.
var ErrNonceMissing = errors.New("registration nonce Secret is missing")

// ErrRegistrationFailed is returned when registration failed on every shard.
var ErrRegistrationFailed = errors.New("registration failed on every shard")

// Shard is one registration endpoint.
type Shard struct {
	ID   string
	Addr string
}

// Registrar performs the RegisterOperator call against one shard.
type Registrar interface {
	Register(ctx context.Context, addr string, roots *x509.CertPool, nonce string, publicKeyPEM []byte) (certPEM []byte, err error)
}

// Options name the objects and endpoints Ensure works with.
type Options struct {
	Namespace   string
	CAConfigMap string
	KeySecret   string
	NonceSecret string
	CertSecret  string
	// ClusterID is checked against the certificate's identity.
	ClusterID string
	// Shards are tried in order until one registers the operator.
	Shards    []Shard
	Registrar Registrar
	// Backoff spaces registration rounds after transient failures; its
	// Steps is the number of rounds (zero Duration: DefaultBackoff).
	Backoff wait.Backoff
	// SkewAllowance bounds the retries of a nonce that is not valid yet
	// (default DefaultSkewAllowance).
	SkewAllowance time.Duration
	// AfterKeypairStored, when set, runs right after the keypair Secret is
	// written and before registration. Tests use it to inject a crash.
	AfterKeypairStored func() error
	// Now defaults to time.Now.
	Now func() time.Time
	Log logr.Logger
}

// Credentials are the PEM data and parsed forms the operator connects with.
type Credentials struct {
	CAPEM        []byte
	CertPEM      []byte
	KeyPEM       []byte
	PublicKeyPEM []byte
	Roots        *x509.CertPool
	Certificate  tls.Certificate
	Leaf         *x509.Certificate
	Identity     pki.Identity
	// Registered is true when this call registered; false when it reused
	// the stored certificate.
	Registered bool
}

// Ensure returns valid credentials, registering if needed. c must read from
// the API server directly (not a cache): the objects may have just been
// written by a previous leader.
func Ensure(ctx context.Context, c client.Client, o Options) (*Credentials, error) {
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	log := o.Log
	caPEM, roots, err := loadCA(ctx, c, o)
	if err != nil {
		return nil, err
	}
	if creds, reason := loadCert(ctx, c, o, caPEM, roots, now()); creds != nil {
		log.Info("reusing stored operator certificate", "secret", o.CertSecret, "notAfter", creds.Leaf.NotAfter)
		return creds, nil
	} else {
		log.Info("operator certificate needs registration", "reason", reason)
	}

	priv, pubPEM, err := ensureKeypair(ctx, c, o)
	if err != nil {
		return nil, err
	}
	if o.AfterKeypairStored != nil {
		if err := o.AfterKeypairStored(); err != nil {
			return nil, err
		}
	}
	nonce, err := loadNonce(ctx, c, o)
	if err != nil {
		return nil, err
	}
	certPEM, err := register(ctx, o, roots, nonce, pubPEM)
	if err != nil {
		return nil, err
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(priv)
	if err != nil {
		return nil, fmt.Errorf("encode private key: %w", err)
	}
	creds, err := Parse(caPEM, certPEM, keyPEM, o.ClusterID, now())
	if err != nil {
		return nil, fmt.Errorf("certificate returned by registration: %w", err)
	}
	creds.PublicKeyPEM = pubPEM
	creds.Registered = true
	if err := StoreCert(ctx, c, o.Namespace, o.CertSecret, certPEM, keyPEM, caPEM); err != nil {
		return nil, err
	}
	log.Info("operator registered", "secret", o.CertSecret, "notAfter", creds.Leaf.NotAfter)
	return creds, nil
}

func loadCA(ctx context.Context, c client.Client, o Options) ([]byte, *x509.CertPool, error) {
	var cm corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: o.CAConfigMap}, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, fmt.Errorf("cluster CA ConfigMap %s/%s does not exist; create it with key %s", o.Namespace, o.CAConfigMap, CAKey)
		}
		return nil, nil, fmt.Errorf("read cluster CA ConfigMap %s/%s: %w", o.Namespace, o.CAConfigMap, err)
	}
	data := []byte(cm.Data[CAKey])
	if len(data) == 0 {
		data = cm.BinaryData[CAKey]
	}
	if len(data) == 0 {
		return nil, nil, fmt.Errorf("cluster CA ConfigMap %s/%s has no %s key", o.Namespace, o.CAConfigMap, CAKey)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, nil, fmt.Errorf("cluster CA ConfigMap %s/%s: %s holds no PEM certificate", o.Namespace, o.CAConfigMap, CAKey)
	}
	return data, pool, nil
}

// loadCert returns the stored credentials when they are usable, or nil and
// the reason they are not.
//
// The CAs the certificate Secret holds (the bundle the server returned at
// the last renewal, both CAs during a cluster CA rotation) are trusted
// besides the CA ConfigMap's, so an operator that renewed from a new CA
// still starts after a restart; only cluster CAs of this cluster are taken.
func loadCert(ctx context.Context, c client.Client, o Options, caPEM []byte, roots *x509.CertPool, now time.Time) (*Credentials, string) {
	var s corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: o.CertSecret}, &s); err != nil {
		return nil, fmt.Sprintf("certificate Secret %s: %v", o.CertSecret, err)
	}
	if extra := s.Data[CAKey]; len(extra) > 0 && !bytes.Equal(extra, caPEM) {
		if certs, err := pki.ParseCertificatesPEM(extra); err == nil && pki.CheckClusterBundle(certs, o.ClusterID) == nil {
			roots = roots.Clone()
			for _, ca := range certs {
				roots.AddCert(ca)
			}
			caPEM = append(append(append([]byte(nil), caPEM...), '\n'), extra...)
		}
	}
	creds, err := parseWith(roots, s.Data[CertKey], s.Data[CertKeyKey], o.ClusterID, now)
	if err != nil {
		return nil, fmt.Sprintf("certificate Secret %s unusable: %v", o.CertSecret, err)
	}
	creds.CAPEM = caPEM
	if pub, err := pki.MarshalPublicKeyPEM(creds.Leaf.PublicKey); err == nil {
		creds.PublicKeyPEM = pub
	}
	return creds, ""
}

// Parse checks that certPEM and keyPEM form a valid operator certificate
// issued by the CA in caPEM for clusterID, and returns the credentials.
func Parse(caPEM, certPEM, keyPEM []byte, clusterID string, now time.Time) (*Credentials, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("CA PEM holds no certificate")
	}
	creds, err := parseWith(pool, certPEM, keyPEM, clusterID, now)
	if err != nil {
		return nil, err
	}
	creds.CAPEM = caPEM
	return creds, nil
}

func parseWith(roots *x509.CertPool, certPEM, keyPEM []byte, clusterID string, now time.Time) (*Credentials, error) {
	if len(certPEM) == 0 || len(keyPEM) == 0 {
		return nil, fmt.Errorf("%s or %s is empty", CertKey, CertKeyKey)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("certificate and key do not form a pair: %w", err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("parse certificate: %w", err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("certificate does not verify against the cluster CA: %w", err)
	}
	id, err := pki.IdentityFromCert(leaf, clusterID)
	if err != nil {
		return nil, fmt.Errorf("certificate identity: %w", err)
	}
	if id.Role != pki.RoleOperator {
		return nil, fmt.Errorf("certificate role is %q, want %q", id.Role, pki.RoleOperator)
	}
	return &Credentials{CertPEM: certPEM, KeyPEM: keyPEM, Roots: roots, Certificate: pair, Leaf: leaf, Identity: id}, nil
}

// ensureKeypair loads the keypair Secret or creates it with a fresh key.
func ensureKeypair(ctx context.Context, c client.Client, o Options) (ed25519.PrivateKey, []byte, error) {
	key := client.ObjectKey{Namespace: o.Namespace, Name: o.KeySecret}
	var s corev1.Secret
	err := c.Get(ctx, key, &s)
	if err == nil {
		return parseKeypair(o, &s)
	}
	if !apierrors.IsNotFound(err) {
		return nil, nil, fmt.Errorf("read keypair Secret %s/%s: %w", o.Namespace, o.KeySecret, err)
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate Ed25519 key: %w", err)
	}
	privPEM, err := pki.MarshalPrivateKeyPEM(priv)
	if err != nil {
		return nil, nil, fmt.Errorf("encode private key: %w", err)
	}
	pubPEM, err := pki.MarshalPublicKeyPEM(pub)
	if err != nil {
		return nil, nil, fmt.Errorf("encode public key: %w", err)
	}
	s = corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: o.KeySecret},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{PrivateKeyKey: privPEM, PublicKeyKey: pubPEM},
	}
	if err := c.Create(ctx, &s); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// Another operator instance won the race; use its key.
			if err := c.Get(ctx, key, &s); err != nil {
				return nil, nil, fmt.Errorf("read keypair Secret %s/%s: %w", o.Namespace, o.KeySecret, err)
			}
			return parseKeypair(o, &s)
		}
		return nil, nil, fmt.Errorf("store keypair Secret %s/%s: %w", o.Namespace, o.KeySecret, err)
	}
	o.Log.Info("stored new operator keypair", "secret", o.KeySecret)
	return priv, pubPEM, nil
}

func parseKeypair(o Options, s *corev1.Secret) (ed25519.PrivateKey, []byte, error) {
	bad := func(why string, err error) (ed25519.PrivateKey, []byte, error) {
		msg := fmt.Sprintf("keypair Secret %s/%s: %s", o.Namespace, o.KeySecret, why)
		if err != nil {
			msg += ": " + err.Error()
		}
		return nil, nil, errors.New(msg + " (delete the Secret to generate a new keypair)")
	}
	signer, err := pki.ParsePrivateKeyPEM(s.Data[PrivateKeyKey])
	if err != nil {
		return bad(PrivateKeyKey+" is not a PEM private key", err)
	}
	priv, ok := signer.(ed25519.PrivateKey)
	if !ok {
		return bad(PrivateKeyKey+" is not an Ed25519 key", nil)
	}
	pubPEM, err := pki.MarshalPublicKeyPEM(priv.Public())
	if err != nil {
		return bad("encode public key", err)
	}
	if stored := s.Data[PublicKeyKey]; len(stored) > 0 {
		storedPub, err := pki.ParseEd25519PublicKeyPEM(stored)
		if err != nil {
			return bad(PublicKeyKey+" is not an Ed25519 PEM public key", err)
		}
		if !storedPub.Equal(priv.Public()) {
			return bad(PublicKeyKey+" does not match "+PrivateKeyKey, nil)
		}
	}
	return priv, pubPEM, nil
}

func loadNonce(ctx context.Context, c client.Client, o Options) (string, error) {
	var s corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: o.NonceSecret}, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return "", fmt.Errorf("%w: %s/%s does not exist and no usable certificate is stored; create it with key %s (nstance-admin cluster nonce)",
				ErrNonceMissing, o.Namespace, o.NonceSecret, NonceKey)
		}
		return "", fmt.Errorf("read nonce Secret %s/%s: %w", o.Namespace, o.NonceSecret, err)
	}
	tok := strings.TrimSpace(string(s.Data[NonceKey]))
	if tok == "" {
		return "", fmt.Errorf("%w: %s/%s has no %s key", ErrNonceMissing, o.Namespace, o.NonceSecret, NonceKey)
	}
	return tok, nil
}

// DefaultBackoff spaces the registration rounds (every shard once) after
// transient failures: about 1.5 minutes in all before giving up.
var DefaultBackoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 7, Cap: 30 * time.Second}

// DefaultSkewAllowance is how long a nonce the servers find "not valid
// yet" (their clocks behind the clock it was minted with) is retried.
const DefaultSkewAllowance = 5 * time.Minute

// register tries every shard in order, in rounds spaced by o.Backoff, until
// one registers the operator. A retry after a lost reply is safe: the server
// answers the same key with the certificate it issued first. A definite
// refusal ends at once; transient failures end after the backoff's steps,
// a nonce that is not valid yet after the skew allowance.
func register(ctx context.Context, o Options, roots *x509.CertPool, nonce string, pubPEM []byte) ([]byte, error) {
	if len(o.Shards) == 0 {
		return nil, fmt.Errorf("%w: no shards configured", ErrRegistrationFailed)
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	bo := o.Backoff
	if bo.Duration <= 0 {
		bo = DefaultBackoff
	}
	rounds := max(bo.Steps, 1)
	skew := o.SkewAllowance
	if skew <= 0 {
		skew = DefaultSkewAllowance
	}
	var earlySince time.Time
	for round := 1; ; round++ {
		var errs []string
		early := false
		for _, s := range o.Shards {
			certPEM, err := o.Registrar.Register(ctx, s.Addr, roots, nonce, pubPEM)
			if err == nil {
				o.Log.Info("registered with shard", "shard", s.ID, "addr", s.Addr, "round", round)
				return certPEM, nil
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			switch regoutcome.Classify(err) {
			case regoutcome.Definite:
				return nil, fmt.Errorf("%w: shard %s (%s) refused it for good: %s (%s); the nonce in Secret %s/%s cannot register this "+
					"operator: mint a new one with `nstance-admin cluster nonce`", ErrRegistrationFailed, s.ID, s.Addr,
					status.Convert(err).Message(), status.Code(err), o.Namespace, o.NonceSecret)
			case regoutcome.NotYetValid:
				early = true
			}
			o.Log.Error(err, "registration attempt failed", "shard", s.ID, "addr", s.Addr, "round", round)
			errs = append(errs, fmt.Sprintf("%s (%s): %v", s.ID, s.Addr, err))
		}
		if early {
			if earlySince.IsZero() {
				earlySince = now()
			}
			if waited := now().Sub(earlySince); waited >= skew {
				return nil, fmt.Errorf("%w: the nonce is still not valid yet after %s: the servers' clocks are behind the clock it was "+
					"minted with by more than that; fix the clocks (NTP): %s", ErrRegistrationFailed, waited.Round(time.Second), strings.Join(errs, "; "))
			}
		} else if round >= rounds {
			return nil, fmt.Errorf("%w after %d rounds: %s", ErrRegistrationFailed, round, strings.Join(errs, "; "))
		}
		t := time.NewTimer(bo.Step())
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// StoreCert writes the certificate Secret, creating or replacing it.
func StoreCert(ctx context.Context, c client.Client, namespace, name string, certPEM, keyPEM, caPEM []byte) error {
	data := map[string][]byte{CertKey: certPEM, CertKeyKey: keyPEM, CAKey: caPEM}
	s := corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Type:       corev1.SecretTypeTLS,
		Data:       data,
	}
	err := c.Create(ctx, &s)
	if apierrors.IsAlreadyExists(err) {
		var cur corev1.Secret
		if err := c.Get(ctx, client.ObjectKeyFromObject(&s), &cur); err != nil {
			return fmt.Errorf("read certificate Secret %s/%s: %w", namespace, name, err)
		}
		if bytes.Equal(cur.Data[CertKey], certPEM) && bytes.Equal(cur.Data[CertKeyKey], keyPEM) && bytes.Equal(cur.Data[CAKey], caPEM) {
			return nil
		}
		if cur.Type != corev1.SecretTypeTLS {
			// The type is immutable: replace the Secret.
			if err := c.Delete(ctx, &cur); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("replace certificate Secret %s/%s: %w", namespace, name, err)
			}
			return StoreCert(ctx, c, namespace, name, certPEM, keyPEM, caPEM)
		}
		cur.Data = data
		err = c.Update(ctx, &cur)
	}
	if err != nil {
		return fmt.Errorf("store certificate Secret %s/%s: %w", namespace, name, err)
	}
	return nil
}
