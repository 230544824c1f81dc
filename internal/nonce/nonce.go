package nonce

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// Kind is the client a nonce registers.
type Kind string

// Nonce kinds. An admin nonce registers through RegisterOperator and yields
// an admin certificate.
const (
	KindAgent    Kind = "agent"
	KindOperator Kind = "operator"
	KindAdmin    Kind = "admin"
)

// DefaultMaxLifetime is the longest nonce lifetime (exp - iat) a Verifier
// accepts when its MaxLifetime is not set.
const DefaultMaxLifetime = 24 * time.Hour

// Verification failures. Verify wraps exactly one of them.
var (
	ErrMalformed    = errors.New("nonce is not a well-formed JWT")
	ErrAlgorithm    = errors.New("nonce is not signed with EdDSA")
	ErrSignature    = errors.New("nonce signature does not verify with the cluster nonce key")
	ErrExpired      = errors.New("nonce has expired")
	ErrNotYetValid  = errors.New("nonce is not valid yet")
	ErrWrongCluster = errors.New("nonce was issued for another cluster")
	ErrWrongKind    = errors.New("nonce is for another kind of client")
	ErrWrongShard   = errors.New("nonce was issued for another shard")
	ErrClaims       = errors.New("nonce claims are incomplete or invalid")
	ErrLifetime     = errors.New("nonce lifetime is longer than this server accepts")
	ErrReplayed     = errors.New("nonce has already been used")
)

// Claims are the contents of a registration nonce.
type Claims struct {
	Kind      Kind   `json:"kind"`
	ClusterID string `json:"cluster"`
	Tenant    string `json:"tenant"`
	Shard     string `json:"shard,omitempty"`
	Group     string `json:"group,omitempty"`
	jwt.RegisteredClaims
}

// NewJTI returns a random 128-bit nonce id.
func NewJTI() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating nonce id: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// Mint signs claims with the cluster nonce key. Unset jti, iat and nbf are
// filled in (nbf = iat = now); exp must be set by the caller via ttl.
func Mint(key ed25519.PrivateKey, c Claims, ttl time.Duration, now time.Time) (string, error) {
	if ttl <= 0 {
		return "", errors.New("nonce lifetime must be positive")
	}
	if c.ID == "" {
		id, err := NewJTI()
		if err != nil {
			return "", err
		}
		c.ID = id
	}
	now = now.Truncate(time.Second)
	c.IssuedAt = jwt.NewNumericDate(now)
	if c.NotBefore == nil {
		c.NotBefore = jwt.NewNumericDate(now)
	}
	c.ExpiresAt = jwt.NewNumericDate(now.Add(ttl))
	if err := checkClaims(&c); err != nil {
		return "", err
	}
	tok, err := jwt.NewWithClaims(jwt.SigningMethodEdDSA, c).SignedString(key)
	if err != nil {
		return "", fmt.Errorf("signing nonce: %w", err)
	}
	return tok, nil
}

func checkClaims(c *Claims) error {
	if c.Kind != KindAgent && c.Kind != KindOperator && c.Kind != KindAdmin {
		return fmt.Errorf("%w: kind %q is not agent, operator or admin", ErrClaims, c.Kind)
	}
	if err := layout.ValidateID("jti", c.ID); err != nil {
		return fmt.Errorf("%w: %v", ErrClaims, err)
	}
	if err := layout.ValidateID("subject", c.Subject); err != nil {
		return fmt.Errorf("%w: %v", ErrClaims, err)
	}
	if err := layout.ValidateID("tenant", c.Tenant); err != nil {
		return fmt.Errorf("%w: %v", ErrClaims, err)
	}
	// Cluster, shard and group are IDs too (config validates them so): a
	// value that is not, e.g. invalid UTF-8, which JSON encoding replaces,
	// would verify as a different value than Mint was given.
	if err := layout.ValidateID("cluster", c.ClusterID); err != nil {
		return fmt.Errorf("%w: %v", ErrClaims, err)
	}
	if c.Kind == KindAgent || c.Shard != "" {
		if err := layout.ValidateID("shard", c.Shard); err != nil {
			return fmt.Errorf("%w: %v", ErrClaims, err)
		}
	}
	if c.Group != "" {
		if err := layout.ValidateID("group", c.Group); err != nil {
			return fmt.Errorf("%w: %v", ErrClaims, err)
		}
	}
	return nil
}

