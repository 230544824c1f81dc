// Package objstoretest is the contract every objstore.Store backend must
// pass. Backends call Run from their own tests.
package objstoretest

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/pkg/objstore"
)

// NewStore returns a fresh, empty store for one test case; it registers its
// own cleanup with t.
type NewStore func(t *testing.T) objstore.Store

func md5hex(b []byte) string {
	s := md5.Sum(b)
	return hex.EncodeToString(s[:])
}

// Option adjusts the contract for a backend.
type Option func(*options)

type options struct{ maxKey int }

// WithMaxKeyLength lowers the longest key the store must accept, for
// backends that add their own prefix to every key.
func WithMaxKeyLength(n int) Option { return func(o *options) { o.maxKey = n } }

// Run runs every contract case as a subtest.
func Run(t *testing.T, newStore NewStore, opts ...Option) {
	o := options{maxKey: objstore.MaxKeyLength}
	for _, fn := range opts {
		fn(&o)
	}
	cases := []struct {
		name string
		fn   func(t *testing.T, s objstore.Store)
	}{
		{"PutGetHead", testPutGetHead},
		{"ETagStableAndChanges", testETag},
		{"NotFound", testNotFound},
		{"CreateOnlyTwice", testCreateOnly},
		{"IfMatch", testIfMatch},
		{"DeleteMissingIsOK", testDelete},
		{"ListPrefixAndOrder", testList},
		{"NestedKeys", testNested},
		{"InvalidKeys", func(t *testing.T, s objstore.Store) { testInvalidKeys(t, s, o.maxKey) }},
		{"ConcurrentCreateOnly", testConcurrentCreate},
		{"Bodies", testBodies},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.fn(t, newStore(t)) })
	}
}

func testPutGetHead(t *testing.T, s objstore.Store) {
	ctx := context.Background()
	body := []byte("-----BEGIN CERTIFICATE-----\nabc\n")
	etag, err := s.Put(ctx, "cluster/ca.crt", body, objstore.PutOptions{})
	require.NoError(t, err)
	require.Equal(t, md5hex(body), etag)
	require.False(t, strings.Contains(etag, `"`), "ETag must be unquoted")

	obj, err := s.Get(ctx, "cluster/ca.crt")
	require.NoError(t, err)
	require.Equal(t, body, obj.Body)
	require.Equal(t, "cluster/ca.crt", obj.Key)
	require.Equal(t, etag, obj.ETag)
	require.Equal(t, int64(len(body)), obj.Size)
	require.False(t, obj.LastModified.IsZero())

	info, err := s.Head(ctx, "cluster/ca.crt")
	require.NoError(t, err)
	require.Equal(t, etag, info.ETag)
	require.Equal(t, int64(len(body)), info.Size)
	require.Equal(t, "cluster/ca.crt", info.Key)
}

func testETag(t *testing.T, s objstore.Store) {
	ctx := context.Background()
	e1, err := s.Put(ctx, "k", []byte("one"), objstore.PutOptions{})
	require.NoError(t, err)
	e1again, err := s.Put(ctx, "k", []byte("one"), objstore.PutOptions{})
	require.NoError(t, err)
	require.Equal(t, e1, e1again, "same content, same ETag")
	h, err := s.Head(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, e1, h.ETag)

	// Same size, different content: the ETag must change.
	e2, err := s.Put(ctx, "k", []byte("two"), objstore.PutOptions{})
	require.NoError(t, err)
	require.NotEqual(t, e1, e2)
	for range 3 {
		h, err = s.Head(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, e2, h.ETag)
	}
	obj, err := s.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, e2, obj.ETag)
	require.Equal(t, []byte("two"), obj.Body)
}

func testNotFound(t *testing.T, s objstore.Store) {
	ctx := context.Background()
	_, err := s.Get(ctx, "missing/key")
	require.ErrorIs(t, err, objstore.ErrNotFound)
	_, err = s.Head(ctx, "missing/key")
	require.ErrorIs(t, err, objstore.ErrNotFound)

	_, err = s.Put(ctx, "a/b", []byte("x"), objstore.PutOptions{})
	require.NoError(t, err)
	// A prefix of an existing key is not itself an object.
	_, err = s.Get(ctx, "a")
	require.ErrorIs(t, err, objstore.ErrNotFound)
	_, err = s.Head(ctx, "a")
	require.ErrorIs(t, err, objstore.ErrNotFound)
}

