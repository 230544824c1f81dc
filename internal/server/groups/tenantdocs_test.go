package groups_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

// touchStore records the keys read and written.
type touchStore struct {
	objstore.Store
	mu           sync.Mutex
	gets, writes []string
}

func (s *touchStore) Get(ctx context.Context, key string) (*objstore.Object, error) {
	s.mu.Lock()
	s.gets = append(s.gets, key)
	s.mu.Unlock()
	return s.Store.Get(ctx, key)
}

func (s *touchStore) Put(ctx context.Context, key string, body []byte, o objstore.PutOptions) (string, error) {
	s.mu.Lock()
	s.writes = append(s.writes, key)
	s.mu.Unlock()
	return s.Store.Put(ctx, key, body, o)
}

func (s *touchStore) reset() (gets, writes []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	gets, writes = s.gets, s.writes
	s.gets, s.writes = nil, nil
	return gets, writes
}

// TestTenantWritesTouchOnlyTheirDocument: every tenant's groups are one
// document; a write of tenant b reads nothing and writes only b's, however
// large a's is, and a's document is unchanged.
func TestTenantWritesTouchOnlyTheirDocument(t *testing.T) {
	ctx := context.Background()
	keys := layout.New("")
	store := &touchStore{Store: memstore.New()}
	r := groups.NewRegistry(store, keys, "s1")
	_, err := r.Load(ctx)
	require.NoError(t, err)
	big := groups.Spec{Template: "worker", Vars: map[string]string{"blob": strings.Repeat("a", 64<<10)}}
	_, _, err = r.Upsert(ctx, groups.Key{Tenant: "a", ID: "big"}, big, "")
	require.NoError(t, err)
	aDoc, err := store.Store.Get(ctx, keys.TenantGroups("s1", "a"))
	require.NoError(t, err)
	store.reset()

	_, _, err = r.Upsert(ctx, groups.Key{Tenant: "b", ID: "web"}, groups.Spec{Template: "worker", Size: 1}, "")
	require.NoError(t, err)
	_, err = r.Delete(ctx, groups.Key{Tenant: "b", ID: "web"}, "")
	require.NoError(t, err)
	gets, writes := store.reset()
	require.Empty(t, gets, "writes start from memory")
	require.Equal(t, []string{keys.TenantGroups("s1", "b"), keys.TenantGroups("s1", "b")}, writes)
	again, err := store.Store.Get(ctx, keys.TenantGroups("s1", "a"))
	require.NoError(t, err)
	require.Equal(t, aDoc.ETag, again.ETag)
	_, err = store.Store.Get(ctx, keys.Groups("s1"))
	require.ErrorIs(t, err, objstore.ErrNotFound, "the shared document is never written")

	// Another server reads both tenants back; a Load with nothing changed
	// reads only the shared document (the listing gives the etags).
	r2 := groups.NewRegistry(store, keys, "s1")
	_, err = r2.Load(ctx)
	require.NoError(t, err)
	g, ok := r2.Get(groups.Key{Tenant: "a", ID: "big"})
	require.True(t, ok)
	require.Len(t, g.Spec.Vars["blob"], 64<<10)
	require.Empty(t, r2.List("b"))
	store.reset()
	changed, err := r2.Load(ctx)
	require.NoError(t, err)
	require.Empty(t, changed)
	gets, _ = store.reset()
	require.Equal(t, []string{keys.Groups("s1")}, gets)
}

// TestSharedDocumentStillRead: groups in the shared document (written
// before tenants had their own) are served; a tenant's first write moves
// its groups into its own document, which from then on replaces its part
// of the shared one; other tenants keep theirs.
func TestSharedDocumentStillRead(t *testing.T) {
	ctx := context.Background()
	keys := layout.New("")
	store := memstore.New()
	shared := `{"version": 1, "tenants": {
	  "t": {"old": {"spec": {"template": "worker", "size": 1}, "etag": "d-1"}},
	  "u": {"keep": {"spec": {"template": "worker", "size": 2}, "etag": "d-2"}}}}`
	_, err := store.Put(ctx, keys.Groups("s1"), []byte(shared), objstore.PutOptions{})
	require.NoError(t, err)
	r := groups.NewRegistry(store, keys, "s1")
	_, err = r.Load(ctx)
	require.NoError(t, err)
	require.Len(t, r.List(""), 2)

	_, _, err = r.Upsert(ctx, groups.Key{Tenant: "t", ID: "new"}, groups.Spec{Template: "worker", Size: 3}, "")
	require.NoError(t, err)
	_, err = r.Delete(ctx, groups.Key{Tenant: "t", ID: "old"}, "d-1")
	require.NoError(t, err)

	r2 := groups.NewRegistry(store, keys, "s1")
	_, err = r2.Load(ctx)
	require.NoError(t, err)
	var ids []string
	for _, g := range r2.List("") {
		ids = append(ids, g.Key().String())
	}
	require.Equal(t, []string{"t/new", "u/keep"}, ids, "t/old deleted although the shared document still has it")
	o, err := store.Get(ctx, keys.Groups("s1"))
	require.NoError(t, err)
	require.Equal(t, shared, string(o.Body), "the shared document is left as it was")
	// u's first write moves its group too.
	_, _, err = r2.Upsert(ctx, groups.Key{Tenant: "u", ID: "more"}, groups.Spec{Template: "worker"}, "")
	require.NoError(t, err)
	require.Len(t, r2.List("u"), 2)
}
