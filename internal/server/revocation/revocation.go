package revocation

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/registration"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// Entry kinds.
const (
	// KindOperator denies the operator and admin certificates of one
	// operator id of one tenant issued up to IssuedBefore (every shard).
	// Entries of versions before tenant-scoped operator ids name no tenant
	// and deny the id in every tenant until they expire.
	KindOperator = "operator"
	// KindAgent denies the agent certificates of one instance of a shard
	// issued up to IssuedBefore.
	KindAgent = "agent"
	// KindSerial denies one certificate by serial number (every shard).
	KindSerial = "serial"
)

// ErrRevoked is wrapped by every refusal of a revoked certificate.
var ErrRevoked = errors.New("certificate revoked")

// ErrInvalid is wrapped by refusals of a bad revocation request.
var ErrInvalid = errors.New("invalid revocation")

// errBadEntry marks a stored entry that does not parse or validate.
var errBadEntry = errors.New("invalid revocation entry")

// Entry is one revocation.
type Entry struct {
	// ID is the entry's key segment (hex).
	ID   string `json:"id"`
	Kind string `json:"kind"`
	// Subject is the operator or instance id (KindOperator, KindAgent).
	Subject string `json:"subject,omitempty"`
	// Tenant is the operator's tenant (KindOperator): operator ids are
	// scoped to their tenant.
	Tenant string `json:"tenant,omitempty"`
	// Shard is the instance's shard (KindAgent).
	Shard string `json:"shard,omitempty"`
	// Serial is the certificate serial in decimal (KindSerial).
	Serial string `json:"serial,omitempty"`
	// URI is the SPIFFE id the entry names, when known (informative).
	URI string `json:"uri,omitempty"`
	// IssuedBefore: identity entries deny certificates issued at or before it.
	IssuedBefore time.Time `json:"issued_before,omitzero"`
	// ExpiresAt is when every certificate the entry can name has expired;
	// the entry is removed after it.
	ExpiresAt time.Time `json:"expires_at"`
	RevokedAt time.Time `json:"revoked_at"`
	RevokedBy string    `json:"revoked_by,omitempty"`
	Reason    string    `json:"reason,omitempty"`
}

// Matches reports whether e denies cert, whose identity is id.
func (e Entry) Matches(cert *x509.Certificate, id pki.Identity) bool {
	switch e.Kind {
	case KindSerial:
		return cert.SerialNumber != nil && cert.SerialNumber.String() == e.Serial
	case KindOperator:
		return (id.Role == pki.RoleOperator || id.Role == pki.RoleAdmin) && id.ClientID == e.Subject &&
			(e.Tenant == "" || e.Tenant == id.Tenant) && !pki.IssuedAt(cert).After(e.IssuedBefore)
	case KindAgent:
		return id.Role == pki.RoleAgent && id.ClientID == e.Subject && id.Shard == e.Shard && !pki.IssuedAt(cert).After(e.IssuedBefore)
	}
	return false
}