func testCreateOnly(t *testing.T, s objstore.Store) {
	ctx := context.Background()
	etag, err := s.Put(ctx, "once", []byte("first"), objstore.PutOptions{IfNoneMatch: true})
	require.NoError(t, err)
	_, err = s.Put(ctx, "once", []byte("second"), objstore.PutOptions{IfNoneMatch: true})
	require.ErrorIs(t, err, objstore.ErrPreconditionFailed)
	obj, err := s.Get(ctx, "once")
	require.NoError(t, err)
	require.Equal(t, []byte("first"), obj.Body, "a failed create-only write must not change the object")
	require.Equal(t, etag, obj.ETag)

	// After a delete, create-only succeeds again.
	require.NoError(t, s.Delete(ctx, "once"))
	_, err = s.Put(ctx, "once", []byte("third"), objstore.PutOptions{IfNoneMatch: true})
	require.NoError(t, err)
}

func testIfMatch(t *testing.T, s objstore.Store) {
	ctx := context.Background()
	e1, err := s.Put(ctx, "lease", []byte("v1"), objstore.PutOptions{})
	require.NoError(t, err)
	e2, err := s.Put(ctx, "lease", []byte("v2"), objstore.PutOptions{IfMatch: e1})
	require.NoError(t, err, "If-Match with the current ETag must succeed")
	require.NotEqual(t, e1, e2)

	_, err = s.Put(ctx, "lease", []byte("v3"), objstore.PutOptions{IfMatch: e1})
	require.ErrorIs(t, err, objstore.ErrPreconditionFailed, "stale ETag")
	obj, err := s.Get(ctx, "lease")
	require.NoError(t, err)
	require.Equal(t, []byte("v2"), obj.Body)

	_, err = s.Put(ctx, "no-such-lease", []byte("v1"), objstore.PutOptions{IfMatch: e1})
	require.ErrorIs(t, err, objstore.ErrPreconditionFailed, "If-Match on a missing key")
	_, err = s.Head(ctx, "no-such-lease")
	require.ErrorIs(t, err, objstore.ErrNotFound)
}

func testDelete(t *testing.T, s objstore.Store) {
	ctx := context.Background()
	require.NoError(t, s.Delete(ctx, "never/existed"))
	_, err := s.Put(ctx, "d/x", []byte("x"), objstore.PutOptions{})
	require.NoError(t, err)
	require.NoError(t, s.Delete(ctx, "d/x"))
	_, err = s.Get(ctx, "d/x")
	require.ErrorIs(t, err, objstore.ErrNotFound)
	require.NoError(t, s.Delete(ctx, "d/x"))
	list, err := s.List(ctx, "d/")
	require.NoError(t, err)
	require.Empty(t, list)
}

func keysOf(list []objstore.ObjectInfo) []string {
	out := make([]string, 0, len(list))
	for _, o := range list {
		out = append(out, o.Key)
	}
	return out
}

func testList(t *testing.T, s objstore.Store) {
	ctx := context.Background()
	// Inserted out of order; "a-c" sorts before "a/b" ('-' < '/').
	keys := []string{"shard/dev-2/x", "a/b", "shard/dev-1/instances/i2.json", "a-c", "shard/dev-1/instances/i1.json", "shard/dev-10/y", "z"}
	bodies := map[string][]byte{}
	for i, k := range keys {
		b := []byte(fmt.Sprintf("body-%d-%s", i, k))
		bodies[k] = b
		_, err := s.Put(ctx, k, b, objstore.PutOptions{})
		require.NoError(t, err)
	}
	tests := []struct {
		prefix string
		want   []string
	}{
		{"", []string{"a-c", "a/b", "shard/dev-1/instances/i1.json", "shard/dev-1/instances/i2.json", "shard/dev-10/y", "shard/dev-2/x", "z"}},
		{"shard/dev-1/", []string{"shard/dev-1/instances/i1.json", "shard/dev-1/instances/i2.json"}},
		{"shard/dev-1", []string{"shard/dev-1/instances/i1.json", "shard/dev-1/instances/i2.json", "shard/dev-10/y"}},
		{"shard/dev-1/instances/i", []string{"shard/dev-1/instances/i1.json", "shard/dev-1/instances/i2.json"}},
		{"a", []string{"a-c", "a/b"}},
		{"nothing/", []string{}},
	}
	for _, tc := range tests {
		t.Run("prefix="+tc.prefix, func(t *testing.T) {
			list, err := s.List(ctx, tc.prefix)
			require.NoError(t, err)
			require.Equal(t, tc.want, keysOf(list))
			for _, o := range list {
				require.Equal(t, md5hex(bodies[o.Key]), o.ETag, o.Key)
				require.Equal(t, int64(len(bodies[o.Key])), o.Size, o.Key)
			}
		})
	}
}

