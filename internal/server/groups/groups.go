package groups

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tailscale/hujson"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// Errors returned by the registry.
var (
	ErrNotFound = errors.New("group not found")
	// ErrQuota: the tenant already has as many dynamic groups, or as many
	// bytes of them, as allowed.
	ErrQuota  = errors.New("group quota reached")
	ErrStatic = errors.New("group is defined in the server config and cannot be changed through the API")
	ErrETag   = errors.New("group etag does not match")
)

// MaxSize bounds a group's size.
const MaxSize = 10000

// Spec is the desired state of a group.
type Spec struct {
	Template     string            `json:"template"`
	Size         int               `json:"size"`
	InstanceType string            `json:"instance_type,omitempty"`
	SubnetPool   string            `json:"subnet_pool,omitempty"`
	Vars         map[string]string `json:"vars,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	// DrainTimeout is the members' drain timeout: nil is the shard's
	// default, 0 disables the drain.
	DrainTimeout *time.Duration `json:"drain_timeout,omitempty"`
	// UserDataSHA256 names the bootstrap data the tenant sent (stored
	// encrypted by package userdata); empty means the template's userdata.
	UserDataSHA256 string `json:"user_data_sha256,omitempty"`
	UserDataFormat string `json:"user_data_format,omitempty"`
	// Image is the group's machine image, resolved as the reserved arg
	// provider.ArgImage (empty: the template's).
	Image string `json:"image,omitempty"`
	// Rollout bounds the rotation of drifted members (zero: the shard's
	// rotation_surge, nothing unavailable, not paused).
	Rollout Rollout `json:"rollout,omitzero"`
}

// Rollout is a group's rollout strategy.
type Rollout struct {
	// MaxSurge is how many members beyond the size a rotation may run; nil
	// means the shard's rotation_surge.
	MaxSurge *int `json:"max_surge,omitempty"`
	// MaxUnavailable is how many members below the size may be ready while
	// drifted members are replaced.
	MaxUnavailable int  `json:"max_unavailable,omitempty"`
	Paused         bool `json:"paused,omitempty"`
}

// Surge is the rotation's surge: MaxSurge, else the shard's.
func (r Rollout) Surge(shard int) int {
	if r.MaxSurge != nil {
		return *r.MaxSurge
	}
	return shard
}

func (s Spec) clone() Spec {
	s.Vars, s.Labels = maps.Clone(s.Vars), maps.Clone(s.Labels)
	if s.Rollout.MaxSurge != nil {
		v := *s.Rollout.MaxSurge
		s.Rollout.MaxSurge = &v
	}
	return s
}

// Group is one group with its bookkeeping.
type Group struct {
	Tenant    string    `json:"-"`
	ID        string    `json:"-"`
	Spec      Spec      `json:"spec"`
	Static    bool      `json:"-"`
	ETag      string    `json:"etag"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Key identifies a group.
type Key struct{ Tenant, ID string }

func (k Key) String() string { return k.Tenant + "/" + k.ID }

// Key returns the group's key.
func (g *Group) Key() Key { return Key{g.Tenant, g.ID} }

// document is the shared groups document of a shard (groups/{shard}.jsonc),
// which held every tenant's groups before each tenant had its own. Servers
// still read it: a tenant without its own document keeps its groups there
// until its first write moves them.
type document struct {
	Version int                         `json:"version"`
	Tenants map[string]map[string]Group `json:"tenants"`
}

// tenantDocument is one tenant's groups (groups/{shard}/{tenant}.jsonc).
// Every group write rewrites only its tenant's document, so one tenant's
// groups never make another tenant's writes slower.
type tenantDocument struct {
	Version int              `json:"version"`
	Groups  map[string]Group `json:"groups"`
}

// tenantDocVersion is the version of tenant documents.
const tenantDocVersion = 2

// Registry holds the static and dynamic groups of one shard.
type Registry struct {
	obj   objstore.Store
	keys  layout.Keys
	shard string
	now   func() time.Time

	writeMu sync.Mutex
	// sizes remembers the stored size of each group version, by tenant
	// and group (entrySize); written under writeMu.
	sizes map[string]map[string]sizeEntry
	// queued holds, per tenant, the changes waiting for the next write of
	// the tenant's document (modify).
	queueMu sync.Mutex
	queued  map[string][]*change
	mu      sync.RWMutex
	static  map[Key]*Group
	dynamic map[Key]*Group
	// shared holds the tenants of the shared document; a tenant with its
	// own document (an entry in tenantETags) is served from that instead.
	shared map[string]map[string]Group
	// tenantETags are the etags of the tenants' own documents.
	tenantETags map[string]string
	// loaded is true once dynamic reflects storage at the etags above, so
	// writes can start from memory instead of re-reading storage (a
	// document from the cache may be stale: the conditional write then
	// fails and the write re-reads storage).
	loaded bool
	// mirror, when set, keeps a local copy of the documents (SQLite cache).
	mirror Mirror
}

// Mirror is a local copy of the dynamic groups documents that a new leader
// starts from.
type Mirror interface {
	// LoadDocs returns every mirrored document (the shared one under
	// layout.Keys.Groups, tenants' under TenantGroups); ErrNoMirror when
	// the mirror was never filled from storage.
	LoadDocs(ctx context.Context) ([]MirroredDoc, error)
	// PutDoc records a document as storage holds it (nil body: none).
	PutDoc(ctx context.Context, key string, body []byte, etag string) error
}

// MirroredDoc is one document of a Mirror.
type MirroredDoc struct {
	Key  string
	Body []byte
	ETag string
}

// ErrNoMirror reports a mirror that holds nothing usable.
var ErrNoMirror = errors.New("no usable mirror")

// SetMirror sets the local copy the registry reads with LoadCached and
// writes after every load and change. Call before use.
func (r *Registry) SetMirror(m Mirror) { r.mirror = m }

// NewRegistry returns an empty registry.
func NewRegistry(obj objstore.Store, keys layout.Keys, shard string) *Registry {
	return &Registry{obj: obj, keys: keys, shard: shard, now: time.Now, static: map[Key]*Group{}, dynamic: map[Key]*Group{},
		shared: map[string]map[string]Group{}, tenantETags: map[string]string{}}
}

func staticETag(k Key, s Spec) string {
	b, _ := json.Marshal(s)
	h := sha256.Sum256(append([]byte(k.String()+"\x00"), b...))
	return "s-" + hex.EncodeToString(h[:8])
}

func newETag() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "d-" + hex.EncodeToString(b)
}

