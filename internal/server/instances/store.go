package instances

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/storage"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// ErrNotFound reports an unknown instance id.
var ErrNotFound = errors.New("instance not found")

// ErrExists reports a create for an id that already has a record.
var ErrExists = errors.New("instance already exists")

// ErrNoChange may be returned by an Update function to skip the write.
var ErrNoChange = errors.New("no change")

// MirrorObject is one record object as written to storage.
type MirrorObject struct {
	Key  string
	ETag string
	Body []byte
}

// Mirror is a local copy of the records (the server's SQLite cache) that a
// new leader starts from. It receives every change after the object-storage
// write succeeded; keys are full object keys.
type Mirror interface {
	// Load returns every mirrored object; ErrNoMirror when the mirror was
	// never filled from storage (its content would mean nothing).
	Load(ctx context.Context) ([]MirrorObject, error)
	// Apply writes puts and removes deletes in one step.
	Apply(ctx context.Context, puts []MirrorObject, deletes []string) error
	Put(ctx context.Context, obj MirrorObject) error
	Delete(ctx context.Context, key string) error
}

// ErrNoMirror reports a mirror that holds nothing usable.
var ErrNoMirror = errors.New("no usable mirror")

// entry is one indexed record. Its record is never changed once stored (a
// write stores a fresh copy in a new entry), so readers copy it after
// releasing mu: the lock is held for map lookups only, and a hundred
// concurrent writers do not queue behind a group listing's copies.
type entry struct {
	rec  *Record
	etag string
}

// Store is the record store of one shard. Safe for concurrent use; updates to
// one instance are serialised.
type Store struct {
	obj    objstore.Store
	keys   layout.Keys
	shard  string
	mirror Mirror
	// mirrorMu orders mirror writes with the index, so a batch written by
	// Sync never replaces a newer record an Update mirrored meanwhile.
	mirrorMu sync.Mutex

	mu      sync.RWMutex
	entries map[string]*entry
	tokens  map[string]string              // tenant + "\x00" + client token -> id
	byGroup map[string]map[string]struct{} // tenant + "\x00" + group -> ids

	locks [64]sync.Mutex
}

// NewStore returns an empty store; call Load to fill it from storage.
func NewStore(obj objstore.Store, keys layout.Keys, shard string, mirror Mirror) *Store {
	return &Store{obj: obj, keys: keys, shard: shard, mirror: mirror, entries: map[string]*entry{}, tokens: map[string]string{}, byGroup: map[string]map[string]struct{}{}}
}

func (s *Store) lock(id string) *sync.Mutex {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return &s.locks[h.Sum32()%uint32(len(s.locks))]
}

func tokenKey(tenant, token string) string { return tenant + "\x00" + token }

// Load makes the index equal to object storage (see Sync).
func (s *Store) Load(ctx context.Context) error {
	_, err := s.Sync(ctx)
	return err
}

// LoadCached replaces the index with the mirror's content (the records as
// this server last saw them), without reading object storage. It reports
// false, leaving the index alone, when there is no usable mirror. The index
// may then be stale in every direction until Sync has run: callers serve
// reads from it but decide nothing (no create, no delete) before Sync.
func (s *Store) LoadCached(ctx context.Context) (int, bool, error) {
	if s.mirror == nil {
		return 0, false, nil
	}
	objs, err := s.mirror.Load(ctx)
	if errors.Is(err, ErrNoMirror) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("reading cached records: %w", err)
	}
	prefix := s.keys.InstancePrefix(s.shard)
	var bad []string
	s.mu.Lock()
	s.entries, s.tokens, s.byGroup = map[string]*entry{}, map[string]string{}, map[string]map[string]struct{}{}
	for _, o := range objs {
		r, ok := decode(prefix, o.Key, o.Body)
		if !ok {
			bad = append(bad, o.Key)
			continue
		}
		s.setLocked(r, o.ETag)
	}
	n := len(s.entries)
	s.mu.Unlock()
	if len(bad) > 0 {
		if err := s.mirror.Apply(ctx, nil, bad); err != nil {
			return n, true, fmt.Errorf("dropping unreadable cached records: %w", err)
		}
	}
	return n, true, nil
}

// decode parses a record object; a torn or foreign object (not valid JSON,
// no id, or an id that is not its key's) is refused.
func decode(prefix, key string, body []byte) (*Record, bool) {
	var r Record
	if err := json.Unmarshal(body, &r); err != nil || r.ID == "" || key != prefix+r.ID+".json" {
		return nil, false
	}
	return &r, true
}