func (e Entry) validate() error {
	if err := e.check(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if len(e.Reason) > MaxReason {
		return fmt.Errorf("%w: the reason is longer than %d bytes", ErrInvalid, MaxReason)
	}
	return nil
}

// MaxReason is the longest reason an entry keeps.
const MaxReason = 1024

func (e Entry) check() error {
	switch e.Kind {
	case KindOperator:
		if e.Tenant != "" {
			if err := layout.ValidateID("tenant", e.Tenant); err != nil {
				return err
			}
		}
		return layout.ValidateID("operator id", e.Subject)
	case KindAgent:
		if err := layout.ValidateID("instance id", e.Subject); err != nil {
			return err
		}
		return layout.ValidateID("shard", e.Shard)
	case KindSerial:
		if e.Serial == "" || strings.Trim(e.Serial, "0123456789") != "" || len(e.Serial) > 64 {
			return fmt.Errorf("serial %q: want a decimal certificate serial number", e.Serial)
		}
		return nil
	}
	return fmt.Errorf("unknown revocation kind %q", e.Kind)
}

// Options configures a Gate.
type Options struct {
	Store objstore.Store
	Keys  layout.Keys
	// ClusterID is the cluster's id; Shard the shard whose agent entries are loaded.
	ClusterID, Shard string
	// ServerID is recorded as RevokedBy of entries this server writes.
	ServerID string
	// OperatorValidity and AgentValidity are the longest lifetimes of the
	// certificates of each kind: an entry is kept that long after its
	// IssuedBefore (a serial entry the longer of the two).
	OperatorValidity, AgentValidity time.Duration
	// RequireOperatorRecords admits operator and admin certificates only
	// while their tenant's operator record exists
	// (cluster/operators/{tenant}/{id}.json, or a record of an older
	// version naming the tenant, see registration.ReadOperatorRecord): as
	// seen by the last Sync, or read on a miss (the answer is kept until the
	// next Sync). A record deleted by hand is then refused within one Sync
	// even if no Sync ever saw it.
	RequireOperatorRecords bool
	// Standby, when set and true, makes Sync read only: expired entries are
	// left out of memory but not deleted, and operators whose record
	// vanished are revoked by a later Sync that may write. A standby server
	// keeps its list loaded this way, so taking over reads only what is new.
	Standby func() bool
	// Now defaults to time.Now.
	Now func() time.Time
	Log logr.Logger
}

// Gate is the loaded deny list. It is safe for concurrent use.
type Gate struct {
	o Options

	// writeMu serialises Sync and revocations, so a Sync that listed
	// storage before an entry was written cannot drop it from memory.
	writeMu sync.Mutex
	mu      sync.RWMutex
	entries map[string]Entry // by storage key
	serials map[string]bool
	ids     map[string][]Entry // by index key (kind/shard/subject)
	// operators are the operator records seen at the last Sync
	// (operatorKey(tenant, id) -> etag), plus those read since on a miss;
	// nil before the first Sync. absent are the operators found without a
	// record since the last Sync.
	operators map[string]string
	absent    map[string]bool
	// legacyTenants caches the tenant named by each legacy record
	// (key -> etag and tenant), so a Sync reads each version once.
	legacyTenants map[string]legacyTenant
	streams       map[*tracked]struct{}
	// syncedAt is when the last successful Sync started (zero before).
	syncedAt time.Time
}

type tracked struct {
	cert   *x509.Certificate
	id     pki.Identity
	cancel context.CancelCauseFunc
}

// New returns an empty Gate; call Sync before serving.
func New(o Options) *Gate {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Gate{o: o, entries: map[string]Entry{}, serials: map[string]bool{}, ids: map[string][]Entry{}, streams: map[*tracked]struct{}{}}
}

// indexKey indexes entries by kind, scope (the tenant of operator
// entries, empty for entries of older versions; the shard of agent
// entries) and subject.
func indexKey(kind, scope, subject string) string { return kind + "/" + scope + "/" + subject }

// operatorKey names one operator: ids are scoped to their tenant.
func operatorKey(tenant, id string) string { return tenant + "/" + id }

type legacyTenant struct{ etag, tenant string }

func (g *Gate) match(cert *x509.Certificate, id pki.Identity) (Entry, bool) {
	if cert.SerialNumber != nil && g.serials[cert.SerialNumber.String()] {
		return Entry{Kind: KindSerial, Serial: cert.SerialNumber.String()}, true
	}
	var keys []string
	switch id.Role {
	case pki.RoleOperator, pki.RoleAdmin:
		keys = []string{indexKey(KindOperator, id.Tenant, id.ClientID), indexKey(KindOperator, "", id.ClientID)}
	case pki.RoleAgent:
		keys = []string{indexKey(KindAgent, id.Shard, id.ClientID)}
	}
	for _, k := range keys {
		for _, e := range g.ids[k] {
			if e.Matches(cert, id) {
				return e, true
			}
		}
	}
	return Entry{}, false
}

// Admit returns an error wrapping ErrRevoked when an entry denies cert
// (or, with RequireOperatorRecords, when an operator's record is gone as
// far as the last Sync knows). It is asked on every RPC.
func (g *Gate) Admit(cert *x509.Certificate, id pki.Identity) error {
	return g.admit(cert, id, false)
}

// AdmitHandshake is Admit for a new connection: with
// RequireOperatorRecords an operator's record is read from storage, so a
// record deleted a moment ago already refuses the next handshake.
func (g *Gate) AdmitHandshake(cert *x509.Certificate, id pki.Identity) error {
	return g.admit(cert, id, true)
}

func (g *Gate) admit(cert *x509.Certificate, id pki.Identity, fresh bool) error {
	g.mu.RLock()
	e, ok := g.match(cert, id)
	g.mu.RUnlock()
	if ok {
		if e.Kind == KindSerial {
			return fmt.Errorf("%w: serial %s", ErrRevoked, e.Serial)
		}
		return fmt.Errorf("%w: %s %s", ErrRevoked, e.Kind, e.Subject)
	}
	if g.o.RequireOperatorRecords && (id.Role == pki.RoleOperator || id.Role == pki.RoleAdmin) {
		return g.recordExists(id.Tenant, id.ClientID, fresh)
	}
	return nil
}

// recordExists answers from what the last Sync (or an earlier read) found,
// and reads storage on a miss or when fresh. Only the tenant's own record
// counts: another tenant's operator of the same id is someone else.
func (g *Gate) recordExists(tenant, id string, fresh bool) error {
	op := operatorKey(tenant, id)
	g.mu.RLock()
	_, known := g.operators[op]
	absent := g.absent[op]
	g.mu.RUnlock()
	switch {
	case fresh:
	case absent:
		return fmt.Errorf("%w: operator %s of tenant %s has no record", ErrRevoked, id, tenant)
	case known:
		return nil
	}
	if layout.ValidateID("operator id", id) != nil || layout.ValidateID("tenant", tenant) != nil {
		return fmt.Errorf("%w: operator id %q of tenant %q", ErrRevoked, id, tenant)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := registration.ReadOperatorRecord(ctx, g.o.Store, g.o.Keys, tenant, id)
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case err == nil:
		if g.operators == nil {
			g.operators = map[string]string{}
		}
		g.operators[op] = st.ETag
		delete(g.absent, op)
		return nil
	case errors.Is(err, objstore.ErrNotFound), errors.Is(err, registration.ErrOperatorUnreadable):
		if g.absent == nil {
			g.absent = map[string]bool{}
		}
		// g.operators keeps the operator, so the next Sync writes the entry
		// that keeps these certificates refused should the id register again.
		g.absent[op] = true
		return fmt.Errorf("%w: operator %s of tenant %s has no record", ErrRevoked, id, tenant)
	}
	if known && !absent {
		// Storage is unavailable: keep what the last Sync knew rather than
		// refusing every operator until it is back.
		return nil
	}
	return fmt.Errorf("operator %s of tenant %s: reading its record: %w", id, tenant, err)
}

// Track returns a context that is cancelled with ErrRevoked as soon as an
// entry denying cert arrives, and a function that stops tracking it (call it
// when the stream ends).
func (g *Gate) Track(ctx context.Context, cert *x509.Certificate, id pki.Identity) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	t := &tracked{cert: cert, id: id, cancel: cancel}
	g.mu.Lock()
	g.streams[t] = struct{}{}
	g.mu.Unlock()
	return ctx, func() {
		g.mu.Lock()
		delete(g.streams, t)
		g.mu.Unlock()
		cancel(context.Canceled)
	}
}