// SetStatic replaces the static groups with those of cfg and returns the keys
// whose static definition appeared, changed or disappeared.
func (r *Registry) SetStatic(cfg *config.Config) []Key {
	next := map[Key]*Group{}
	now := r.now()
	for tenant, gs := range cfg.Groups {
		for id, g := range gs {
			k := Key{tenant, id}
			spec := Spec{Template: g.Template, Size: g.Size, InstanceType: g.InstanceType, SubnetPool: g.SubnetPool,
				Vars: maps.Clone(g.Vars)}
			if g.DrainTimeout != nil {
				spec.DrainTimeout = new(g.DrainTimeout.D())
			}
			next[k] = &Group{Tenant: tenant, ID: id, Spec: spec, Static: true, ETag: staticETag(k, spec), UpdatedAt: now}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var changed []Key
	for k, g := range next {
		if old, ok := r.static[k]; ok && old.ETag == g.ETag {
			next[k] = old
			continue
		}
		changed = append(changed, k)
	}
	for k := range r.static {
		if _, ok := next[k]; !ok {
			changed = append(changed, k)
		}
	}
	r.static = next
	sortKeys(changed)
	return changed
}

func sortKeys(ks []Key) {
	sort.Slice(ks, func(i, j int) bool {
		if ks[i].Tenant != ks[j].Tenant {
			return ks[i].Tenant < ks[j].Tenant
		}
		return ks[i].ID < ks[j].ID
	})
}

// stored is what storage (or the mirror) holds: the shared document and
// each tenant's own.
type stored struct {
	shared  map[string]map[string]Group
	tenants map[string]tenantStored
}

type tenantStored struct {
	groups map[string]Group
	etag   string
}

func (r *Registry) parseShared(body []byte) (map[string]map[string]Group, error) {
	std, err := hujson.Standardize(body)
	if err != nil {
		return nil, fmt.Errorf("dynamic groups %s are not valid JSONC: %w", r.keys.Groups(r.shard), err)
	}
	var d document
	if err := json.Unmarshal(std, &d); err != nil {
		return nil, fmt.Errorf("decoding dynamic groups %s: %w", r.keys.Groups(r.shard), err)
	}
	if d.Tenants == nil {
		d.Tenants = map[string]map[string]Group{}
	}
	return d.Tenants, nil
}

func (r *Registry) parseTenant(key string, body []byte) (map[string]Group, error) {
	std, err := hujson.Standardize(body)
	if err != nil {
		return nil, fmt.Errorf("dynamic groups %s are not valid JSONC: %w", key, err)
	}
	var d tenantDocument
	if err := json.Unmarshal(std, &d); err != nil {
		return nil, fmt.Errorf("decoding dynamic groups %s: %w", key, err)
	}
	if d.Groups == nil {
		d.Groups = map[string]Group{}
	}
	return d.Groups, nil
}

// tenantOf returns the tenant whose document key is, if it is one.
func (r *Registry) tenantOf(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, r.keys.TenantGroupsPrefix(r.shard))
	if !ok || strings.Contains(rest, "/") {
		return "", false
	}
	return strings.CutSuffix(rest, ".jsonc")
}

// readShared reads the shared document (none: empty) and returns its body
// (nil: none) for the mirror.
func (r *Registry) readShared(ctx context.Context) (map[string]map[string]Group, []byte, string, error) {
	o, err := r.obj.Get(ctx, r.keys.Groups(r.shard))
	if errors.Is(err, objstore.ErrNotFound) {
		return map[string]map[string]Group{}, nil, "", nil
	}
	if err != nil {
		return nil, nil, "", fmt.Errorf("reading dynamic groups: %w", err)
	}
	shared, err := r.parseShared(o.Body)
	return shared, o.Body, o.ETag, err
}

// readTenant reads one tenant's groups from storage: its own document, or
// (own false) its part of the shared document.
func (r *Registry) readTenant(ctx context.Context, tenant string) (gs map[string]Group, etag string, own bool, err error) {
	key := r.keys.TenantGroups(r.shard, tenant)
	o, err := r.obj.Get(ctx, key)
	if err == nil {
		gs, err = r.parseTenant(key, o.Body)
		return gs, o.ETag, true, err
	}
	if !errors.Is(err, objstore.ErrNotFound) {
		return nil, "", false, fmt.Errorf("reading dynamic groups: %w", err)
	}
	shared, _, _, err := r.readShared(ctx)
	if err != nil {
		return nil, "", false, err
	}
	gs = shared[tenant]
	if gs == nil {
		gs = map[string]Group{}
	}
	return gs, "", false, nil
}

// install makes memory equal to st and returns the changed keys.
func (r *Registry) install(st stored) []Key {
	next := map[Key]*Group{}
	add := func(tenant string, gs map[string]Group) {
		for id, g := range gs {
			g := g
			g.Tenant, g.ID = tenant, id
			next[Key{tenant, id}] = &g
		}
	}
	etags := map[string]string{}
	for tenant, gs := range st.shared {
		if _, own := st.tenants[tenant]; !own {
			add(tenant, gs)
		}
	}
	for tenant, t := range st.tenants {
		add(tenant, t.groups)
		etags[tenant] = t.etag
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	changed := r.swap(next, func(Key) bool { return true })
	r.shared, r.tenantETags, r.loaded = st.shared, etags, true
	return changed
}

// installTenant replaces one tenant's groups in memory: from its own
// document at etag, or (own false) from the shared document.
func (r *Registry) installTenant(tenant string, gs map[string]Group, etag string, own bool) []Key {
	next := map[Key]*Group{}
	for id, g := range gs {
		g := g
		g.Tenant, g.ID = tenant, id
		next[Key{tenant, id}] = &g
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	changed := r.swap(next, func(k Key) bool { return k.Tenant == tenant })
	if own {
		r.tenantETags[tenant] = etag
	} else {
		delete(r.tenantETags, tenant)
		r.shared[tenant] = gs
	}
	return changed
}

// swap replaces the dynamic groups that match with next and returns the
// keys that appeared, changed or disappeared. r.mu is held.
func (r *Registry) swap(next map[Key]*Group, match func(Key) bool) []Key {
	var changed []Key
	for k, g := range next {
		if old, ok := r.dynamic[k]; !ok || old.ETag != g.ETag {
			changed = append(changed, k)
		}
	}
	for k := range r.dynamic {
		if !match(k) {
			continue
		}
		if _, ok := next[k]; !ok {
			changed = append(changed, k)
			delete(r.dynamic, k)
		}
	}
	for k, g := range next {
		r.dynamic[k] = g
	}
	sortKeys(changed)
	return changed
}

// cachedTenant copies one tenant's groups from memory; ok is false before
// the first load.
func (r *Registry) cachedTenant(tenant string) (gs map[string]Group, etag string, own, ok bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if !r.loaded {
		return nil, "", false, false
	}
	gs = map[string]Group{}
	for k, g := range r.dynamic {
		if k.Tenant == tenant {
			c := *g
			c.Spec = g.Spec.clone()
			gs[k.ID] = c
		}
	}
	etag, own = r.tenantETags[tenant]
	return gs, etag, own, true
}

// Load reads the dynamic groups from storage and returns the changed keys:
// the shared document and a listing of the tenants' documents, reading
// only those whose etag differs from what memory holds.
func (r *Registry) Load(ctx context.Context) ([]Key, error) {
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	shared, sharedBody, sharedETag, err := r.readShared(ctx)
	if err != nil {
		return nil, err
	}
	infos, err := r.obj.List(ctx, r.keys.TenantGroupsPrefix(r.shard))
	if err != nil {
		return nil, fmt.Errorf("listing dynamic groups: %w", err)
	}
	st := stored{shared: shared, tenants: map[string]tenantStored{}}
	var read []MirroredDoc
	for _, info := range infos {
		tenant, ok := r.tenantOf(info.Key)
		if !ok {
			continue
		}
		if gs, etag, own, ok := r.cachedTenant(tenant); ok && own && etag == info.ETag && etag != "" {
			st.tenants[tenant] = tenantStored{groups: gs, etag: etag}
			continue
		}
		o, err := r.obj.Get(ctx, info.Key)
		if errors.Is(err, objstore.ErrNotFound) {
			continue // deleted since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("reading dynamic groups: %w", err)
		}
		gs, err := r.parseTenant(info.Key, o.Body)
		if err != nil {
			return nil, err
		}
		st.tenants[tenant] = tenantStored{groups: gs, etag: o.ETag}
		read = append(read, MirroredDoc{Key: info.Key, Body: o.Body, ETag: o.ETag})
	}
	changed := r.install(st)
	if r.mirror != nil {
		read = append(read, MirroredDoc{Key: r.keys.Groups(r.shard), Body: sharedBody, ETag: sharedETag})
		for _, d := range read {
			if err := r.mirror.PutDoc(ctx, d.Key, d.Body, d.ETag); err != nil {
				return changed, fmt.Errorf("caching dynamic groups: %w", err)
			}
		}
	}
	return changed, nil
}

// LoadCached installs the dynamic groups from the mirror, without reading
// storage, and returns the changed keys; ok is false (nothing installed)
// without a usable mirror. The groups may be stale until Load.
func (r *Registry) LoadCached(ctx context.Context) (changed []Key, ok bool, err error) {
	if r.mirror == nil {
		return nil, false, nil
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	docs, err := r.mirror.LoadDocs(ctx)
	if errors.Is(err, ErrNoMirror) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("reading cached groups: %w", err)
	}
	st := stored{shared: map[string]map[string]Group{}, tenants: map[string]tenantStored{}}
	for _, d := range docs {
		if d.Key == r.keys.Groups(r.shard) {
			if st.shared, err = r.parseShared(d.Body); err != nil {
				return nil, false, nil // a bad cached copy is ignored; Load reads storage
			}
			continue
		}
		tenant, ok := r.tenantOf(d.Key)
		if !ok {
			continue
		}
		gs, err := r.parseTenant(d.Key, d.Body)
		if err != nil {
			return nil, false, nil
		}
		st.tenants[tenant] = tenantStored{groups: gs, etag: d.ETag}
	}
	return r.install(st), true, nil
}

// Get returns a copy of one group. A static group hides a dynamic one of the same name.
func (r *Registry) Get(k Key) (*Group, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	g, ok := r.static[k]
	if !ok {
		g, ok = r.dynamic[k]
	}
	if !ok {
		return nil, false
	}
	c := *g
	c.Spec = g.Spec.clone()
	return &c, true
}

// List returns the groups of a tenant (all tenants when tenant is empty), sorted.
func (r *Registry) List(tenant string) []*Group {
	r.mu.RLock()
	seen := map[Key]bool{}
	var out []*Group
	for _, m := range []map[Key]*Group{r.static, r.dynamic} {
		for k, g := range m {
			if (tenant != "" && k.Tenant != tenant) || seen[k] {
				continue
			}
			seen[k] = true
			c := *g
			c.Spec = g.Spec.clone()
			out = append(out, &c)
		}
	}
	r.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Tenant != out[j].Tenant {
			return out[i].Tenant < out[j].Tenant
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// modify runs fn over one tenant's groups and writes the tenant's document
// with optimistic concurrency, retrying when another server wrote in
// between. Other tenants' documents are neither read nor written.
//
// Concurrent calls for one tenant are committed together (group commit):
// fn joins the tenant's queue, and whichever caller next holds writeMu
// applies every queued change in arrival order and writes the document once
// for all of them. A call returns only once its own change is stored (or
// refused: fn's error is that caller's alone, and its change is left out of
// the write). fn may add, replace or delete entries of gs but must not
// change a Group value in place, and must leave gs untouched when it
// returns an error.
func (r *Registry) modify(ctx context.Context, tenant string, fn func(gs map[string]Group) error) error {
	c := &change{fn: fn}
	r.queueMu.Lock()
	if r.queued == nil {
		r.queued = map[string][]*change{}
	}
	r.queued[tenant] = append(r.queued[tenant], c)
	r.queueMu.Unlock()

	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	if c.done {
		return c.err // an earlier holder of writeMu committed it
	}
	r.queueMu.Lock()
	batch := r.queued[tenant]
	delete(r.queued, tenant)
	r.queueMu.Unlock()
	r.commit(ctx, tenant, batch, c)
	return c.err
}

// change is one caller's modification waiting to be committed; done and err
// are written and read under writeMu.
type change struct {
	fn   func(gs map[string]Group) error
	done bool
	err  error
}

// commit applies batch (which holds own, the caller's change) to the
// tenant's document and writes it once. When the write fails because the
// caller's ctx ended, only own fails: the others go back to the queue, and
// each of their callers commits them when it holds writeMu.
func (r *Registry) commit(ctx context.Context, tenant string, batch []*change, own *change) {
	// finish records the outcome: err (nil: stored) for every change fn did
	// not refuse.
	finish := func(err error) {
		if ctx.Err() != nil && err != nil {
			own.done, own.err = true, err
			var rest []*change
			for _, c := range batch {
				if c != own {
					rest = append(rest, c)
				}
			}
			if len(rest) > 0 {
				r.queueMu.Lock()
				r.queued[tenant] = append(rest, r.queued[tenant]...)
				r.queueMu.Unlock()
			}
			return
		}
		for _, c := range batch {
			// A change refused by its own fn keeps that error.
			if c.err == nil {
				c.err = err
			}
			c.done = true
		}
	}
	key := r.keys.TenantGroups(r.shard, tenant)
	for attempt := 0; ; attempt++ {
		// First try from memory; after a refusal or a conflict, re-read
		// storage.
		gs, etag, own, ok := r.cachedTenant(tenant)
		if !ok || attempt > 0 {
			var err error
			if gs, etag, own, err = r.readTenant(ctx, tenant); err != nil {
				finish(err)
				return
			}
		}
		refused, applied := r.apply(gs, batch)
		if refused && ok && attempt == 0 {
			continue // confirm against storage before refusing
		}
		if !applied {
			r.installTenant(tenant, gs, etag, own)
			finish(nil) // every change was refused, each with its error
			return
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetIndent("", "  ")
		if err := enc.Encode(tenantDocument{Version: tenantDocVersion, Groups: gs}); err != nil {
			finish(fmt.Errorf("encoding dynamic groups: %w", err))
			return
		}
		opts := objstore.PutOptions{IfMatch: etag}
		if !own {
			opts = objstore.PutOptions{IfNoneMatch: true}
		}
		newTag, err := r.obj.Put(ctx, key, buf.Bytes(), opts)
		if errors.Is(err, objstore.ErrPreconditionFailed) && attempt < 5 {
			continue
		}
		if err != nil {
			finish(fmt.Errorf("writing dynamic groups: %w", err))
			return
		}
		r.installTenant(tenant, gs, newTag, true)
		r.pruneSizes(tenant, gs)
		if r.mirror != nil {
			if err := r.mirror.PutDoc(ctx, key, buf.Bytes(), newTag); err != nil {
				finish(fmt.Errorf("caching dynamic groups: %w", err))
				return
			}
		}
		finish(nil)
		return
	}
}

// apply runs the batch's changes over gs in order. A change that fails is
// left out (gs is as if it had not run) and keeps its error; refused says
// whether any failed, applied whether any succeeded.
//
// A change's fn must leave gs as it was when it returns an error (both
// Upsert and Delete check first and write last): copying the document
// before every change made a batch of n changes at n groups cost n² copies.
func (r *Registry) apply(gs map[string]Group, batch []*change) (refused, applied bool) {
	for _, c := range batch {
		c.err = nil
		if err := c.fn(gs); err != nil {
			c.err, refused = err, true
			continue
		}
		applied = true
	}
	return refused, applied
}

// sizeEntry remembers entryBytes of one group version.
type sizeEntry struct {
	etag  string
	bytes int
}

// entrySize is entryBytes of tenant's group id, remembered by the group's
// ETag (every stored version has its own): the quota check of each change
// sums the tenant's other groups, and encoding every one of them for every
// change of a batch was the bulk of a group commit. Callers hold writeMu.
func (r *Registry) entrySize(tenant, id string, g Group) int {
	if g.ETag == "" {
		return entryBytes(id, g.Spec)
	}
	if r.sizes == nil {
		r.sizes = map[string]map[string]sizeEntry{}
	}
	t := r.sizes[tenant]
	if t == nil {
		t = map[string]sizeEntry{}
		r.sizes[tenant] = t
	}
	if e, ok := t[id]; ok && e.etag == g.ETag {
		return e.bytes
	}
	b := entryBytes(id, g.Spec)
	t[id] = sizeEntry{etag: g.ETag, bytes: b}
	return b
}

// pruneSizes forgets the remembered sizes of tenant's groups not in gs.
// Callers hold writeMu.
func (r *Registry) pruneSizes(tenant string, gs map[string]Group) {
	for id := range r.sizes[tenant] {
		if _, ok := gs[id]; !ok {
			delete(r.sizes[tenant], id)
		}
	}
}

// Upsert creates or replaces a dynamic group. expectedETag, when set, must
// match the stored group (and the group must exist).
func (r *Registry) Upsert(ctx context.Context, k Key, spec Spec, expectedETag string) (*Group, bool, error) {
	return r.UpsertWithin(ctx, k, spec, expectedETag, Quota{})
}

// Quota bounds the dynamic groups of one tenant (0: no limit).
type Quota struct {
	// Groups caps how many dynamic groups a tenant has
	// (shard.limits.max_groups_per_tenant).
	Groups int
	// Bytes caps the stored size of a tenant's dynamic groups: every
	// group's id, its spec as JSON and 100 bytes for the rest of its entry
	// in the shard's groups document (shard.limits.max_tenant_group_bytes).
	Bytes int
}

// entryOverhead stands for what a stored group holds besides its id and
// spec (etag, update time, JSON punctuation), fixed so that a group's size
// does not change with the digits of its timestamp.
const entryOverhead = 100

// entryBytes is what a group with id and spec takes in the document.
func entryBytes(id string, spec Spec) int {
	b, err := json.Marshal(spec)
	if err != nil {
		return len(id) + entryOverhead
	}
	return len(id) + len(b) + entryOverhead
}

// UpsertWithin is Upsert refusing (ErrQuota) to create a group for a tenant
// that already has q.Groups dynamic groups, or to grow a tenant's groups
// beyond q.Bytes; replacing an existing group by one no larger is always
// allowed (a lowered limit never blocks shrinking). Both are taken on the
// tenant's stored document being written, so concurrent writes cannot
// overshoot.
func (r *Registry) UpsertWithin(ctx context.Context, k Key, spec Spec, expectedETag string, q Quota) (*Group, bool, error) {
	if _, ok := r.getStatic(k); ok {
		return nil, false, fmt.Errorf("%s: %w", k, ErrStatic)
	}
	var out Group
	created := false
	err := r.modify(ctx, k.Tenant, func(gs map[string]Group) error {
		old, exists := gs[k.ID]
		if expectedETag != "" && (!exists || old.ETag != expectedETag) {
			return fmt.Errorf("%s: %w (stored %q, expected %q)", k, ErrETag, old.ETag, expectedETag)
		}
		if !exists && q.Groups > 0 && len(gs) >= q.Groups {
			return fmt.Errorf("%w: tenant %s already has %d dynamic groups (shard.limits.max_groups_per_tenant); delete one first", ErrQuota, k.Tenant, len(gs))
		}
		next := Group{Tenant: k.Tenant, ID: k.ID, Spec: spec.clone(), ETag: newETag(), UpdatedAt: r.now().UTC()}
		if q.Bytes > 0 {
			others := 0
			for id, g := range gs {
				if id != k.ID {
					others += r.entrySize(k.Tenant, id, g)
				}
			}
			size, was := entryBytes(k.ID, next.Spec), 0
			if exists {
				was = entryBytes(k.ID, old.Spec)
			}
			if others+size > q.Bytes && size > was {
				return fmt.Errorf("%w: group %s of tenant %s takes %d bytes stored, the tenant's other groups %d: more than shard.limits.max_tenant_group_bytes (%d); make groups smaller or delete one first",
					ErrQuota, k.ID, k.Tenant, size, others, q.Bytes)
			}
		}
		created, out = !exists, next
		gs[k.ID] = out
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return &out, created, nil
}

func (r *Registry) getStatic(k Key) (*Group, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	g, ok := r.static[k]
	return g, ok
}

// Delete removes a dynamic group and returns what it was.
func (r *Registry) Delete(ctx context.Context, k Key, expectedETag string) (*Group, error) {
	if _, ok := r.getStatic(k); ok {
		return nil, fmt.Errorf("%s: %w", k, ErrStatic)
	}
	var out Group
	err := r.modify(ctx, k.Tenant, func(gs map[string]Group) error {
		old, ok := gs[k.ID]
		if !ok {
			return fmt.Errorf("%s: %w", k, ErrNotFound)
		}
		if expectedETag != "" && old.ETag != expectedETag {
			return fmt.Errorf("%s: %w (stored %q, expected %q)", k, ErrETag, old.ETag, expectedETag)
		}
		out = old
		out.Tenant, out.ID = k.Tenant, k.ID
		// The tenant's document stays, empty: it replaces the tenant's part
		// of the shared document.
		delete(gs, k.ID)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}
