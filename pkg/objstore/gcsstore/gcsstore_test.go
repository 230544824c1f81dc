package gcsstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"cloud.google.com/go/storage"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/testing/gcsemu"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/gcsstore"
	"github.com/nstance-dev/nstance/pkg/objstore/objstoretest"
)

// The contract runs against fake-gcs-server, a GCS emulator process on
// loopback: one process per test, one fresh bucket per case.
func TestContract(t *testing.T) {
	emu := gcsemu.Start(t)
	objstoretest.Run(t, func(t *testing.T) objstore.Store {
		s, err := gcsstore.NewWithClient(emu.Client(t), emu.NewBucket(t), "")
		require.NoError(t, err)
		return s
	})
}

// With a key prefix, the contract still holds and objects land under it.
func TestContractWithPrefix(t *testing.T) {
	emu := gcsemu.Start(t)
	objstoretest.Run(t, func(t *testing.T) objstore.Store {
		s, err := gcsstore.NewWithClient(emu.Client(t), emu.NewBucket(t), "tenant/a")
		require.NoError(t, err)
		return s
	}, objstoretest.WithMaxKeyLength(objstore.MaxKeyLength-len("tenant/a/")))
}

// New reads STORAGE_EMULATOR_HOST like the client library; the prefix puts
// objects under it in the bucket, and every write carries a generation
// precondition the emulator enforces.
func TestNewFromEnvironment(t *testing.T) {
	ctx := context.Background()
	emu := gcsemu.Start(t)
	bucket := emu.NewBucket(t)
	t.Setenv("STORAGE_EMULATOR_HOST", emu.Addr)
	s, err := gcsstore.New(ctx, bucket, "pfx")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })

	etag, err := s.Put(ctx, "cluster/ca.crt", []byte("PEM"), objstore.PutOptions{IfNoneMatch: true})
	require.NoError(t, err)
	raw := emu.Client(t).Bucket(bucket).Object("pfx/cluster/ca.crt")
	a, err := raw.Attrs(ctx)
	require.NoError(t, err)
	require.Equal(t, etag, hexOf(a.MD5))

	// The emulator enforces ifGenerationMatch (what IfMatch is built on): a
	// write on the generation read succeeds once, the next on the same
	// generation fails, and the store's ETag is stale after the first.
	w := raw.If(storage.Conditions{GenerationMatch: a.Generation}).NewWriter(ctx)
	_, err = w.Write([]byte("PEM2"))
	require.NoError(t, err)
	require.NoError(t, w.Close())
	w = raw.If(storage.Conditions{GenerationMatch: a.Generation}).NewWriter(ctx)
	_, err = w.Write([]byte("PEM3"))
	require.NoError(t, err)
	require.Error(t, w.Close(), "the emulator must enforce ifGenerationMatch")

	_, err = s.Put(ctx, "cluster/ca.crt", []byte("x"), objstore.PutOptions{IfMatch: etag})
	require.ErrorIs(t, err, objstore.ErrPreconditionFailed)
	list, err := s.List(ctx, "")
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "cluster/ca.crt", list[0].Key)
}

// Replaces racing on the same ETag: exactly one wins, the others fail with
// ErrPreconditionFailed (the generation read before the write is the
// condition, so a winner between one writer's read and write is noticed).
func TestConcurrentReplace(t *testing.T) {
	ctx := context.Background()
	emu := gcsemu.Start(t)
	s, err := gcsstore.NewWithClient(emu.Client(t), emu.NewBucket(t), "")
	require.NoError(t, err)
	etag, err := s.Put(ctx, "cluster/leader.json", []byte(`{"holder":-1}`), objstore.PutOptions{})
	require.NoError(t, err)
	const n = 20
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, errs[i] = s.Put(ctx, "cluster/leader.json", []byte(fmt.Sprintf(`{"holder":%d}`, i)), objstore.PutOptions{IfMatch: etag})
		})
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		if err == nil {
			require.Equal(t, -1, winner, "two replaces of one ETag succeeded")
			winner = i
			continue
		}
		require.ErrorIs(t, err, objstore.ErrPreconditionFailed)
	}
	require.NotEqual(t, -1, winner)
	obj, err := s.Get(ctx, "cluster/leader.json")
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf(`{"holder":%d}`, winner), string(obj.Body))
}

func TestNewRejectsBadInput(t *testing.T) {
	t.Setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:1")
	ctx := context.Background()
	_, err := gcsstore.New(ctx, "", "")
	require.ErrorContains(t, err, "bucket")
	_, err = gcsstore.New(ctx, "b", "../up")
	require.ErrorIs(t, err, objstore.ErrInvalidKey)
	s, err := gcsstore.New(ctx, "b", "")
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	for _, k := range []string{"a\nb", "a\rb"} {
		_, err = s.Put(ctx, k, []byte("x"), objstore.PutOptions{})
		require.ErrorIs(t, err, objstore.ErrInvalidKey)
	}
}

// A missing bucket is a configuration error, not a missing object.
func TestMissingBucketIsNotNotFound(t *testing.T) {
	ctx := context.Background()
	emu := gcsemu.Start(t)
	s, err := gcsstore.NewWithClient(emu.Client(t), "no-such-bucket", "")
	require.NoError(t, err)
	_, err = s.List(ctx, "")
	require.Error(t, err)
	require.NotErrorIs(t, err, objstore.ErrNotFound)
	require.True(t, strings.Contains(err.Error(), "no-such-bucket"), err.Error())
}

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}
