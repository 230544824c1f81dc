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

// Mirror receives every change so a local cache (SQLite) can follow the
// store. Calls happen after the object-storage write succeeded; keys are
// full object keys.
type Mirror interface {
	// Reset replaces the whole mirrored set (after Load).
	Reset(ctx context.Context, objs []MirrorObject) error
	Put(ctx context.Context, obj MirrorObject) error
	Delete(ctx context.Context, key string) error
}

type entry struct {
	rec  *Record
	etag string
	body []byte // only set while loading
}

// Store is the record store of one shard. Safe for concurrent use; updates to
// one instance are serialised.
type Store struct {
	obj    objstore.Store
	keys   layout.Keys
	shard  string
	mirror Mirror

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

// Load replaces the index with every record in object storage.
func (s *Store) Load(ctx context.Context) error {
	list, err := s.obj.List(ctx, s.keys.InstancePrefix(s.shard))
	if err != nil {
		return fmt.Errorf("listing instance records: %w", err)
	}
	loaded := make([]*entry, len(list))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i, info := range list {
		g.Go(func() error {
			o, err := s.obj.Get(gctx, info.Key)
			if errors.Is(err, objstore.ErrNotFound) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("reading %s: %w", info.Key, err)
			}
			var r Record
			if err := json.Unmarshal(o.Body, &r); err != nil || r.ID == "" || !strings.HasSuffix(info.Key, "/"+r.ID+".json") {
				// A torn or foreign object is skipped, never fatal.
				return nil
			}
			loaded[i] = &entry{rec: &r, etag: o.ETag, body: o.Body}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	var objs []MirrorObject
	s.mu.Lock()
	s.entries, s.tokens, s.byGroup = map[string]*entry{}, map[string]string{}, map[string]map[string]struct{}{}
	for _, e := range loaded {
		if e == nil {
			continue
		}
		s.setLocked(e.rec, e.etag)
		objs = append(objs, MirrorObject{Key: s.keys.Instance(s.shard, e.rec.ID), ETag: e.etag, Body: e.body})
	}
	s.mu.Unlock()
	if s.mirror != nil {
		if err := s.mirror.Reset(ctx, objs); err != nil {
			return fmt.Errorf("resetting cache: %w", err)
		}
	}
	return nil
}

// Get returns a copy of one record.
func (s *Store) Get(id string) (*Record, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.entries[id]
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
			out = append(out, e.rec.Clone())
		}
	}
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
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
	if s.mirror != nil {
		if err := s.mirror.Put(ctx, MirrorObject{Key: s.keys.Instance(s.shard, rec.ID), ETag: etag, Body: body}); err != nil {
			return fmt.Errorf("caching record %s: %w", rec.ID, err)
		}
	}
	return nil
}

func (s *Store) set(rec *Record, etag string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setLocked(rec, etag)
}

func (s *Store) setLocked(rec *Record, etag string) {
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
		out = append(out, s.entries[id].rec.Clone())
	}
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (s *Store) current(id string) (*Record, string, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.entries[id]
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
		if s.mirror != nil {
			if err := s.mirror.Put(ctx, MirrorObject{Key: s.keys.Instance(s.shard, id), ETag: newTag, Body: body}); err != nil {
				return nil, fmt.Errorf("caching record %s: %w", id, err)
			}
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
	o, err := s.obj.Get(ctx, s.keys.Instance(s.shard, id))
	if errors.Is(err, objstore.ErrNotFound) {
		s.drop(id)
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
	return nil
}

func (s *Store) drop(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.entries[id]; ok {
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
	}
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
	if s.mirror != nil {
		if err := s.mirror.Delete(ctx, s.keys.Instance(s.shard, id)); err != nil {
			return fmt.Errorf("uncaching record %s: %w", id, err)
		}
	}
	return nil
}