// Verifier checks nonces for one cluster (and, for agent nonces, one shard).
type Verifier struct {
	Key       ed25519.PublicKey
	ClusterID string
	// Shard, when set, must match the shard claim of agent nonces.
	Shard string
	// Leeway tolerates clock skew on exp and nbf.
	Leeway time.Duration
	// MaxLifetime is the longest accepted lifetime, exp - iat (and exp - now):
	// a nonce minted for longer is refused. DefaultMaxLifetime when zero.
	MaxLifetime time.Duration
	// Now returns the current time; time.Now when nil.
	Now func() time.Time
}

// Verify checks signature, algorithm, times, lifetime, cluster, kind (one
// of want) and claims.
func (v *Verifier) Verify(token string, want ...Kind) (*Claims, error) {
	now := time.Now
	if v.Now != nil {
		now = v.Now
	}
	p := jwt.NewParser(
		jwt.WithValidMethods([]string{jwt.SigningMethodEdDSA.Alg()}),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(v.Leeway),
		jwt.WithTimeFunc(now),
	)
	var c Claims
	tok, err := p.ParseWithClaims(token, &c, func(t *jwt.Token) (any, error) {
		if _, ok := t.Method.(*jwt.SigningMethodEd25519); !ok {
			return nil, fmt.Errorf("algorithm %v", t.Header["alg"])
		}
		return v.Key, nil
	})
	if err != nil {
		switch {
		case errors.Is(err, jwt.ErrTokenMalformed):
			return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
		case tok != nil && tok.Method != nil && tok.Method.Alg() != jwt.SigningMethodEdDSA.Alg(),
			tok != nil && tok.Header["alg"] != jwt.SigningMethodEdDSA.Alg():
			return nil, fmt.Errorf("%w: header alg is %v", ErrAlgorithm, tok.Header["alg"])
		case errors.Is(err, jwt.ErrTokenSignatureInvalid), errors.Is(err, jwt.ErrTokenUnverifiable):
			return nil, fmt.Errorf("%w: %v", ErrSignature, err)
		case errors.Is(err, jwt.ErrTokenExpired):
			return nil, ErrExpired
		case errors.Is(err, jwt.ErrTokenNotValidYet), errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
			return nil, ErrNotYetValid
		default:
			return nil, fmt.Errorf("%w: %v", ErrClaims, err)
		}
	}
	if c.ClusterID != v.ClusterID {
		return nil, fmt.Errorf("%w: nonce cluster %q, this cluster %q", ErrWrongCluster, c.ClusterID, v.ClusterID)
	}
	if !slices.Contains(want, c.Kind) {
		return nil, fmt.Errorf("%w: nonce kind %q, want %q", ErrWrongKind, c.Kind, want)
	}
	if c.NotBefore == nil {
		return nil, fmt.Errorf("%w: nbf is missing", ErrClaims)
	}
	if c.IssuedAt == nil {
		return nil, fmt.Errorf("%w: iat is missing", ErrClaims)
	}
	maxLife := v.MaxLifetime
	if maxLife <= 0 {
		maxLife = DefaultMaxLifetime
	}
	if life := c.ExpiresAt.Sub(c.IssuedAt.Time); life > maxLife {
		return nil, fmt.Errorf("%w: minted for %s, at most %s", ErrLifetime, life, maxLife)
	}
	if left := c.ExpiresAt.Sub(now()); left > maxLife+v.Leeway {
		return nil, fmt.Errorf("%w: valid for another %s, at most %s", ErrLifetime, left.Round(time.Second), maxLife)
	}
	if err := checkClaims(&c); err != nil {
		return nil, err
	}
	if c.Kind == KindAgent && v.Shard != "" && c.Shard != v.Shard {
		return nil, fmt.Errorf("%w: nonce shard %q, this shard %q", ErrWrongShard, c.Shard, v.Shard)
	}
	return &c, nil
}

// Ledger records used nonces in object storage.
type Ledger struct {
	Store objstore.Store
	Keys  layout.Keys
}