// rebuildLocked recomputes the indexes and cancels tracked streams that are
// denied now. g.mu must be held for writing.
func (g *Gate) rebuildLocked() {
	g.serials = map[string]bool{}
	g.ids = map[string][]Entry{}
	for _, e := range g.entries {
		switch e.Kind {
		case KindSerial:
			g.serials[e.Serial] = true
		case KindOperator:
			k := indexKey(KindOperator, e.Tenant, e.Subject)
			g.ids[k] = append(g.ids[k], e)
		case KindAgent:
			g.ids[indexKey(KindAgent, e.Shard, e.Subject)] = append(g.ids[indexKey(KindAgent, e.Shard, e.Subject)], e)
		}
	}
	for t := range g.streams {
		if e, ok := g.match(t.cert, t.id); ok {
			t.cancel(fmt.Errorf("%w: %s %s%s", ErrRevoked, e.Kind, e.Subject, e.Serial))
			delete(g.streams, t)
		}
	}
}

func (g *Gate) key(e Entry) string {
	if e.Kind == KindAgent {
		return g.o.Keys.ShardRevocation(e.Shard, e.ID)
	}
	return g.o.Keys.ClusterRevocation(e.ID)
}

func entryID(seed string) string {
	sum := sha256.Sum256([]byte(seed))
	return hex.EncodeToString(sum[:16])
}

