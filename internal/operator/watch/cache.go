package watch

import (
	"sync"

	"google.golang.org/protobuf/proto"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Cache holds the latest group status each shard reported, fed by the
// WatchGroups streams and by UpsertGroup responses. Reconcilers read it
// instead of calling the server.
type Cache struct {
	mu     sync.RWMutex
	groups map[string]map[string]*nstancev1.GroupStatus
	synced map[string]bool
}

// NewCache returns an empty cache.
func NewCache() *Cache {
	return &Cache{groups: map[string]map[string]*nstancev1.GroupStatus{}, synced: map[string]bool{}}
}

// Get returns a copy of the cached status of group on shard.
func (c *Cache) Get(shard, group string) (*nstancev1.GroupStatus, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	g, ok := c.groups[shard][group]
	if !ok {
		return nil, false
	}
	return proto.CloneOf(g), true
}

// Synced reports whether the shard's full group list was loaded since the
// last (re)connect.
func (c *Cache) Synced(shard string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.synced[shard]
}

// Put stores a status from the watch stream unless the cache already holds
// a newer one. Stream events arrive in order, so an equal timestamp wins.
func (c *Cache) Put(shard string, g *nstancev1.GroupStatus) { c.put(shard, g, true) }

// PutResponse stores a status returned by an RPC. A stream event with the
// same timestamp may already carry later counts, so it only replaces
// strictly older entries.
func (c *Cache) PutResponse(shard string, g *nstancev1.GroupStatus) { c.put(shard, g, false) }

func (c *Cache) put(shard string, g *nstancev1.GroupStatus, equalWins bool) {
	id := g.GetSpec().GetGroupId()
	if id == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.groups[shard]
	if m == nil {
		m = map[string]*nstancev1.GroupStatus{}
		c.groups[shard] = m
	}
	if cur, ok := m[id]; ok {
		curT, newT := cur.GetUpdatedAt().AsTime(), g.GetUpdatedAt().AsTime()
		if curT.After(newT) || (!equalWins && curT.Equal(newT)) {
			return
		}
	}
	m[id] = proto.CloneOf(g)
}

// Delete forgets a group on a shard.
func (c *Cache) Delete(shard, group string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.groups[shard], group)
}

// Replace sets the shard's whole group list (a full resync) and returns the
// IDs that disappeared.
func (c *Cache) Replace(shard string, groups []*nstancev1.GroupStatus) (gone []string) {
	m := make(map[string]*nstancev1.GroupStatus, len(groups))
	for _, g := range groups {
		if id := g.GetSpec().GetGroupId(); id != "" {
			m[id] = proto.CloneOf(g)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.groups[shard] {
		if _, ok := m[id]; !ok {
			gone = append(gone, id)
		}
	}
	c.groups[shard] = m
	c.synced[shard] = true
	return gone
}

// Unsync marks a shard's list as stale (its stream dropped).
func (c *Cache) Unsync(shard string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.synced[shard] = false
}

// List returns copies of every cached group of a shard.
func (c *Cache) List(shard string) []*nstancev1.GroupStatus {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]*nstancev1.GroupStatus, 0, len(c.groups[shard]))
	for _, g := range c.groups[shard] {
		out = append(out, proto.CloneOf(g))
	}
	return out
}