// Marker is the object that records a nonce as used, and what was issued
// for it: the registering key's fingerprint and the certificate, so a client
// that retries with the same key after a lost reply gets the same
// certificate, while any other key is refused.
type Marker struct {
	JTI     string    `json:"jti"`
	Kind    Kind      `json:"kind"`
	Subject string    `json:"sub"`
	Tenant  string    `json:"tenant"`
	UsedAt  time.Time `json:"used_at"`
	// ExpiresAt is the nonce's exp: after it (and the verifiers' leeway)
	// no server accepts the nonce, whatever its own nonce_max_lifetime,
	// and the marker may be swept (see Sweeper).
	ExpiresAt time.Time `json:"expires_at"`
	UsedBy    string    `json:"used_by,omitempty"`
	// KeySHA256 is KeyFingerprint of the public key the nonce registered.
	KeySHA256 string `json:"key_sha256"`
	// CertificatePEM is the certificate issued for it.
	CertificatePEM string `json:"certificate_pem,omitempty"`
}

// KeyFingerprint is the hex SHA-256 of a public key's PKIX DER form.
func KeyFingerprint(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("fingerprinting public key: %w", err)
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:]), nil
}

// MarkerKey is the object that records c as used: per shard for agent
// nonces, cluster-wide for operator nonces (which every shard accepts).
func (l *Ledger) MarkerKey(c *Claims) string {
	if c.Kind == KindAgent {
		return l.Keys.ShardNonce(c.Shard, c.ID)
	}
	return l.Keys.ClusterNonce(c.ID)
}

// Use is one registration's claim on a nonce.
type Use struct {
	// KeySHA256 is KeyFingerprint of the registering public key (required).
	KeySHA256 string
	// CertificatePEM is the certificate issued for this attempt.
	CertificatePEM string
	UsedBy         string
	Now            time.Time
}

// Consume marks the nonce used for u with a create-only write and returns
// the marker that holds: u's own, or, when the nonce was already used with
// the same key (a retry after a lost reply, possibly on another server, or
// the storage SDK's retry of this very write), the stored one, whose
// certificate the caller should return. A nonce used with another key (or
// recorded without one) returns an error wrapping ErrReplayed.
func (l *Ledger) Consume(ctx context.Context, c *Claims, u Use) (*Marker, error) {
	if u.KeySHA256 == "" {
		return nil, errors.New("consuming nonce: no key fingerprint")
	}
	m := &Marker{JTI: c.ID, Kind: c.Kind, Subject: c.Subject, Tenant: c.Tenant, UsedAt: u.Now.UTC(), UsedBy: u.UsedBy,
		KeySHA256: u.KeySHA256, CertificatePEM: u.CertificatePEM}
	if c.ExpiresAt != nil {
		m.ExpiresAt = c.ExpiresAt.UTC()
	}
	body, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encoding nonce marker: %w", err)
	}
	key := l.MarkerKey(c)
	_, err = l.Store.Put(ctx, key, body, objstore.PutOptions{IfNoneMatch: true})
	if err == nil {
		return m, nil
	}
	if !errors.Is(err, objstore.ErrPreconditionFailed) {
		return nil, fmt.Errorf("recording nonce %s as used: %w", c.ID, err)
	}
	obj, gerr := l.Store.Get(ctx, key)
	if errors.Is(gerr, objstore.ErrNotFound) {
		// Swept in between: the nonce is long expired.
		return nil, fmt.Errorf("%w (jti %s)", ErrReplayed, c.ID)
	}
	if gerr != nil {
		return nil, fmt.Errorf("nonce %s is marked used; reading the marker: %w", c.ID, gerr)
	}
	var stored Marker
	if err := json.Unmarshal(obj.Body, &stored); err != nil {
		return nil, fmt.Errorf("%w (jti %s; marker unreadable: %v)", ErrReplayed, c.ID, err)
	}
	if stored.KeySHA256 == "" || stored.KeySHA256 != u.KeySHA256 || stored.JTI != c.ID || stored.Subject != c.Subject {
		return nil, fmt.Errorf("%w (jti %s, with another key)", ErrReplayed, c.ID)
	}
	return &stored, nil
}

// SweepStats says what one Sweep did.
type SweepStats struct {
	Listed, Deleted int
	// Kept counts the markers old enough to look at that are still needed.
	Kept int
	// More is true when expired markers remain beyond the per-pass limit.
	More bool
}

