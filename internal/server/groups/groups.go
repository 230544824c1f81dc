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
	DrainTimeout time.Duration     `json:"drain_timeout,omitempty"`
	// UserDataSHA256 names the bootstrap data the tenant sent (stored
	// encrypted by package userdata); empty means the template's userdata.
	UserDataSHA256 string `json:"user_data_sha256,omitempty"`
	UserDataFormat string `json:"user_data_format,omitempty"`
}

func (s Spec) clone() Spec {
	s.Vars, s.Labels = maps.Clone(s.Vars), maps.Clone(s.Labels)
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

type document struct {
	Version int                         `json:"version"`
	Tenants map[string]map[string]Group `json:"tenants"`
}

// Registry holds the static and dynamic groups of one shard.
type Registry struct {
	obj   objstore.Store
	keys  layout.Keys
	shard string
	now   func() time.Time

	writeMu sync.Mutex
	mu      sync.RWMutex
	static  map[Key]*Group
	dynamic map[Key]*Group
	docETag string
	// loaded is true once dynamic reflects the stored document at docETag,
	// so writes can start from memory instead of re-reading storage (a
	// document from the cache may be stale: the conditional write then
	// fails and the write re-reads storage).
	loaded bool
	// mirror, when set, keeps a local copy of the document (SQLite cache).
	mirror Mirror
}

// Mirror is a local copy of the dynamic groups document that a new leader
// starts from.
type Mirror interface {
	// LoadDoc returns the mirrored document and its etag (nil body: storage
	// had none); ErrNoMirror when the mirror was never filled from storage.
	LoadDoc(ctx context.Context) (body []byte, etag string, err error)
	// PutDoc records the document as storage holds it (nil body: none).
	PutDoc(ctx context.Context, body []byte, etag string) error
}

// ErrNoMirror reports a mirror that holds nothing usable.
var ErrNoMirror = errors.New("no usable mirror")

// SetMirror sets the local copy the registry reads with LoadCached and
// writes after every load and change. Call before use.
func (r *Registry) SetMirror(m Mirror) { r.mirror = m }

// NewRegistry returns an empty registry.
func NewRegistry(obj objstore.Store, keys layout.Keys, shard string) *Registry {
	return &Registry{obj: obj, keys: keys, shard: shard, now: time.Now, static: map[Key]*Group{}, dynamic: map[Key]*Group{}}
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
				Vars: maps.Clone(g.Vars), DrainTimeout: g.DrainTimeout.D()}
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

func (r *Registry) readDoc(ctx context.Context) (*document, string, error) {
	d, etag, _, err := r.readDocBody(ctx)
	return d, etag, err
}

func (r *Registry) readDocBody(ctx context.Context) (*document, string, []byte, error) {
	o, err := r.obj.Get(ctx, r.keys.Groups(r.shard))
	if errors.Is(err, objstore.ErrNotFound) {
		return emptyDoc(), "", nil, nil
	}
	if err != nil {
		return nil, "", nil, fmt.Errorf("reading dynamic groups: %w", err)
	}
	d, err := r.parseDoc(o.Body)
	if err != nil {
		return nil, "", nil, err
	}
	return d, o.ETag, o.Body, nil
}

func emptyDoc() *document {
	return &document{Version: 1, Tenants: map[string]map[string]Group{}}
}

func (r *Registry) parseDoc(body []byte) (*document, error) {
	std, err := hujson.Standardize(body)
	if err != nil {
		return nil, fmt.Errorf("dynamic groups %s are not valid JSONC: %w", r.keys.Groups(r.shard), err)
	}
	var d document
	if err := json.Unmarshal(std, &d); err != nil {
		return nil, fmt.Errorf("decoding dynamic groups: %w", err)
	}
	if d.Tenants == nil {
		d.Tenants = map[string]map[string]Group{}
	}
	return &d, nil
}

func (r *Registry) install(d *document, etag string) []Key {
	next := map[Key]*Group{}
	for tenant, gs := range d.Tenants {
		for id, g := range gs {
			g := g
			g.Tenant, g.ID = tenant, id
			next[Key{tenant, id}] = &g
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var changed []Key
	for k, g := range next {
		if old, ok := r.dynamic[k]; !ok || old.ETag != g.ETag {
			changed = append(changed, k)
		}
	}
	for k := range r.dynamic {
		if _, ok := next[k]; !ok {
			changed = append(changed, k)
		}
	}
	r.dynamic, r.docETag, r.loaded = next, etag, true
	sortKeys(changed)
	return changed
}

// cachedDoc rebuilds the document from memory; ok is false before the first load.
func (r *Registry) cachedDoc() (*document, string, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if !r.loaded {
		return nil, "", false
	}
	d := &document{Version: 1, Tenants: map[string]map[string]Group{}}
	for k, g := range r.dynamic {
		gs := d.Tenants[k.Tenant]
		if gs == nil {
			gs = map[string]Group{}
			d.Tenants[k.Tenant] = gs
		}
		c := *g
		c.Spec = g.Spec.clone()
		gs[k.ID] = c
	}
	return d, r.docETag, true
}

// Load reads the dynamic groups from storage and returns the changed keys.
func (r *Registry) Load(ctx context.Context) ([]Key, error) {
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	d, etag, body, err := r.readDocBody(ctx)
	if err != nil {
		return nil, err
	}
	changed := r.install(d, etag)
	if r.mirror != nil {
		if err := r.mirror.PutDoc(ctx, body, etag); err != nil {
			return changed, fmt.Errorf("caching dynamic groups: %w", err)
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
	body, etag, err := r.mirror.LoadDoc(ctx)
	if errors.Is(err, ErrNoMirror) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("reading cached groups: %w", err)
	}
	d := emptyDoc()
	if body != nil {
		if d, err = r.parseDoc(body); err != nil {
			return nil, false, nil // a bad cached copy is ignored; Load reads storage
		}
	}
	return r.install(d, etag), true, nil
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

// modify runs fn over the stored document with optimistic concurrency,
// retrying when another server wrote in between.
func (r *Registry) modify(ctx context.Context, fn func(d *document) error) error {
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	for attempt := 0; ; attempt++ {
		// First try from memory; after a conflict, re-read storage.
		d, etag, ok := r.cachedDoc()
		if !ok || attempt > 0 {
			var err error
			if d, etag, err = r.readDoc(ctx); err != nil {
				return err
			}
		}
		if err := fn(d); err != nil {
			if ok && attempt == 0 {
				continue // confirm against storage before refusing
			}
			r.install(d, etag)
			return err
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetIndent("", "  ")
		if err := enc.Encode(d); err != nil {
			return fmt.Errorf("encoding dynamic groups: %w", err)
		}
		opts := objstore.PutOptions{IfMatch: etag}
		if etag == "" {
			opts = objstore.PutOptions{IfNoneMatch: true}
		}
		newTag, err := r.obj.Put(ctx, r.keys.Groups(r.shard), buf.Bytes(), opts)
		if errors.Is(err, objstore.ErrPreconditionFailed) && attempt < 5 {
			continue
		}
		if err != nil {
			return fmt.Errorf("writing dynamic groups: %w", err)
		}
		r.install(d, newTag)
		if r.mirror != nil {
			if err := r.mirror.PutDoc(ctx, buf.Bytes(), newTag); err != nil {
				return fmt.Errorf("caching dynamic groups: %w", err)
			}
		}
		return nil
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
// stored document being written, so concurrent writes cannot overshoot.
func (r *Registry) UpsertWithin(ctx context.Context, k Key, spec Spec, expectedETag string, q Quota) (*Group, bool, error) {
	if _, ok := r.getStatic(k); ok {
		return nil, false, fmt.Errorf("%s: %w", k, ErrStatic)
	}
	var out Group
	created := false
	err := r.modify(ctx, func(d *document) error {
		gs := d.Tenants[k.Tenant]
		if gs == nil {
			gs = map[string]Group{}
			d.Tenants[k.Tenant] = gs
		}
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
					others += entryBytes(id, g.Spec)
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
	err := r.modify(ctx, func(d *document) error {
		old, ok := d.Tenants[k.Tenant][k.ID]
		if !ok {
			return fmt.Errorf("%s: %w", k, ErrNotFound)
		}
		if expectedETag != "" && old.ETag != expectedETag {
			return fmt.Errorf("%s: %w (stored %q, expected %q)", k, ErrETag, old.ETag, expectedETag)
		}
		out = old
		out.Tenant, out.ID = k.Tenant, k.ID
		delete(d.Tenants[k.Tenant], k.ID)
		if len(d.Tenants[k.Tenant]) == 0 {
			delete(d.Tenants, k.Tenant)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}
