package groups

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

// TestCommitWithEndedContextRequeuesOthers: when the caller committing a
// batch has its context end, only its own change fails; the others go back
// to the front of the queue, unfinished, for their own callers to commit.
func TestCommitWithEndedContextRequeuesOthers(t *testing.T) {
	r := NewRegistry(memstore.New(), layout.New(""), "s1")
	_, err := r.Load(context.Background())
	require.NoError(t, err)
	put := func(id string) *change {
		return &change{fn: func(gs map[string]Group) error { gs[id] = Group{Spec: Spec{Template: "worker"}, ETag: id}; return nil }}
	}
	own, a, b, later := put("own"), put("a"), put("b"), put("later")
	r.queued = map[string][]*change{"acme": {later}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r.writeMu.Lock()
	r.commit(ctx, "acme", []*change{a, own, b}, own)
	r.writeMu.Unlock()
	require.True(t, own.done)
	require.ErrorIs(t, own.err, context.Canceled)
	require.False(t, a.done)
	require.False(t, b.done)
	require.Equal(t, []*change{a, b, later}, r.queued["acme"], "the others first, in their order")

	// The next caller commits them, with the change that came later.
	require.NoError(t, r.modify(context.Background(), "acme", func(gs map[string]Group) error { return nil }))
	for _, c := range []*change{a, b, later} {
		require.True(t, c.done)
		require.NoError(t, c.err)
	}
	for _, id := range []string{"a", "b", "later"} {
		_, ok := r.Get(Key{"acme", id})
		require.True(t, ok, id)
	}
	_, ok := r.Get(Key{"acme", "own"})
	require.False(t, ok, "the cancelled change was not stored")
}

// TestApplyLeavesRefusedChangesOut: a change whose fn fails (having left
// gs alone, as modify's contract asks) keeps its error; the others apply
// in order.
func TestApplyLeavesRefusedChangesOut(t *testing.T) {
	r := NewRegistry(memstore.New(), layout.New(""), "s1")
	refusal := errors.New("refused")
	gs := map[string]Group{"x": {ETag: "1"}}
	changes := []*change{
		{fn: func(gs map[string]Group) error { gs["y"] = Group{ETag: "2"}; return nil }},
		{fn: func(gs map[string]Group) error { return refusal }},
		{fn: func(gs map[string]Group) error { gs["x"] = Group{ETag: "3"}; return nil }},
	}
	refused, applied := r.apply(gs, changes)
	require.True(t, refused)
	require.True(t, applied)
	require.Equal(t, map[string]Group{"x": {ETag: "3"}, "y": {ETag: "2"}}, gs)
	require.NoError(t, changes[0].err)
	require.ErrorIs(t, changes[1].err, refusal)
	require.NoError(t, changes[2].err)

	refused, applied = r.apply(map[string]Group{}, changes[1:2])
	require.True(t, refused)
	require.False(t, applied)
}
