package status

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"

	"github.com/nstance-dev/nstance/internal/streamloop"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Shards is what the collector reads from: the shard names and a client per
// shard (*shard.Set).
type Shards interface {
	Names() []string
	Client(shard string) (nstancev1.OperatorServiceClient, error)
}

// Options configure a Collector.
type Options struct {
	Shards Shards
	// Addresses name each shard's server address on the page.
	Addresses map[string]string
	// Refresh is how often every shard is listed even without a watch event
	// (default 10s): health ages and reachability move without events.
	Refresh time.Duration
	// CallTimeout bounds each refresh's calls (default 5s).
	CallTimeout time.Duration
	// KeepErrors is how many recent errors the snapshot holds (default 50).
	KeepErrors int
	Clock      clock.WithTicker
	Log        logr.Logger
}

// Collector keeps the current Snapshot and tells subscribers when it changes.
type Collector struct {
	o Options

	mu      sync.Mutex
	shards  map[string]ShardStatus
	errs    []ErrorEntry
	version uint64
	changed chan struct{} // closed and replaced on every change
	stopped chan struct{} // closed when Run returns: event streams end
}

// NewCollector returns a collector; Run fills it.
func NewCollector(o Options) (*Collector, error) {
	if o.Shards == nil {
		return nil, errors.New("status: no shards to collect from")
	}
	if o.Refresh <= 0 {
		o.Refresh = 10 * time.Second
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = 5 * time.Second
	}
	if o.KeepErrors <= 0 {
		o.KeepErrors = 50
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	c := &Collector{o: o, shards: map[string]ShardStatus{}, changed: make(chan struct{}), stopped: make(chan struct{})}
	for _, name := range o.Shards.Names() {
		c.shards[name] = ShardStatus{Name: name, Address: o.Addresses[name], Error: "not contacted yet"}
	}
	return c, nil
}

// Snapshot returns the current snapshot, its version (bumped on every
// change) and a channel closed at the next change.
func (c *Collector) Snapshot() (Snapshot, uint64, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Snapshot{GeneratedAt: c.o.Clock.Now().UTC(), Errors: append([]ErrorEntry{}, c.errs...)}
	for _, name := range c.o.Shards.Names() {
		s.Shards = append(s.Shards, c.shards[name])
	}
	return s, c.version, c.changed
}

func (c *Collector) publish(f func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !f() {
		return
	}
	c.version++
	close(c.changed)
	c.changed = make(chan struct{})
}

// Run collects until ctx ends: per shard, a refresh loop woken by the
// ticker and by the shard's group and instance watches, and an error watch.
// Call it once.
func (c *Collector) Run(ctx context.Context) error {
	defer close(c.stopped)
	clients := map[string]nstancev1.OperatorServiceClient{}
	for _, name := range c.o.Shards.Names() {
		cl, err := c.o.Shards.Client(name)
		if err != nil {
			return err
		}
		clients[name] = cl
	}
	var wg sync.WaitGroup
	for name, cl := range clients {
		kick := make(chan struct{}, 1)
		poke := func() {
			select {
			case kick <- struct{}{}:
			default:
			}
		}
		wg.Add(4)
		go func() { defer wg.Done(); c.refreshLoop(ctx, name, cl, kick) }()
		go func() {
			defer wg.Done()
			c.watch(ctx, name, "groups", poke, func(ctx context.Context) error { return watchGroups(ctx, cl, poke) })
		}()
		go func() {
			defer wg.Done()
			c.watch(ctx, name, "instances", poke, func(ctx context.Context) error { return watchInstances(ctx, cl, poke) })
		}()
		go func() {
			defer wg.Done()
			c.watch(ctx, name, "errors", poke, func(ctx context.Context) error { return c.watchErrors(ctx, name, cl) })
		}()
	}
	wg.Wait()
	return ctx.Err()
}

func (c *Collector) refreshLoop(ctx context.Context, name string, cl nstancev1.OperatorServiceClient, kick <-chan struct{}) {
	t := c.o.Clock.NewTicker(c.o.Refresh)
	defer t.Stop()
	for {
		c.refresh(ctx, name, cl)
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		case <-kick:
		}
	}
}

