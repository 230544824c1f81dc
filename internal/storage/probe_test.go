package storage

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/testing/gcsemu"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/dirstore"
	"github.com/nstance-dev/nstance/pkg/objstore/gcsstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	"github.com/nstance-dev/nstance/pkg/objstore/s3store"
)

// careless drops the conditions of every write, like a store (or a proxy
// in front of one) that ignores If-None-Match and If-Match.
type careless struct{ objstore.Store }

func (c careless) Put(ctx context.Context, key string, body []byte, _ objstore.PutOptions) (string, error) {
	return c.Store.Put(ctx, key, body, objstore.PutOptions{})
}

// ignoresIfMatch honours create-only writes but not If-Match.
type ignoresIfMatch struct{ objstore.Store }

func (c ignoresIfMatch) Put(ctx context.Context, key string, body []byte, o objstore.PutOptions) (string, error) {
	o.IfMatch = ""
	return c.Store.Put(ctx, key, body, o)
}

func TestProbeConditionalWrites(t *testing.T) {
	ctx := context.Background()
	dir, err := dirstore.Open(t.TempDir())
	require.NoError(t, err)
	srv := devs3test.Start(t, "")
	s3, err := s3store.NewWithClient(devs3test.Client(srv.URL), devs3test.Bucket, "")
	require.NoError(t, err)
	emu := gcsemu.Start(t)
	gcs, err := gcsstore.NewWithClient(emu.Client(t), emu.NewBucket(t), "")
	require.NoError(t, err)
	for name, s := range map[string]objstore.Store{"memstore": memstore.New(), "dirstore": dir, "dev-s3": s3, "fake-gcs-server": gcs} {
		require.NoError(t, ProbeConditionalWrites(ctx, s, "shard/s1/probe/a-1"), name)
		_, err := s.Head(ctx, "shard/s1/probe/a-1")
		require.ErrorIs(t, err, objstore.ErrNotFound, "%s: the probe object is removed", name)
	}
	for name, s := range map[string]objstore.Store{"ignores both": careless{memstore.New()}, "ignores If-Match": ignoresIfMatch{memstore.New()}} {
		err := ProbeConditionalWrites(ctx, s, "shard/s1/probe/a-1")
		require.ErrorIs(t, err, ErrNoConditionalWrites, name)
		t.Logf("%s: %v", name, err)
	}
}