// Sweeper deletes nonce markers once the nonce they record can no longer
// verify anywhere. Each marker carries its own expiry (ExpiresAt, the
// nonce's exp): a sweep honours that, never the sweeping server's own
// nonce lifetime, so a cluster leader whose shard accepts only short-lived
// nonces does not delete the marker of a longer nonce another shard still
// accepts. A marker without a readable expiry (written by an older
// version) is kept until LegacyKeep after it was written. A Sweeper
// remembers the expiry it read per marker version, so a long-lived marker
// is read once, not at every pass; keep one per leadership term.
type Sweeper struct {
	Store objstore.Store
	// Grace is added to every expiry: the verifiers' leeway on exp and the
	// skew between the clocks of servers and storage.
	Grace time.Duration
	// LegacyKeep is how long a marker without an expiry is kept after its
	// last write: the longest nonce lifetime any configuration may allow.
	LegacyKeep time.Duration
	// Log hears about markers whose expiry cannot be read; optional.
	Log func(key string, err error)

	mu    sync.Mutex
	known map[string]markerExpiry
}

// markerExpiry is what a marker's body said, per version (ETag).
type markerExpiry struct {
	etag string
	// at is the marker's expiry; zero when it names none.
	at time.Time
}

// keepUntil is when the marker may go: its expiry plus the grace, or, for
// a marker without one, its last write plus LegacyKeep and the grace.
func (w *Sweeper) keepUntil(info objstore.ObjectInfo, exp time.Time) time.Time {
	if exp.IsZero() {
		return info.LastModified.Add(w.LegacyKeep + w.Grace)
	}
	return exp.Add(w.Grace)
}

// expiry reads (or recalls) the expiry recorded in a marker.
func (w *Sweeper) expiry(ctx context.Context, info objstore.ObjectInfo) (time.Time, error) {
	w.mu.Lock()
	m, ok := w.known[info.Key]
	w.mu.Unlock()
	if ok && info.ETag != "" && m.etag == info.ETag {
		return m.at, nil
	}
	obj, err := w.Store.Get(ctx, info.Key)
	if err != nil {
		return time.Time{}, err
	}
	var mk Marker
	if err := json.Unmarshal(obj.Body, &mk); err != nil && w.Log != nil {
		// Unreadable: treated like a marker without an expiry.
		w.Log(info.Key, fmt.Errorf("nonce marker is unreadable; kept as one without an expiry: %w", err))
	}
	m = markerExpiry{etag: obj.ETag, at: mk.ExpiresAt}
	w.mu.Lock()
	if w.known == nil {
		w.known = map[string]markerExpiry{}
	}
	w.known[info.Key] = m
	w.mu.Unlock()
	return m.at, nil
}

// Sweep deletes the markers under prefix that are no longer needed at now,
// at most limit of them (0: no limit). Markers written within Grace of now
// are not even read: their nonce was valid when they were written. Errors
// on one marker are returned after the others were tried.
func (w *Sweeper) Sweep(ctx context.Context, prefix string, now time.Time, limit int) (SweepStats, error) {
	var st SweepStats
	infos, err := w.Store.List(ctx, prefix)
	if err != nil {
		return st, fmt.Errorf("listing nonce markers under %s: %w", prefix, err)
	}
	st.Listed = len(infos)
	listed := make(map[string]bool, len(infos))
	var errs []error
	for _, info := range infos {
		listed[info.Key] = true
		if now.Sub(info.LastModified) < w.Grace {
			continue
		}
		if err := ctx.Err(); err != nil {
			return st, err
		}
		exp, err := w.expiry(ctx, info)
		if errors.Is(err, objstore.ErrNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("reading nonce marker %s: %w", info.Key, err))
			continue
		}
		if !now.After(w.keepUntil(info, exp)) {
			st.Kept++
			continue
		}
		if limit > 0 && st.Deleted >= limit {
			st.More = true
			continue
		}
		if err := w.Store.Delete(ctx, info.Key); err != nil && !errors.Is(err, objstore.ErrNotFound) {
			errs = append(errs, fmt.Errorf("deleting nonce marker %s: %w", info.Key, err))
			continue
		}
		st.Deleted++
		delete(listed, info.Key)
	}
	// Forget markers that are gone (swept here or elsewhere).
	w.mu.Lock()
	for k := range w.known {
		if strings.HasPrefix(k, prefix) && !listed[k] {
			delete(w.known, k)
		}
	}
	w.mu.Unlock()
	return st, errors.Join(errs...)
}