// refresh lists one shard and publishes the result when it differs.
func (c *Collector) refresh(ctx context.Context, name string, cl nstancev1.OperatorServiceClient) {
	cctx, cancel := context.WithTimeout(ctx, c.o.CallTimeout)
	defer cancel()
	next, err := c.list(cctx, cl)
	if ctx.Err() != nil {
		return
	}
	c.publish(func() bool {
		cur := c.shards[name]
		if err != nil {
			msg := err.Error()
			if !cur.Reachable && cur.Error == msg {
				return false
			}
			cur.Reachable, cur.Error = false, msg
			c.shards[name] = cur
			return true
		}
		next.Name, next.Address, next.Reachable = name, cur.Address, true
		changed := !equalShard(cur, next)
		now := c.o.Clock.Now().UTC()
		next.RefreshedAt = &now
		if changed {
			c.shards[name] = next
		}
		return changed
	})
}

func (c *Collector) list(ctx context.Context, cl nstancev1.OperatorServiceClient) (ShardStatus, error) {
	var s ShardStatus
	cfg, err := cl.GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
	if err != nil {
		return s, fmt.Errorf("config status: %w", err)
	}
	groups, err := cl.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
	if err != nil {
		return s, fmt.Errorf("listing groups: %w", err)
	}
	insts, err := cl.ListInstances(ctx, &nstancev1.ListInstancesRequest{WithHealth: true})
	if err != nil {
		return s, fmt.Errorf("listing instances: %w", err)
	}
	s.Leader, s.ConfigETag = cfg.GetServerId(), cfg.GetEtag()
	if cfg.GetLeaderSince() != nil {
		s.LeaderSince = ts(cfg.GetLeaderSince())
	}
	if cfg.GetLastModified() != nil {
		s.ConfigLoaded = ts(cfg.GetLastModified())
	}
	s.Groups, s.Instances = rows(groups.GetGroups(), insts.GetInstances())
	return s, nil
}

// watch runs one watch stream of a shard, reconnecting with backoff until
// ctx ends. A stream that ends pokes the refresh loop, so a shard that went
// away shows as unreachable without waiting for the next tick.
func (c *Collector) watch(ctx context.Context, shard, what string, poke func(), run func(context.Context) error) {
	_ = streamloop.Loop{
		Name: what, Backoff: wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 8, Cap: 10 * time.Second},
		Healthy: time.Minute, Clock: c.o.Clock, Log: c.o.Log.V(1).WithValues("shard", shard),
	}.Run(ctx, func(ctx context.Context) error {
		err := run(ctx)
		if ctx.Err() == nil {
			poke()
		}
		return err
	})
}

func watchGroups(ctx context.Context, cl nstancev1.OperatorServiceClient, poke func()) error {
	st, err := cl.WatchGroups(ctx, &nstancev1.WatchGroupsRequest{})
	if err != nil {
		return err
	}
	return drain(st.Recv, poke)
}

func watchInstances(ctx context.Context, cl nstancev1.OperatorServiceClient, poke func()) error {
	st, err := cl.WatchInstances(ctx, &nstancev1.WatchInstancesRequest{})
	if err != nil {
		return err
	}
	return drain(st.Recv, poke)
}

// drain reads a stream until it ends, poking the refresh loop per message.
func drain[T any](recv func() (T, error), poke func()) error {
	for {
		if _, err := recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("stream closed by the server")
			}
			return err
		}
		poke()
	}
}

func (c *Collector) watchErrors(ctx context.Context, shard string, cl nstancev1.OperatorServiceClient) error {
	st, err := cl.WatchErrors(ctx, &nstancev1.WatchErrorsRequest{})
	if err != nil {
		return err
	}
	for {
		ev, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("stream closed by the server")
			}
			return err
		}
		e := ErrorEntry{Shard: shard, Group: ev.GetGroupId(), Instance: ev.GetInstanceId(), Message: ev.GetMessage(),
			Source: errorSourceName(ev.GetSource()), At: c.o.Clock.Now().UTC()}
		if ev.GetOccurredAt() != nil {
			e.At = ev.GetOccurredAt().AsTime().UTC()
		}
		c.publish(func() bool {
			for _, old := range c.errs {
				if old == e {
					return false // replayed after a reconnect
				}
			}
			c.errs = append([]ErrorEntry{e}, c.errs...)
			if len(c.errs) > c.o.KeepErrors {
				c.errs = c.errs[:c.o.KeepErrors]
			}
			return true
		})
	}
}