// Revoke completes e (RevokedAt, IssuedBefore for identity kinds,
// ExpiresAt, RevokedBy, URI), persists it create-only and applies it at
// once: handshakes and RPCs of the certificates it names fail and their
// open streams end.
func (g *Gate) Revoke(ctx context.Context, e Entry) (Entry, error) {
	g.writeMu.Lock()
	defer g.writeMu.Unlock()
	return g.revoke(ctx, e, "")
}

// revoke persists e under an id derived from seed (when not empty; from the
// entry otherwise): servers that see the same event derive the same key and
// only the first write creates it. g.writeMu must be held.
func (g *Gate) revoke(ctx context.Context, e Entry, seed string) (Entry, error) {
	if err := e.validate(); err != nil {
		return Entry{}, err
	}
	now := g.o.Now().UTC()
	if e.RevokedAt.IsZero() {
		e.RevokedAt = now
	}
	if e.RevokedBy == "" {
		e.RevokedBy = g.o.ServerID
	}
	validity := max(g.o.OperatorValidity, g.o.AgentValidity)
	switch e.Kind {
	case KindOperator:
		validity = g.o.OperatorValidity
	case KindAgent:
		validity = g.o.AgentValidity
	}
	if e.Kind != KindSerial && e.IssuedBefore.IsZero() {
		e.IssuedBefore = now
	}
	if e.ExpiresAt.IsZero() {
		e.ExpiresAt = e.RevokedAt.Add(validity + time.Minute)
		if e.Kind != KindSerial {
			e.ExpiresAt = e.IssuedBefore.Add(validity + time.Minute)
		}
	}
	if seed == "" {
		seed = strings.Join([]string{e.Kind, e.Shard, e.Tenant, e.Subject, e.Serial, e.IssuedBefore.Format(time.RFC3339Nano), e.RevokedAt.Format(time.RFC3339Nano)}, "|")
	}
	e.ID = entryID(seed)
	key := g.key(e)
	body, err := json.Marshal(e)
	if err != nil {
		return Entry{}, err
	}
	if _, err := g.o.Store.Put(ctx, key, body, objstore.PutOptions{IfNoneMatch: true}); err != nil {
		if !errors.Is(err, objstore.ErrPreconditionFailed) {
			return Entry{}, fmt.Errorf("writing revocation %s: %w", key, err)
		}
		// Another server recorded the same event first: apply its entry.
		existing, gerr := g.load(ctx, key)
		if gerr != nil {
			return Entry{}, gerr
		}
		e = existing
	}
	g.mu.Lock()
	g.entries[key] = e
	g.rebuildLocked()
	g.mu.Unlock()
	g.o.Log.Info("certificate revoked", "kind", e.Kind, "subject", e.Subject, "tenant", e.Tenant, "shard", e.Shard, "serial", e.Serial, "reason", e.Reason, "key", key)
	return e, nil
}

