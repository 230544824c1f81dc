package shardconn

import (
	"context"
	"time"

	"github.com/go-logr/logr"

	"github.com/nstance-dev/nstance/internal/streamloop"
)

// Follow keeps one stream of shard open until ctx ends (streamloop): each
// attempt waits for the shard's connection, reopenings are spaced by
// streamloop's backoff capped at maxBackoff (zero: its default) and each
// one calls onReopen (nil: none), the reconnect metric.
func (m *Manager) Follow(ctx context.Context, shard, stream string, maxBackoff time.Duration, log logr.Logger,
	onReopen func(), follow func(context.Context) error) {
	bo := streamloop.DefaultBackoff()
	if maxBackoff > 0 {
		bo.Cap = maxBackoff
	}
	_ = streamloop.Loop{
		Name: stream, Backoff: bo, Log: log.WithValues("shard", shard),
		Ready: func(ctx context.Context) error { return m.WaitReady(ctx, shard) },
		OnReopen: func(error) {
			if onReopen != nil {
				onReopen()
			}
		},
	}.Run(ctx, follow)
}