func testNested(t *testing.T, s objstore.Store) {
	ctx := context.Background()
	deep := "a/b/c/d/e/f/g.json"
	_, err := s.Put(ctx, deep, []byte("{}"), objstore.PutOptions{})
	require.NoError(t, err)
	_, err = s.Put(ctx, "a/b/sibling", []byte("s"), objstore.PutOptions{})
	require.NoError(t, err)
	obj, err := s.Get(ctx, deep)
	require.NoError(t, err)
	require.Equal(t, []byte("{}"), obj.Body)
	require.NoError(t, s.Delete(ctx, deep))
	list, err := s.List(ctx, "a/")
	require.NoError(t, err)
	require.Equal(t, []string{"a/b/sibling"}, keysOf(list))
}

func testInvalidKeys(t *testing.T, s objstore.Store, maxKey int) {
	ctx := context.Background()
	bad := []string{"", "/abs", "a//b", "../x", "a/../../x", "a/..", "nul\x00byte", strings.Repeat("k", objstore.MaxKeyLength+1)}
	for _, k := range bad {
		t.Run(fmt.Sprintf("%q", k), func(t *testing.T) {
			_, err := s.Put(ctx, k, []byte("x"), objstore.PutOptions{})
			require.ErrorIs(t, err, objstore.ErrInvalidKey)
			_, err = s.Get(ctx, k)
			require.ErrorIs(t, err, objstore.ErrInvalidKey)
			_, err = s.Head(ctx, k)
			require.ErrorIs(t, err, objstore.ErrInvalidKey)
			require.ErrorIs(t, s.Delete(ctx, k), objstore.ErrInvalidKey)
		})
	}
	list, err := s.List(ctx, "")
	require.NoError(t, err)
	require.Empty(t, list, "rejected writes must store nothing")
	_, err = s.List(ctx, "../")
	require.ErrorIs(t, err, objstore.ErrInvalidKey)
	// The longest valid key works.
	// The longest valid key works. (A file system may cap one path segment
	// at 255 bytes, so it is made of short segments.)
	long := strings.Repeat("k/", maxKey/2-1) + "kk"
	if maxKey%2 == 1 {
		long += "k"
	}
	require.Len(t, long, maxKey)
	_, err = s.Put(ctx, long, []byte("x"), objstore.PutOptions{})
	require.NoError(t, err)
	obj, err := s.Get(ctx, long)
	require.NoError(t, err)
	require.Equal(t, []byte("x"), obj.Body)
}

func testConcurrentCreate(t *testing.T, s objstore.Store) {
	ctx := context.Background()
	const n = 20
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.Put(ctx, "cluster/leader.json", []byte(fmt.Sprintf(`{"holder":%d}`, i)), objstore.PutOptions{IfNoneMatch: true})
		}()
	}
	wg.Wait()
	winners := 0
	winner := -1
	for i, err := range errs {
		if err == nil {
			winners++
			winner = i
			continue
		}
		require.ErrorIs(t, err, objstore.ErrPreconditionFailed)
	}
	require.Equal(t, 1, winners, "exactly one create-only write may succeed")
	obj, err := s.Get(ctx, "cluster/leader.json")
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf(`{"holder":%d}`, winner), string(obj.Body))
}

func testBodies(t *testing.T, s objstore.Store) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	binary := make([]byte, 4096)
	for i := range binary {
		binary[i] = byte(rng.IntN(256))
	}
	binary[0], binary[1] = 0, 0xff
	large := make([]byte, 6<<20)
	for i := range large {
		large[i] = byte(rng.IntN(256))
	}
	tests := []struct {
		name string
		body []byte
	}{
		{"empty", []byte{}},
		{"binary", binary},
		{"large-6MiB", large},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := "bodies/" + tc.name
			etag, err := s.Put(ctx, key, tc.body, objstore.PutOptions{})
			require.NoError(t, err)
			require.Equal(t, md5hex(tc.body), etag)
			obj, err := s.Get(ctx, key)
			require.NoError(t, err)
			require.True(t, bytes.Equal(tc.body, obj.Body), "body differs")
			require.Equal(t, int64(len(tc.body)), obj.Size)
			h, err := s.Head(ctx, key)
			require.NoError(t, err)
			require.Equal(t, etag, h.ETag)
			require.Equal(t, int64(len(tc.body)), h.Size)
		})
	}
}