func (g *Gate) load(ctx context.Context, key string) (Entry, error) {
	obj, err := g.o.Store.Get(ctx, key)
	if err != nil {
		return Entry{}, fmt.Errorf("reading revocation %s: %w", key, err)
	}
	var e Entry
	if err := json.Unmarshal(obj.Body, &e); err != nil {
		return Entry{}, fmt.Errorf("%w %s: %v", errBadEntry, key, err)
	}
	if err := e.validate(); err != nil {
		return Entry{}, fmt.Errorf("%w %s: %v", errBadEntry, key, err)
	}
	return e, nil
}

// Entries returns the loaded entries, oldest revocation first.
func (g *Gate) Entries() []Entry {
	g.mu.RLock()
	out := make([]Entry, 0, len(g.entries))
	for _, e := range g.entries {
		out = append(out, e)
	}
	g.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].RevokedAt.Equal(out[j].RevokedAt) {
			return out[i].RevokedAt.Before(out[j].RevokedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Sync re-reads the entries of the cluster and of the gate's shard, removes
// expired ones (from storage too), and revokes operators whose record
// disappeared since the previous Sync.
func (g *Gate) Sync(ctx context.Context) error {
	g.writeMu.Lock()
	defer g.writeMu.Unlock()
	now := g.o.Now()
	readOnly := g.o.Standby != nil && g.o.Standby()
	loaded := map[string]Entry{}
	g.mu.RLock()
	for k, e := range g.entries {
		loaded[k] = e
	}
	g.mu.RUnlock()
	next := map[string]Entry{}
	for _, prefix := range []string{g.o.Keys.ClusterRevocationPrefix(), g.o.Keys.ShardRevocationPrefix(g.o.Shard)} {
		infos, err := g.o.Store.List(ctx, prefix)
		if err != nil {
			return fmt.Errorf("listing %s: %w", prefix, err)
		}
		for _, info := range infos {
			e, ok := loaded[info.Key]
			if !ok {
				var err error
				if e, err = g.load(ctx, info.Key); err != nil {
					if errors.Is(err, objstore.ErrNotFound) {
						continue
					}
					if errors.Is(err, errBadEntry) {
						// A broken entry is not retried forever; it stays in storage for a person to look at.
						g.o.Log.Error(err, "skipping an unreadable revocation entry", "key", info.Key)
						continue
					}
					return err
				}
			}
			if now.After(e.ExpiresAt) {
				if readOnly {
					continue
				}
				if err := g.o.Store.Delete(ctx, info.Key); err != nil {
					g.o.Log.Error(err, "removing an expired revocation entry", "key", info.Key)
				}
				continue
			}
			next[info.Key] = e
		}
	}
	g.mu.Lock()
	g.entries = next
	g.rebuildLocked()
	g.mu.Unlock()
	if err := g.syncOperators(ctx, readOnly); err != nil {
		return err
	}
	g.mu.Lock()
	g.syncedAt = now
	g.mu.Unlock()
	return nil
}

// SyncedAt returns when the last successful Sync started (zero before any).
func (g *Gate) SyncedAt() time.Time {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.syncedAt
}

// listOperators lists the operator records of the cluster:
// operatorKey(tenant, id) -> where it lives. A record at the tenant-scoped
// key hides a legacy record of the same operator. The tenant of a legacy
// record is read from it (once per version).
func (g *Gate) listOperators(ctx context.Context) (map[string]objstore.ObjectInfo, error) {
	prefix := g.o.Keys.OperatorPrefix()
	infos, err := g.o.Store.List(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", prefix, err)
	}
	out := map[string]objstore.ObjectInfo{}
	var legacy []objstore.ObjectInfo
	for _, info := range infos {
		tenant, id, isLegacy, ok := g.o.Keys.ParseOperatorKey(info.Key)
		switch {
		case !ok:
		case isLegacy:
			legacy = append(legacy, info)
		default:
			out[operatorKey(tenant, id)] = info
		}
	}
	g.mu.RLock()
	cached := g.legacyTenants
	g.mu.RUnlock()
	seen := map[string]legacyTenant{}
	for _, info := range legacy {
		_, id, _, _ := g.o.Keys.ParseOperatorKey(info.Key)
		lt, ok := cached[info.Key]
		if !ok || lt.etag != info.ETag || info.ETag == "" {
			obj, err := g.o.Store.Get(ctx, info.Key)
			if errors.Is(err, objstore.ErrNotFound) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", info.Key, err)
			}
			var rec registration.OperatorRecord
			if err := json.Unmarshal(obj.Body, &rec); err != nil || layout.ValidateID("tenant", rec.Tenant) != nil {
				g.o.Log.Error(err, "an operator record of an older version names no valid tenant; it admits no one", "key", info.Key)
				continue
			}
			lt = legacyTenant{etag: obj.ETag, tenant: rec.Tenant}
			info.ETag = obj.ETag
		}
		seen[info.Key] = lt
		if _, ok := out[operatorKey(lt.tenant, id)]; !ok {
			out[operatorKey(lt.tenant, id)] = info
		}
	}
	g.mu.Lock()
	g.legacyTenants = seen
	g.mu.Unlock()
	return out, nil
}

// syncOperators revokes every operator whose record existed at the previous
// Sync and is gone now.
func (g *Gate) syncOperators(ctx context.Context, readOnly bool) error {
	listed, err := g.listOperators(ctx)
	if err != nil {
		return err
	}
	now := map[string]string{}
	for op, info := range listed {
		now[op] = info.ETag
	}
	g.mu.Lock()
	prev := g.operators
	g.operators, g.absent = now, nil
	streams := make([]*tracked, 0, len(g.streams))
	for t := range g.streams {
		streams = append(streams, t)
	}
	g.mu.Unlock()
	if g.o.RequireOperatorRecords {
		// End the streams of operators whose record is gone.
		for _, t := range streams {
			if t.id.Role != pki.RoleOperator && t.id.Role != pki.RoleAdmin {
				continue
			}
			if _, ok := now[operatorKey(t.id.Tenant, t.id.ClientID)]; !ok {
				if err := g.recordExists(t.id.Tenant, t.id.ClientID, false); errors.Is(err, ErrRevoked) {
					g.mu.Lock()
					delete(g.streams, t)
					g.mu.Unlock()
					t.cancel(err)
				}
			}
		}
	}
	var errs []error
	for op, etag := range prev {
		if _, ok := now[op]; ok {
			continue
		}
		if readOnly {
			// Revoked by a Sync that may write.
			g.mu.Lock()
			g.operators[op] = etag
			g.mu.Unlock()
			continue
		}
		tenant, id, _ := strings.Cut(op, "/")
		e := Entry{Kind: KindOperator, Tenant: tenant, Subject: id, Reason: "operator record deleted"}
		if _, err := g.revoke(ctx, e, OperatorSeed(tenant, id, etag)); err != nil {
			errs = append(errs, fmt.Errorf("revoking operator %s of tenant %s: %w", id, tenant, err))
			// Try again at the next Sync.
			g.mu.Lock()
			g.operators[op] = etag
			g.mu.Unlock()
		}
	}
	return errors.Join(errs...)
}

// OperatorSeed names the revocation of operator id of tenant whose record
// was at etag, so every server that sees that record go derives the same
// entry.
func OperatorSeed(tenant, id, etag string) string {
	return KindOperator + "|" + tenant + "|" + id + "|" + etag
}

// RevokeOperator revokes the certificates of operator id of tenant issued
// until now and deletes its record. A missing record is no error (the
// entry still holds). Another tenant's operator of the same id is not
// touched.
func (g *Gate) RevokeOperator(ctx context.Context, tenant, id, reason string) (Entry, error) {
	return g.RevokeOperatorBy(ctx, tenant, id, reason, "")
}

// RevokeOperatorBy is RevokeOperator recording who revoked (default: the
// server id).
func (g *Gate) RevokeOperatorBy(ctx context.Context, tenant, id, reason, by string) (Entry, error) {
	if err := layout.ValidateID("tenant", tenant); err != nil {
		return Entry{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := layout.ValidateID("operator id", id); err != nil {
		return Entry{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	g.writeMu.Lock()
	defer g.writeMu.Unlock()
	seed, uri := "", ""
	st, err := registration.ReadOperatorRecord(ctx, g.o.Store, g.o.Keys, tenant, id)
	switch {
	case err == nil:
		seed, uri = OperatorSeed(tenant, id, st.ETag), st.Record.URI
	case !errors.Is(err, objstore.ErrNotFound) && !errors.Is(err, registration.ErrOperatorUnreadable):
		return Entry{}, fmt.Errorf("reading the record of operator %s of tenant %s: %w", id, tenant, err)
	}
	e, err := g.revoke(ctx, Entry{Kind: KindOperator, Tenant: tenant, Subject: id, URI: uri, Reason: reason, RevokedBy: by}, seed)
	if err != nil {
		return Entry{}, err
	}
	// The tenant's record, and a record of an older version naming the
	// tenant that a record at the tenant's key may have shadowed.
	if err := g.o.Store.Delete(ctx, g.o.Keys.Operator(tenant, id)); err != nil && !errors.Is(err, objstore.ErrNotFound) {
		return e, fmt.Errorf("deleting %s: %w", g.o.Keys.Operator(tenant, id), err)
	}
	if legacy, err := registration.ReadOperatorRecord(ctx, g.o.Store, g.o.Keys, tenant, id); err == nil && legacy.Legacy {
		if err := g.o.Store.Delete(ctx, legacy.Key); err != nil && !errors.Is(err, objstore.ErrNotFound) {
			return e, fmt.Errorf("deleting %s: %w", legacy.Key, err)
		}
	}
	g.mu.Lock()
	if g.operators != nil {
		delete(g.operators, operatorKey(tenant, id))
	}
	g.mu.Unlock()
	return e, nil
}

// RevokeAgent revokes the agent certificates of instance id of the gate's
// shard issued until now (the instance was deleted or is to be cut off).
func (g *Gate) RevokeAgent(ctx context.Context, id, reason string) (Entry, error) {
	return g.Revoke(ctx, Entry{Kind: KindAgent, Subject: id, Shard: g.o.Shard, Reason: reason})
}

// Operators returns the operator records of the cluster, sorted by tenant
// and id (records of older versions included, under the tenant they name).
// An unreadable record is returned with only its tenant and id.
func (g *Gate) Operators(ctx context.Context) ([]registration.OperatorRecord, error) {
	listed, err := g.listOperators(ctx)
	if err != nil {
		return nil, err
	}
	ops := make([]string, 0, len(listed))
	for op := range listed {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	var out []registration.OperatorRecord
	for _, op := range ops {
		info := listed[op]
		obj, err := g.o.Store.Get(ctx, info.Key)
		if errors.Is(err, objstore.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", info.Key, err)
		}
		var rec registration.OperatorRecord
		if err := json.Unmarshal(obj.Body, &rec); err != nil {
			g.o.Log.Error(err, "unreadable operator record", "key", info.Key)
		}
		rec.Tenant, rec.ID, _ = strings.Cut(op, "/")
		out = append(out, rec)
	}
	return out, nil
}

// OperatorTenants returns the tenants that have a record of operator id,
// sorted.
func (g *Gate) OperatorTenants(ctx context.Context, id string) ([]string, error) {
	listed, err := g.listOperators(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for op := range listed {
		if tenant, oid, _ := strings.Cut(op, "/"); oid == id {
			out = append(out, tenant)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Run calls Sync every interval until ctx ends; errors are logged.
func (g *Gate) Run(ctx context.Context, interval time.Duration) {
	_ = wait.PollUntilContextCancel(ctx, interval, false, func(ctx context.Context) (bool, error) {
		if err := g.Sync(ctx); err != nil && ctx.Err() == nil {
			g.o.Log.Error(err, "syncing revocations")
		}
		return false, nil // every interval until ctx ends
	})
}
