package reconcile_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/server/agentlive"
	"github.com/nstance-dev/nstance/internal/server/events"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/reconcile"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/internal/server/tenantops"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// epoch is where every test's fake clock starts.
var epoch = time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)

// shardConfig builds a test shard config (cluster c1, shard s1, the mock
// provider, template worker) through its typed fields.
type shardConfig struct{ c *config.Config }

func newShardConfig(t testing.TB) *shardConfig {
	t.Helper()
	c, err := config.Parse([]byte(shardtest.Config("c1", "s1", "mock")))
	require.NoError(t, err)
	return &shardConfig{c: c}
}

func (b *shardConfig) expiry(e config.Expiry) *shardConfig { b.c.Shard.Expiry = e; return b }

func (b *shardConfig) createRate(perMinute, burst int) *shardConfig {
	b.c.Shard.CreateRateLimit = config.RateLimit{PerMinute: perMinute, Burst: burst}
	return b
}

func (b *shardConfig) limits(edit func(*config.Limits)) *shardConfig {
	edit(&b.c.Shard.Limits)
	return b
}

func (b *shardConfig) shutdownGrace(d time.Duration) *shardConfig {
	b.c.Shard.ShutdownGrace = config.Duration(d)
	return b
}

func (b *shardConfig) health(interval time.Duration, misses int, grace time.Duration) *shardConfig {
	s := &b.c.Shard
	s.HealthCheckInterval, s.HealthMisses, s.AgentStartupGrace = config.Duration(interval), misses, config.Duration(grace)
	return b
}

// build validates the config as Parse would.
func (b *shardConfig) build(t testing.TB) *config.Config {
	t.Helper()
	require.NoError(t, b.c.Validate())
	return b.c
}

// shard is a reconciler over in-memory storage and the mock provider, run
// by the test through a synchronous term on a fake clock.
type shard struct {
	r      *reconcile.Reconciler
	ops    *tenantops.Ops
	term   *reconcile.TestTerm
	clk    *clocktesting.FakeClock
	p      *mock.Provider
	insts  *instances.Store
	groups *groups.Registry
	events *events.Hubs
	agents *agents // nil unless health is monitored
	store  *faultyStore
}

type shardOptions struct {
	// monitor turns on health monitoring with agents the test reports for.
	monitor bool
	// resync is the period of the full pass (default 100ms).
	resync time.Duration
	// prepare runs before the term starts (state a crash left behind).
	prepare func(s *shard)
	// lbs are the load balancer providers, by entry (none by default).
	lbs map[string]loadbalancer.Provider
	// provider replaces the mock provider the reconciler drives (s.p is
	// then unused).
	provider provider.Provider
}

// faultyStore is in-memory object storage whose writes of chosen keys fail.
type faultyStore struct {
	objstore.Store
	mu   sync.Mutex
	fail func(key string) bool
}

func (f *faultyStore) Put(ctx context.Context, key string, body []byte, o objstore.PutOptions) (string, error) {
	f.mu.Lock()
	fail := f.fail
	f.mu.Unlock()
	if fail != nil && fail(key) {
		return "", errors.New("injected write failure of " + key)
	}
	return f.Store.Put(ctx, key, body, o)
}

// failWrites makes writes of keys that fail reports fail (nil: none).
func (s *shard) failWrites(fail func(key string) bool) {
	s.store.mu.Lock()
	defer s.store.mu.Unlock()
	s.store.fail = fail
}

func newShard(t *testing.T, cfg *config.Config, o shardOptions) *shard {
	t.Helper()
	if o.resync <= 0 {
		o.resync = 100 * time.Millisecond
	}
	store := &faultyStore{Store: memstore.New()}
	keys := layout.New("")
	s := &shard{clk: clocktesting.NewFakeClock(epoch), p: mock.New(), events: events.NewHubs(0), store: store,
		insts: instances.NewStore(store, keys, "s1", nil), groups: groups.NewRegistry(store, keys, "s1")}
	ro := reconcile.Options{Cluster: "c1", Shard: "s1", Config: func() *config.Config { return cfg }, Groups: s.groups,
		Instances: s.insts, Provider: s.p, Events: s.events, Log: logr.Discard(), ResyncInterval: o.resync,
		RetryBase: 20 * time.Millisecond, Clock: s.clk, LoadBalancers: o.lbs}
	if o.provider != nil {
		ro.Provider = o.provider
	}
	if o.monitor {
		s.agents = &agents{clk: s.clk, silent: map[string]bool{}, version: map[string]string{}}
		ro.MonitorAgents = true
	}
	s.r = reconcile.New(ro)
	s.ops = tenantops.New(tenantops.Options{Shard: "s1", Config: ro.Config, Groups: s.groups, Instances: s.insts, Reconciler: s.r, Now: s.clk.Now})
	if o.prepare != nil {
		o.prepare(s)
	}
	s.startTerm(t)
	return s
}