// SyncResult says what Sync changed in the index.
type SyncResult struct {
	// Listed is the number of record objects in storage; Fetched how many
	// of them were read (new or changed etag).
	Listed, Fetched int
	// Changed are the ids whose record was added or replaced.
	Changed []string
	// Removed are the records storage no longer has (as the index held them).
	Removed []*Record
}

// Sync makes the index equal to object storage, the source of truth: one
// listing (which carries every object's etag), then a read of each record
// whose etag differs from the index's, and removal of the records storage
// no longer holds. With an index filled by LoadCached this reads only what
// changed since the cache was written; with an empty index it reads every
// record. Safe beside concurrent Create/Update/Delete: each record is
// re-read under its lock, and a record written after the listing is never
// dropped. The mirror is brought in line in one batch.
func (s *Store) Sync(ctx context.Context) (SyncResult, error) {
	var res SyncResult
	s.mu.RLock()
	snap := make(map[string]string, len(s.entries))
	for id, e := range s.entries {
		snap[id] = e.etag
	}
	s.mu.RUnlock()
	prefix := s.keys.InstancePrefix(s.shard)
	list, err := s.obj.List(ctx, prefix)
	if err != nil {
		return res, fmt.Errorf("listing instance records: %w", err)
	}
	res.Listed = len(list)
	listed := make(map[string]bool, len(list))
	var fetch []string
	for _, info := range list {
		id := strings.TrimSuffix(strings.TrimPrefix(info.Key, prefix), ".json")
		if id == "" || strings.Contains(id, "/") || info.Key != prefix+id+".json" {
			continue // not a record object
		}
		listed[id] = true
		if etag, ok := snap[id]; ok && etag == info.ETag && etag != "" {
			continue
		}
		fetch = append(fetch, id)
	}
	res.Fetched = len(fetch)
	var (
		outMu   sync.Mutex
		puts    []MirrorObject
		deletes []string
	)
	removed := func(rec *Record, key string) {
		outMu.Lock()
		defer outMu.Unlock()
		deletes = append(deletes, key)
		if rec != nil {
			res.Removed = append(res.Removed, rec)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for _, id := range fetch {
		g.Go(func() error {
			key := s.keys.Instance(s.shard, id)
			l := s.lock(id)
			l.Lock()
			defer l.Unlock()
			o, err := s.obj.Get(gctx, key)
			if errors.Is(err, objstore.ErrNotFound) {
				removed(s.dropGet(id), key) // deleted since the listing
				return nil
			}
			if err != nil {
				return fmt.Errorf("reading %s: %w", key, err)
			}
			r, ok := decode(prefix, key, o.Body)
			if !ok {
				// A torn or foreign object is not a record: skipped, never fatal.
				removed(s.dropGet(id), key)
				return nil
			}
			s.set(r, o.ETag)
			outMu.Lock()
			puts = append(puts, MirrorObject{Key: key, ETag: o.ETag, Body: o.Body})
			res.Changed = append(res.Changed, id)
			outMu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return res, err
	}
	// Records the index held before the listing that storage does not
	// list are gone, unless this store wrote them since (new etag).
	for id, etag := range snap {
		if listed[id] {
			continue
		}
		l := s.lock(id)
		l.Lock()
		if _, cur, ok := s.current(id); ok && cur == etag {
			removed(s.dropGet(id), s.keys.Instance(s.shard, id))
		}
		l.Unlock()
	}
	sort.Strings(res.Changed)
	sort.Slice(res.Removed, func(i, j int) bool { return res.Removed[i].ID < res.Removed[j].ID })
	if s.mirror != nil {
		if err := s.applyMirror(ctx, puts, deletes); err != nil {
			return res, fmt.Errorf("updating the cache: %w", err)
		}
	}
	return res, nil
}

// applyMirror writes a Sync batch, leaving out what the index no longer
// matches (a newer write mirrored itself).
func (s *Store) applyMirror(ctx context.Context, puts []MirrorObject, deletes []string) error {
	s.mirrorMu.Lock()
	defer s.mirrorMu.Unlock()
	prefix := s.keys.InstancePrefix(s.shard)
	s.mu.RLock()
	keepPuts := puts[:0]
	for _, p := range puts {
		if e, ok := s.entries[strings.TrimSuffix(strings.TrimPrefix(p.Key, prefix), ".json")]; ok && e.etag == p.ETag {
			keepPuts = append(keepPuts, p)
		}
	}
	keepDel := deletes[:0]
	for _, k := range deletes {
		if _, ok := s.entries[strings.TrimSuffix(strings.TrimPrefix(k, prefix), ".json")]; !ok {
			keepDel = append(keepDel, k)
		}
	}
	s.mu.RUnlock()
	return s.mirror.Apply(ctx, keepPuts, keepDel)
}

// mirrorPut and mirrorDelete mirror one write (after storage took it).
func (s *Store) mirrorPut(ctx context.Context, o MirrorObject) error {
	if s.mirror == nil {
		return nil
	}
	s.mirrorMu.Lock()
	defer s.mirrorMu.Unlock()
	return s.mirror.Put(ctx, o)
}

func (s *Store) mirrorDelete(ctx context.Context, key string) error {
	if s.mirror == nil {
		return nil
	}
	s.mirrorMu.Lock()
	defer s.mirrorMu.Unlock()
	return s.mirror.Delete(ctx, key)
}

// Get returns a copy of one record.
func (s *Store) Get(id string) (*Record, bool) {
	s.mu.RLock()
	e, ok := s.entries[id]
	s.mu.RUnlock()
	if !ok {
		return nil, false
	}
	return e.rec.Clone(), true
}

// ByClientToken finds the on-demand instance a tenant created with token.
func (s *Store) ByClientToken(tenant, token string) (*Record, bool) {
	s.mu.RLock()
	id, ok := s.tokens[tokenKey(tenant, token)]
	s.mu.RUnlock()
	if !ok {
		return nil, false
	}
	return s.Get(id)
}

// List returns copies of the records match accepts (all when nil), sorted by id.
func (s *Store) List(match func(*Record) bool) []*Record {
	s.mu.RLock()
	out := make([]*Record, 0, len(s.entries))
	for _, e := range s.entries {
		if match == nil || match(e.rec) {
			out = append(out, e.rec)
		}
	}
	s.mu.RUnlock()
	for i, r := range out {
		out[i] = r.Clone()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Each calls fn with every record, in no order, under the store's read
// lock and without copying it: fn must neither modify nor keep the record
// and must not call the store. It is for counting over a large shard, where
// List's copies cost more than the count (10,000 records are about 10,000
// allocations per List).
func (s *Store) Each(fn func(*Record)) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, e := range s.entries {
		fn(e.rec)
	}
}

// Len returns the number of records.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.entries)
}

// Create writes a new record; it fails with ErrExists if the id is taken.
func (s *Store) Create(ctx context.Context, rec *Record) error {
	if err := layout.ValidateID("instance id", rec.ID); err != nil {
		return err
	}
	l := s.lock(rec.ID)
	l.Lock()
	defer l.Unlock()
	if _, ok := s.Get(rec.ID); ok {
		return fmt.Errorf("creating record %s: %w", rec.ID, ErrExists)
	}
	body, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encoding record %s: %w", rec.ID, err)
	}
	// A create whose reply was lost and that the SDK retried finds its own
	// object: CreateOnly counts identical content as success.
	etag, err := storage.CreateOnly(ctx, s.obj, s.keys.Instance(s.shard, rec.ID), body)
	if errors.Is(err, objstore.ErrPreconditionFailed) {
		return fmt.Errorf("creating record %s: %w", rec.ID, ErrExists)
	}
	if err != nil {
		return fmt.Errorf("creating record %s: %w", rec.ID, err)
	}
	s.set(rec.Clone(), etag)
	if err := s.mirrorPut(ctx, MirrorObject{Key: s.keys.Instance(s.shard, rec.ID), ETag: etag, Body: body}); err != nil {
		return fmt.Errorf("caching record %s: %w", rec.ID, err)
	}
	return nil
}

func (s *Store) set(rec *Record, etag string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setLocked(rec, etag)
}

func (s *Store) setLocked(rec *Record, etag string) {
	// A replaced record's token and group may differ (a stale cached copy).
	s.dropLocked(rec.ID)
	s.entries[rec.ID] = &entry{rec: rec, etag: etag}
	if rec.ClientToken != "" {
		s.tokens[tokenKey(rec.Tenant, rec.ClientToken)] = rec.ID
	}
	if rec.GroupID != "" {
		gk := tokenKey(rec.Tenant, rec.GroupID)
		ids := s.byGroup[gk]
		if ids == nil {
			ids = map[string]struct{}{}
			s.byGroup[gk] = ids
		}
		ids[rec.ID] = struct{}{}
	}
}

// ListGroup returns copies of the records of one group, sorted by id.
func (s *Store) ListGroup(tenant, group string) []*Record {
	s.mu.RLock()
	ids := s.byGroup[tokenKey(tenant, group)]
	out := make([]*Record, 0, len(ids))
	for id := range ids {
		out = append(out, s.entries[id].rec)
	}
	s.mu.RUnlock()
	for i, r := range out {
		out[i] = r.Clone()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (s *Store) current(id string) (*Record, string, bool) {
	s.mu.RLock()
	e, ok := s.entries[id]
	s.mu.RUnlock()
	if !ok {
		return nil, "", false
	}
	return e.rec.Clone(), e.etag, true
}

// Update applies fn to a copy of the record and writes the result with
// If-Match on the etag it was read with. When another writer changed the
// object in between, the record is re-read from storage and fn runs again
// (up to three attempts). fn returning ErrNoChange skips the write and
// returns the current record with a nil error.
func (s *Store) Update(ctx context.Context, id string, fn func(*Record) error) (*Record, error) {
	l := s.lock(id)
	l.Lock()
	defer l.Unlock()
	for attempt := 0; ; attempt++ {
		rec, etag, ok := s.current(id)
		if !ok {
			return nil, fmt.Errorf("updating %s: %w", id, ErrNotFound)
		}
		if err := fn(rec); err != nil {
			if errors.Is(err, ErrNoChange) {
				return rec, nil
			}
			return nil, err
		}
		body, err := json.Marshal(rec)
		if err != nil {
			return nil, fmt.Errorf("encoding record %s: %w", id, err)
		}
		// A retried write that committed finds its own content: success.
		newTag, err := storage.ReplaceIfMatch(ctx, s.obj, s.keys.Instance(s.shard, id), body, etag)
		if errors.Is(err, objstore.ErrPreconditionFailed) && attempt < 2 {
			if rerr := s.reload(ctx, id); rerr != nil {
				return nil, rerr
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("writing record %s: %w", id, err)
		}
		s.set(rec.Clone(), newTag)
		if err := s.mirrorPut(ctx, MirrorObject{Key: s.keys.Instance(s.shard, id), ETag: newTag, Body: body}); err != nil {
			return nil, fmt.Errorf("caching record %s: %w", id, err)
		}
		return rec, nil
	}
}

// Refresh reads one record from object storage (the source of truth, not the
// index, which may lag at the start of a leadership term), updates the index
// and returns a copy. A missing record returns ErrNotFound.
func (s *Store) Refresh(ctx context.Context, id string) (*Record, error) {
	if err := layout.ValidateID("instance id", id); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	// Serialised with Update, so an older read never replaces a newer write
	// in the index.
	l := s.lock(id)
	l.Lock()
	defer l.Unlock()
	if err := s.reload(ctx, id); err != nil {
		return nil, err
	}
	rec, ok := s.Get(id)
	if !ok {
		return nil, fmt.Errorf("reading %s: %w", id, ErrNotFound)
	}
	return rec, nil
}

func (s *Store) reload(ctx context.Context, id string) error {
	key := s.keys.Instance(s.shard, id)
	o, err := s.obj.Get(ctx, key)
	if errors.Is(err, objstore.ErrNotFound) {
		s.drop(id)
		if merr := s.mirrorDelete(ctx, key); merr != nil {
			return fmt.Errorf("uncaching record %s: %w", id, merr)
		}
		return fmt.Errorf("reloading %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("reloading %s: %w", id, err)
	}
	var r Record
	if err := json.Unmarshal(o.Body, &r); err != nil {
		return fmt.Errorf("reloading %s: %w", id, err)
	}
	s.set(&r, o.ETag)
	if err := s.mirrorPut(ctx, MirrorObject{Key: key, ETag: o.ETag, Body: o.Body}); err != nil {
		return fmt.Errorf("caching record %s: %w", id, err)
	}
	return nil
}

func (s *Store) drop(id string) { s.dropGet(id) }

// dropGet removes id from the index and returns the record it held (nil if none).
func (s *Store) dropGet(id string) *Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropLocked(id)
}

func (s *Store) dropLocked(id string) *Record {
	e, ok := s.entries[id]
	if !ok {
		return nil
	}
	if e.rec.ClientToken != "" {
		delete(s.tokens, tokenKey(e.rec.Tenant, e.rec.ClientToken))
	}
	if e.rec.GroupID != "" {
		gk := tokenKey(e.rec.Tenant, e.rec.GroupID)
		delete(s.byGroup[gk], id)
		if len(s.byGroup[gk]) == 0 {
			delete(s.byGroup, gk)
		}
	}
	delete(s.entries, id)
	return e.rec
}

// Delete removes the record from storage and the index.
func (s *Store) Delete(ctx context.Context, id string) error {
	l := s.lock(id)
	l.Lock()
	defer l.Unlock()
	if err := s.obj.Delete(ctx, s.keys.Instance(s.shard, id)); err != nil {
		return fmt.Errorf("deleting record %s: %w", id, err)
	}
	s.drop(id)
	if err := s.mirrorDelete(ctx, s.keys.Instance(s.shard, id)); err != nil {
		return fmt.Errorf("uncaching record %s: %w", id, err)
	}
	return nil
}
