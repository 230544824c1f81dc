package storage

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/testing/gcsemu"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

func TestRetry(t *testing.T) {
	b := Backoff{Initial: time.Millisecond, Max: 4 * time.Millisecond}
	calls := 0
	err := Retry(context.Background(), logr.Discard(), "x", b, func(context.Context) error {
		calls++
		if calls < 4 {
			return errors.New("transient")
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 4, calls)

	calls = 0
	boom := errors.New("bad config")
	err = Retry(context.Background(), logr.Discard(), "x", b, func(context.Context) error { calls++; return Permanent{boom} })
	require.ErrorIs(t, err, boom)
	require.Equal(t, 1, calls)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err = Retry(ctx, logr.Discard(), "load", b, func(context.Context) error { return errors.New("down") })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "down")
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	for name, o := range map[string]Options{
		"kind":          {Kind: "azure"},
		"no bucket":     {Kind: "s3"},
		"no gcs bucket": {Kind: "gcs"},
		"no dir":        {Kind: "file"},
		"prefix":        {Kind: "file", Dir: t.TempDir(), Prefix: "a/../b"},
	} {
		_, _, err := Open(ctx, o)
		require.Error(t, err, name)
	}
	s, keys, err := Open(ctx, Options{Kind: "file", Dir: t.TempDir(), Prefix: "/p/"})
	require.NoError(t, err)
	require.NotNil(t, s)
	require.Equal(t, "p/cluster/ca.crt", keys.CACert())
}

// Kind gcs opens a GCS bucket (here fake-gcs-server through
// STORAGE_EMULATOR_HOST, as the client library reads it) that passes the
// start-up probe.
func TestOpenGCS(t *testing.T) {
	ctx := context.Background()
	emu := gcsemu.Start(t)
	bucket := emu.NewBucket(t)
	t.Setenv("STORAGE_EMULATOR_HOST", emu.Addr)
	s, keys, err := Open(ctx, Options{Kind: "gcs", Bucket: bucket, Prefix: "p"})
	require.NoError(t, err)
	require.Equal(t, "p/cluster/ca.crt", keys.CACert())
	require.NoError(t, ProbeConditionalWrites(ctx, s, keys.Probe("s1", "a", "1")))
	_, err = s.Put(ctx, keys.CACert(), []byte("PEM"), objstore.PutOptions{IfNoneMatch: true})
	require.NoError(t, err)
	a, err := emu.Client(t).Bucket(bucket).Object("p/cluster/ca.crt").Attrs(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), a.Size)
}

// TestCreateOnlySurvivesARetriedCreate: a 412 caused by the create's own
// earlier attempt (same bytes stored) is success; anything else stays a
// conflict.
func TestCreateOnlySurvivesARetriedCreate(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	etag, err := CreateOnly(ctx, s, "a/b", []byte("one"))
	require.NoError(t, err)
	// The retry of a committed create whose reply was lost.
	again, err := CreateOnly(ctx, s, "a/b", []byte("one"))
	require.NoError(t, err)
	require.Equal(t, etag, again)
	// A different writer's content is a real conflict, and stays stored.
	_, err = CreateOnly(ctx, s, "a/b", []byte("two"))
	require.ErrorIs(t, err, objstore.ErrPreconditionFailed)
	obj, err := s.Get(ctx, "a/b")
	require.NoError(t, err)
	require.Equal(t, "one", string(obj.Body))
	// Other errors pass through.
	_, err = CreateOnly(ctx, s, "../x", []byte("one"))
	require.ErrorIs(t, err, objstore.ErrInvalidKey)
}

// TestReplaceIfMatchSurvivesARetriedReplace: the retry of a committed
// replace finds its own content under a new ETag; that is success, while a
// different content is a conflict.
func TestReplaceIfMatchSurvivesARetriedReplace(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	v1, err := s.Put(ctx, "k", []byte("v1"), objstore.PutOptions{})
	require.NoError(t, err)
	v2, err := ReplaceIfMatch(ctx, s, "k", []byte("v2"), v1)
	require.NoError(t, err)
	// The SDK retries the same request (same If-Match) after a lost reply.
	again, err := ReplaceIfMatch(ctx, s, "k", []byte("v2"), v1)
	require.NoError(t, err)
	require.Equal(t, v2, again)
	_, err = ReplaceIfMatch(ctx, s, "k", []byte("v3"), v1)
	require.ErrorIs(t, err, objstore.ErrPreconditionFailed)
	_, err = ReplaceIfMatch(ctx, s, "missing", []byte("v2"), v1)
	require.ErrorIs(t, err, objstore.ErrPreconditionFailed)
	_, err = ReplaceIfMatch(ctx, s, "k", []byte("v2"), "")
	require.Error(t, err)
}
