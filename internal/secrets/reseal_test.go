package secrets_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/s3store"
)

// failingPuts fails every Put after the first n.
type failingPuts struct {
	objstore.Store
	left atomic.Int64
}

func (f *failingPuts) Put(ctx context.Context, key string, body []byte, o objstore.PutOptions) (string, error) {
	if f.left.Add(-1) < 0 {
		return "", errors.New("injected: storage went away")
	}
	return f.Store.Put(ctx, key, body, o)
}

func key(t *testing.T, b byte) *secrets.Key {
	t.Helper()
	raw := make([]byte, secrets.KeySize)
	for i := range raw {
		raw[i] = b + byte(i)
	}
	k, err := secrets.ParseKey(raw)
	require.NoError(t, err)
	return k
}

// Every envelope sealed with the old key is re-sealed with the new one; a run
// interrupted midway loses nothing and a second run finishes it; afterwards
// the new key alone opens everything, and other objects are not touched.
func TestResealAllAgainstDevS3(t *testing.T) {
	ctx := context.Background()
	s3 := devs3test.Start(t, "")
	store, err := s3store.NewWithClient(devs3test.Client(s3.URL), devs3test.Bucket, "")
	require.NoError(t, err)
	oldK, newK := key(t, 1), key(t, 100)
	oldRing, err := secrets.NewKeyring(oldK)
	require.NoError(t, err)
	bothRing, err := secrets.NewKeyring(newK, oldK)
	require.NoError(t, err)
	newRing, err := secrets.NewKeyring(newK)
	require.NoError(t, err)

	const n = 7
	want := map[string]string{}
	for i := range n {
		k := fmt.Sprintf("cluster/secret/s%d.key", i)
		want[k] = fmt.Sprintf("secret material %d", i)
		ring := oldRing
		if i == 3 {
			ring = bothRing // one already under the new key
		}
		require.NoError(t, (&secrets.Store{Objects: store, Ring: ring}).Put(ctx, k, []byte(want[k]), objstore.PutOptions{}))
	}
	_, err = store.Put(ctx, "cluster/ca.crt", []byte("plain"), objstore.PutOptions{})
	require.NoError(t, err)

	// Interrupted after three writes.
	flaky := &failingPuts{Store: store}
	flaky.left.Store(3)
	rep, err := (&secrets.Store{Objects: flaky, Ring: bothRing}).ResealAll(ctx, "cluster/secret/")
	require.ErrorContains(t, err, "injected")
	require.Equal(t, 3, rep.Resealed)
	// Nothing lost: every envelope opens with old+new.
	for k, v := range want {
		got, err := (&secrets.Store{Objects: store, Ring: bothRing}).Get(ctx, k)
		require.NoError(t, err, k)
		require.Equal(t, v, string(got))
	}

	rep, err = (&secrets.Store{Objects: store, Ring: bothRing}).ResealAll(ctx, "cluster/secret/")
	require.NoError(t, err)
	require.Equal(t, secrets.ResealReport{Total: n, Resealed: n - 4, AlreadyCurrent: 4, Keys: rep.Keys}, rep)
	require.Len(t, rep.Keys, n-4)
	for k, v := range want {
		got, err := (&secrets.Store{Objects: store, Ring: newRing}).Get(ctx, k)
		require.NoError(t, err, "readable with the new key alone: %s", k)
		require.Equal(t, v, string(got))
		obj, err := store.Get(ctx, k)
		require.NoError(t, err)
		kid, err := secrets.EnvelopeKeyID(obj.Body)
		require.NoError(t, err)
		require.Equal(t, newK.ID, kid)
	}
	plain, err := store.Get(ctx, "cluster/ca.crt")
	require.NoError(t, err)
	require.Equal(t, "plain", string(plain.Body))

	rep, err = (&secrets.Store{Objects: store, Ring: bothRing}).ResealAll(ctx, "cluster/secret/")
	require.NoError(t, err)
	require.Equal(t, secrets.ResealReport{Total: n, AlreadyCurrent: n}, rep, "idempotent")
}

// An envelope under a key the ring does not hold stops the run and stays as
// it was.
func TestResealUnknownKeyStops(t *testing.T) {
	ctx := context.Background()
	s3 := devs3test.Start(t, "")
	store, err := s3store.NewWithClient(devs3test.Client(s3.URL), devs3test.Bucket, "")
	require.NoError(t, err)
	stranger, err := secrets.NewKeyring(key(t, 50))
	require.NoError(t, err)
	require.NoError(t, (&secrets.Store{Objects: store, Ring: stranger}).Put(ctx, "cluster/secret/x", []byte("v"), objstore.PutOptions{}))
	before, err := store.Get(ctx, "cluster/secret/x")
	require.NoError(t, err)
	ring, err := secrets.NewKeyring(key(t, 100), key(t, 1))
	require.NoError(t, err)
	_, err = (&secrets.Store{Objects: store, Ring: ring}).ResealAll(ctx, "cluster/secret/")
	require.ErrorIs(t, err, secrets.ErrUnknownKey)
	after, err := store.Get(ctx, "cluster/secret/x")
	require.NoError(t, err)
	require.Equal(t, before.Body, after.Body)
}