// startTerm begins a leadership term of the shard's reconciler (with a
// fresh live table of agents when health is monitored).
func (s *shard) startTerm(t *testing.T) {
	t.Helper()
	var ag reconcile.Agents
	if s.agents != nil {
		ag = s.agents.newTerm()
	}
	s.term = reconcile.StartTestTerm(t, context.Background(), s.r, s.clk, ag)
}

// run processes the queue until idle.
func (s *shard) run(t *testing.T) { t.Helper(); s.term.RunUntilIdle(t) }

// advance moves the fake clock by d, running what falls due on the way.
func (s *shard) advance(t *testing.T, d time.Duration) { t.Helper(); s.term.Advance(t, d) }

// upsert creates or resizes group id of tenant t and runs the queue.
func (s *shard) upsert(t *testing.T, id string, size uint32, drain time.Duration) {
	t.Helper()
	s.upsertOnly(t, id, size, drain)
	s.run(t)
}

func (s *shard) upsertOnly(t *testing.T, id string, size uint32, drain time.Duration) {
	t.Helper()
	spec := &nstancev1.GroupSpec{GroupId: id, Template: "worker", Size: size}
	if drain > 0 {
		spec.DrainTimeout = durationpb.New(drain)
	}
	_, _, err := s.ops.UpsertGroup(context.Background(), "t", spec, "")
	require.NoError(t, err)
}

// running returns the running members of group id.
func (s *shard) running(group string) []*instances.Record {
	var out []*instances.Record
	for _, r := range s.insts.ListGroup("t", group) {
		if r.State == instances.StateRunning {
			out = append(out, r)
		}
	}
	return out
}

func (s *shard) ids(group string) []string {
	var out []string
	for _, r := range s.insts.ListGroup("t", group) {
		out = append(out, r.ID)
	}
	return out
}

func (s *shard) group(t *testing.T, id string) *groups.Group {
	t.Helper()
	g, ok := s.groups.Get(groups.Key{Tenant: "t", ID: id})
	require.True(t, ok)
	return g
}

func (s *shard) ready(t *testing.T, group string) int {
	t.Helper()
	return int(s.r.GroupStatus(s.group(t, group)).GetReadyCount())
}

// drain returns the events already published on a subscription.
func drain[T any](ch <-chan T) []T {
	var out []T
	for {
		select {
		case ev := <-ch:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// agents plays the Agent service for the reconciler: each term gets a real
// live table, and the test decides which instances report, and when.
type agents struct {
	clk *clocktesting.FakeClock

	mu     sync.Mutex
	live   *agentlive.Table
	silent map[string]bool
	// version is the agent version each instance reports (none when unset).
	version map[string]string
	forgot  []string
}

// newTerm returns the agents of a new term: an empty live table.
func (a *agents) newTerm() reconcile.Agents {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.live = agentlive.NewWithClock(a.clk.Now)
	return reconcile.Agents{Live: a.live, Files: a}
}

func (a *agents) table() *agentlive.Table {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.live
}

func (a *agents) LastReport(id string) (time.Time, bool) { return a.table().LastReport(id) }

func (a *agents) Notify(...string) {}

func (a *agents) Forget(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.forgot = append(a.forgot, id)
}

func (a *agents) silence(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.silent[id] = true
}

// report sends one report for id now, with notice when given.
func (a *agents) report(id string, notice *nstancev1.TerminationNotice) {
	a.mu.Lock()
	rep := &nstancev1.HealthReport{AgentVersion: a.version[id], Termination: notice}
	live := a.live
	a.mu.Unlock()
	if err := live.RecordHealth(context.Background(), agentlive.Ref{InstanceID: id}, rep, a.clk.Now()); err != nil {
		panic(err) // encoding a report built here cannot fail
	}
}

// connect opens a stream for id in the live table (as an agent's
// KeyGenRequests stream does); the returned function closes it.
func (a *agents) connect(id string) (release func()) {
	return a.table().Connect(agentlive.Ref{InstanceID: id})
}

// reportAll reports for every active instance that is not silenced.
func (s *shard) reportAll() {
	for _, rec := range s.insts.List(func(r *instances.Record) bool { return r.State.Active() }) {
		s.agents.mu.Lock()
		silent := s.agents.silent[rec.ID]
		s.agents.mu.Unlock()
		if !silent {
			s.agents.report(rec.ID, nil)
		}
	}
}
