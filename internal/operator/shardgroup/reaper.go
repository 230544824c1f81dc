package shardgroup

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nstance-dev/nstance/internal/operator/ledger"
	"github.com/nstance-dev/nstance/internal/operator/shardconn"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Reaper deletes the groups the ledger records as orphaned (a deleted shard
// group released without DeleteGroup: its shard was not configured, or it
// was abandoned while unreachable) once their shard is configured and
// reachable. An entry is forgotten when the server reports no member of the
// group left; until then each pass asks again.
type Reaper struct {
	Conns  *shardconn.Manager
	Ledger *ledger.Ledger
	// Reader reads the ledger (uncached).
	Reader client.Reader
	// Interval between passes; zero means 30s. Wake starts one at once.
	Interval time.Duration
	Log      logr.Logger

	once sync.Once
	wake chan struct{}
}

// Wake asks for a pass now (a shard came up); it never blocks.
func (r *Reaper) Wake() {
	select {
	case r.wakeCh() <- struct{}{}:
	default:
	}
}

func (r *Reaper) wakeCh() chan struct{} {
	r.once.Do(func() { r.wake = make(chan struct{}, 1) })
	return r.wake
}

// Run passes until ctx ends; errors are logged.
func (r *Reaper) Run(ctx context.Context) {
	wake := r.wakeCh()
	interval := r.Interval
	if interval <= 0 {
		interval = 30 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := r.Pass(ctx); err != nil && ctx.Err() == nil {
			r.Log.Error(err, "delete orphaned groups")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
		}
	}
}

// Due returns the orphans whose shard is configured and reachable now.
func Due(orphans []ledger.Orphan, known, healthy func(string) bool) []ledger.Orphan {
	var out []ledger.Orphan
	for _, o := range orphans {
		if known(o.Shard) && healthy(o.Shard) {
			out = append(out, o)
		}
	}
	return out
}

// Pass deletes every orphaned group whose shard is reachable and forgets
// those with no member left.
func (r *Reaper) Pass(ctx context.Context) error {
	entries, err := r.Ledger.Load(ctx, r.Reader)
	if err != nil {
		return err
	}
	for _, o := range Due(ledger.Orphans(entries), r.Conns.Known, r.Conns.Healthy) {
		left, err := r.reap(ctx, o)
		if err != nil {
			return err
		}
		if len(left) > 0 {
			r.Log.Info("orphaned group deleted, waiting for its instances", "group", o.Group, "shard", o.Shard, "instances", left)
			continue
		}
		if err := r.Ledger.ForgetOrphan(ctx, o.Group, o.Shard); err != nil {
			return err
		}
		r.Log.Info("orphaned group deleted", "group", o.Group, "shard", o.Shard)
	}
	return nil
}

func (r *Reaper) reap(ctx context.Context, o ledger.Orphan) ([]string, error) {
	c, err := r.Conns.Client(o.Shard)
	if err != nil {
		return nil, fmt.Errorf("orphaned group %s on shard %s: %w", o.Group, o.Shard, err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.DeleteGroup(cctx, &nstancev1.DeleteGroupRequest{GroupId: o.Group}); err != nil && status.Code(err) != codes.NotFound {
		return nil, fmt.Errorf("DeleteGroup of orphaned group %s on shard %s: %w", o.Group, o.Shard, err)
	}
	resp, err := c.ListInstances(cctx, &nstancev1.ListInstancesRequest{GroupIds: []string{o.Group}})
	if err != nil {
		return nil, fmt.Errorf("ListInstances of orphaned group %s on shard %s: %w", o.Group, o.Shard, err)
	}
	return Remaining(resp.GetInstances()), nil
}
