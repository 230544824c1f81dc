package reconcile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/events"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/limits"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/reconcile/planner"
	"github.com/nstance-dev/nstance/internal/server/userdata"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// FallbackDrainTimeout applies when neither the instance, its group nor
// shard.default_drain_timeout sets one.
const FallbackDrainTimeout = groups.FallbackDrainTimeout

// Options configures a Reconciler.
type Options struct {
	Cluster string
	Shard   string
	// Config returns the running config; never nil once the reconciler runs.
	Config    func() *config.Config
	Groups    *groups.Registry
	Instances *instances.Store
	Provider  provider.Provider
	Nonces    NonceMinter
	// CACert returns the cluster CA certificate handed to new instances.
	CACert func(ctx context.Context) ([]byte, error)
	// PruneUserData deletes stored bootstrap data that keep does not name
	// and that is older than the time given (nil: none is pruned). It runs
	// with garbage collection, at most every garbage_collection.interval.
	PruneUserData func(ctx context.Context, keep func(tenant, sum string) bool, notAfter time.Time) (int, error)
	// UserData returns an instance's own bootstrap data and its format:
	// the tenant's stored data, or the template's userdata rendered for it
	// (nil: instances get none).
	UserData func(ctx context.Context, rec *instances.Record) ([]byte, string, error)
	// RegistrationAddr and AgentAddr are passed to agents.
	RegistrationAddr string
	AgentAddr        string
	Events           *events.Hubs
	Log              logr.Logger
	// Workers is the number of concurrent workers (default 4).
	Workers int
	// ResyncInterval is the period of the full pass (default 30s).
	ResyncInterval time.Duration
	// RetryBase and RetryMax bound the backoff of failed keys (default 200ms, 1m).
	RetryBase, RetryMax time.Duration
	// Clock drives the periodic passes and the queue's delays (default the
	// real clock; tests pass k8s.io/utils/clock/testing's fake clock).
	Clock clock.WithTicker
	// Now reads the time of records, deadlines and ages (default Clock.Now).
	Now func() time.Time

	// MonitorAgents turns on agent health monitoring, from each term's
	// live table (Agents.Live): an instance is ready only while its agent
	// reports, and is marked unhealthy (then replaced first and drained)
	// after shard.health_misses missed reports, or when no report came
	// within shard.agent_startup_grace of its creation (or of the term's
	// start). Off (providers without agents, e.g. mock), or in a term
	// without a live table, readiness is provider state alone. The tuning
	// comes from the shard config only.
	MonitorAgents bool
	// RevokeAgent, when set, revokes the agent certificates of an instance
	// before its record is deleted (a failure keeps the record and retries),
	// so a deleted instance's agent is refused at its next handshake and RPC.
	RevokeAgent func(ctx context.Context, instanceID, reason string) error
	// QueueMetrics, when set, receives the work queue's metrics (depth,
	// wait and reconcile durations, retries).
	QueueMetrics workqueue.MetricsProvider
	// LoadBalancers are the providers of the config's load_balancers
	// entries, by name (built at start; see loadbalancers.go): members are
	// registered after their first health report and deregistered, then
	// removed after the entry's delay, before their drain is announced.
	LoadBalancers map[string]loadbalancer.Provider
	// LBCalls, when set, is told of every load balancer call and its
	// result (metrics).
	LBCalls func(lb, op string, err error)
}

type kind byte

const (
	kindGroup kind = 'g'
	kindInst  kind = 'i'
)

// item is a queue key: a group (tenant, id) or an instance (id).
type item struct {
	kind   kind
	tenant string
	id     string
}

func (it item) String() string {
	if it.kind == kindGroup {
		return "group " + it.tenant + "/" + it.id
	}
	return "instance " + it.id
}

// Reconciler drives groups and instances of one shard: a queue of group
// and instance keys, and an executor that gathers a key's state, asks the
// planner (groups) or compares with the provider (instances) and applies
// the result. Decisions live in package planner.
//
// Everything one leadership term has (its queue, the agents' live table,
// what it published and observed) lives in a term value that Run builds
// and drops (term.go): a server that leads again starts as a fresh one
// would, with nothing to reset. The Reconciler itself keeps the options,
// the current term and the create rate limiters (limMu: charged by
// workers for group creates and by API handlers for on-demand admission).
type Reconciler struct {
	o   Options
	log logr.Logger

	termMu sync.Mutex
	cur    *term         // the running term (nil between terms)
	ended  chan struct{} // the done channel of the last term that ended
	// delaying, when set (tests), supplies the queue's delaying layer.
	delaying func() workqueue.TypedDelayingInterface[item]

	limMu   sync.Mutex
	limiter *rate.Limiter
	limCfg  config.RateLimit
	// tenantAdmit charges on-demand CreateInstance calls, tenantPace paces
	// group scale-ups, both per tenant (shard.limits.tenant_create_rate).
	tenantAdmit, tenantPace *limits.KeyedRate
	tenantCfg               config.RateLimit
}

// New builds a reconciler. Keys enqueued while no term runs are dropped:
// a term starts with a full resync.
func New(o Options) *Reconciler {
	if o.Workers <= 0 {
		o.Workers = 4
	}
	if o.ResyncInterval <= 0 {
		o.ResyncInterval = 30 * time.Second
	}
	if o.RetryBase <= 0 {
		o.RetryBase = 200 * time.Millisecond
	}
	if o.RetryMax <= 0 {
		o.RetryMax = time.Minute
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Now == nil {
		o.Now = o.Clock.Now
	}
	if o.Events == nil {
		o.Events = events.NewHubs(0)
	}
	return &Reconciler{o: o, log: o.Log.WithName("reconcile")}
}

func (r *Reconciler) newQueue() workqueue.TypedRateLimitingInterface[item] {
	cfg := workqueue.TypedRateLimitingQueueConfig[item]{Name: "nstance-reconcile-" + r.o.Shard, Clock: r.o.Clock, MetricsProvider: r.o.QueueMetrics}
	if r.delaying != nil {
		cfg.DelayingQueue = r.delaying()
	}
	return workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[item](r.o.RetryBase, r.o.RetryMax), cfg)
}

// Running reports whether a term runs (the server leads its shard).
func (r *Reconciler) Running() bool { return r.curTerm() != nil }

// Events returns the hubs the reconciler publishes to.
func (r *Reconciler) Events() *events.Hubs { return r.o.Events }

// Run runs one leadership term with the term's agents: it serves reads
// from the cached state, makes that state equal to storage, then converges
// until ctx ends and stops its workers (see load.go). Run it for each
// leadership term; it must not run twice at once.
func (r *Reconciler) Run(ctx context.Context, agents Agents) error {
	tm, err := r.begin(ctx, agents)
	if err != nil {
		if ctx.Err() != nil {
			return nil // the term ended while loading
		}
		return err
	}
	defer r.end(tm)
	q := tm.queue
	var wg sync.WaitGroup
	for i := 0; i < r.o.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r.processNext(ctx, q) {
			}
		}()
	}
	r.resync(ctx)
	t := r.o.Clock.NewTicker(r.o.ResyncInterval)
	defer t.Stop()
	// The health pass runs twice per report interval so a miss is seen promptly.
	hi := r.tuning().HealthInterval
	ht := r.o.Clock.NewTicker(hi / 2)
	defer func() { ht.Stop() }()
	for {
		select {
		case <-ctx.Done():
			q.ShutDown()
			wg.Wait()
			return nil
		case <-t.C():
			r.resync(ctx)
		case <-ht.C():
			r.healthPass(ctx, tm)
			if cur := r.tuning().HealthInterval; cur != hi {
				// clock.Ticker has no Reset.
				ht.Stop()
				hi = cur
				ht = r.o.Clock.NewTicker(hi / 2)
			}
		}
	}
}

// begin starts a term: a new term value (fresh queue, nothing published
// or observed yet), reads served from the cache and the state then checked
// against storage (load.go). When it fails it has ended the term itself,
// otherwise end must follow.
func (r *Reconciler) begin(ctx context.Context, agents Agents) (*term, error) {
	tm := r.newTerm(agents)
	r.termMu.Lock()
	if r.cur != nil {
		r.termMu.Unlock()
		return nil, errors.New("reconciler is already running")
	}
	r.cur = tm
	r.termMu.Unlock()
	warm := r.loadCached(ctx)
	if warm {
		close(tm.loaded)
	}
	if err := r.verify(ctx, warm); err != nil {
		r.end(tm)
		return nil, err
	}
	if !warm {
		close(tm.loaded)
	}
	close(tm.verified)
	return tm, nil
}

// end finishes tm: its queue stops, waiters are released and nothing of it
// stays reachable from the Reconciler.
func (r *Reconciler) end(tm *term) {
	tm.queue.ShutDown()
	if tm.health != nil {
		tm.health.Subscribe(nil)
	}
	r.termMu.Lock()
	defer r.termMu.Unlock()
	select {
	case <-tm.done:
	default:
		close(tm.done)
	}
	if r.cur == tm {
		r.cur, r.ended = nil, tm.done
	}
}

// Load makes the record index and dynamic groups equal to object storage
// and applies the static groups of the running config.
func (r *Reconciler) Load(ctx context.Context) error { return r.verify(ctx, false) }

// ConfigChanged applies a new config: static groups are replaced, every
// group is reconciled again and the create rate limit is updated.
func (r *Reconciler) ConfigChanged() {
	for _, k := range r.o.Groups.SetStatic(r.o.Config()) {
		r.GroupChanged(k)
	}
	for _, g := range r.o.Groups.List("") {
		r.EnqueueGroup(g.Key())
	}
	if tm := r.curTerm(); tm != nil && tm.files != nil {
		tm.files.Notify()
	}
}

// GroupChanged publishes the group's current state (or its deletion) and
// reconciles it.
func (r *Reconciler) GroupChanged(k groups.Key) {
	if g, ok := r.o.Groups.Get(k); ok {
		r.publishGroup(g, true)
	} else {
		if tm := r.curTerm(); tm != nil {
			tm.statusMu.Lock()
			delete(tm.lastStatus, k)
			tm.statusMu.Unlock()
		}
		r.o.Events.Groups.Publish(k.Tenant, &nstancev1.GroupEvent{
			Type: nstancev1.GroupEventType_GROUP_EVENT_TYPE_DELETE, GroupId: k.ID,
			OccurredAt: timestamppb.New(r.o.Now()), Shard: r.o.Shard,
		})
	}
	if tm := r.curTerm(); tm != nil && tm.files != nil {
		// Group vars feed the members' files.
		var ids []string
		for _, rec := range r.o.Instances.ListGroup(k.Tenant, k.ID) {
			ids = append(ids, rec.ID)
		}
		if len(ids) > 0 {
			tm.files.Notify(ids...)
		}
	}
	r.EnqueueGroup(k)
}

// EnqueueGroup schedules a group for reconciliation.
func (r *Reconciler) EnqueueGroup(k groups.Key) {
	r.enqueue(item{kind: kindGroup, tenant: k.Tenant, id: k.ID})
}

// EnqueueInstance schedules an instance for reconciliation.
func (r *Reconciler) EnqueueInstance(id string) { r.enqueue(item{kind: kindInst, id: id}) }

// enqueue adds it to the running term's queue (dropped between terms).
func (r *Reconciler) enqueue(it item) {
	if tm := r.curTerm(); tm != nil {
		tm.queue.Add(it)
	}
}

// resync enqueues every group, and every instance whose record disagrees
// with what the provider reports or that has pending work. Provider
// instances without a record are deleted by garbage collection (gc.go) once
// they stay orphaned for the grace period.
func (r *Reconciler) resync(ctx context.Context) {
	tm := r.curTerm()
	if tm == nil {
		return
	}
	for _, g := range r.o.Groups.List("") {
		r.EnqueueGroup(g.Key())
	}
	// Groups that vanished but still own instances.
	seenGroups := map[groups.Key]bool{}
	listed, err := r.o.Provider.List(ctx)
	if err != nil {
		r.reportError("", "", "", nstancev1.ErrorSource_ERROR_SOURCE_PROVIDER, fmt.Errorf("listing provider instances: %w", err))
	}
	observed := make(map[string]provider.Instance, len(listed))
	for _, inst := range listed {
		observed[inst.InstanceID] = inst
	}
	recs := r.o.Instances.List(nil)
	known := make(map[string]bool, len(recs))
	for _, rec := range recs {
		known[rec.ID] = true
		if rec.GroupID != "" && !rec.OnDemand {
			k := groups.Key{Tenant: rec.Tenant, ID: rec.GroupID}
			if !seenGroups[k] {
				seenGroups[k] = true
				if _, ok := r.o.Groups.Get(k); !ok {
					r.EnqueueGroup(k)
				}
			}
		}
		obs, present := observed[rec.ID]
		switch {
		case err != nil:
			r.EnqueueInstance(rec.ID)
		case rec.State == instances.StatePending || rec.State == instances.StatePendingDeletion || rec.State == instances.StateDeleting:
			r.EnqueueInstance(rec.ID)
		case !present:
			r.EnqueueInstance(rec.ID)
		case obs.State == provider.StateRunning && rec.State != instances.StateRunning && rec.State != instances.StateUnhealthy:
			r.EnqueueInstance(rec.ID)
		case obs.State == provider.StateStopped:
			r.EnqueueInstance(rec.ID)
		case rec.OnDemand && r.expired(rec, r.o.Config().Shard.Expiry.OndemandAge.D()):
			r.EnqueueInstance(rec.ID)
		case r.lbPending(rec):
			r.EnqueueInstance(rec.ID)
		}
	}
	r.reconcileLoadBalancers(ctx, tm)
	r.collectGarbage(ctx, tm, listed, err == nil, known, recs)
}

func (r *Reconciler) processNext(ctx context.Context, q workqueue.TypedRateLimitingInterface[item]) bool {
	it, shutdown := q.Get()
	if shutdown {
		return false
	}
	defer q.Done(it)
	var after time.Duration
	var err error
	if it.kind == kindGroup {
		after, err = r.syncGroup(ctx, groups.Key{Tenant: it.tenant, ID: it.id})
	} else {
		after, err = r.syncInstance(ctx, it.id)
	}
	switch {
	case err != nil:
		r.log.V(1).Info("reconcile failed; retrying with backoff", "key", it.String(), "error", err.Error())
		q.AddRateLimited(it)
	case after > 0:
		q.Forget(it)
		q.AddAfter(it, after)
	default:
		q.Forget(it)
	}
	return true
}

func (r *Reconciler) cfg() *config.Config { return r.o.Config() }

func (r *Reconciler) expired(rec *instances.Record, age time.Duration) bool {
	return age > 0 && r.o.Now().Sub(rec.CreatedAt) >= age
}

// maxTenants bounds the per-tenant create limiters (tenants are
// authenticated; refilled buckets are dropped when room is needed).
const maxTenants = 100000

// tenantRatesLocked returns the per-tenant limiters, rebuilt when the config's
// rate changed. limMu must be held.
func (r *Reconciler) tenantRatesLocked() (admit, pace *limits.KeyedRate) {
	rl := r.cfg().Shard.Limits.WithDefaults().TenantCreateRate
	if r.tenantAdmit == nil || r.tenantCfg != rl {
		r.tenantAdmit = limits.NewKeyedRate(rl.PerMinute, rl.Burst, maxTenants, r.o.Now)
		r.tenantPace = limits.NewKeyedRate(rl.PerMinute, rl.Burst, maxTenants, r.o.Now)
		r.tenantCfg = rl
	}
	return r.tenantAdmit, r.tenantPace
}

// AdmitCreate charges one on-demand creation to tenant's rate
// (shard.limits.tenant_create_rate); false: refused.
func (r *Reconciler) AdmitCreate(tenant string) bool {
	r.limMu.Lock()
	defer r.limMu.Unlock()
	admit, _ := r.tenantRatesLocked()
	return admit.Allow(tenant) == limits.Allowed
}

// reserveCreate takes a create token (the shard's, and for a group
// scale-up, tenant's too; on-demand creations were charged on admission);
// when none is available it returns how long until one is.
func (r *Reconciler) reserveCreate(tenant string) (bool, time.Duration) {
	r.limMu.Lock()
	defer r.limMu.Unlock()
	release := func() {}
	if tenant != "" {
		_, pace := r.tenantRatesLocked()
		wait, cancel, ok := pace.Reserve(tenant)
		if !ok {
			return false, time.Second
		}
		if wait > 0 {
			cancel()
			return false, max(wait, 10*time.Millisecond)
		}
		release = cancel
	}
	rl := r.cfg().Shard.CreateRateLimit
	if rl.PerMinute <= 0 {
		return true, 0
	}
	if r.limiter == nil || r.limCfg != rl {
		burst := rl.Burst
		if burst <= 0 {
			burst = 1
		}
		r.limiter = rate.NewLimiter(rate.Limit(float64(rl.PerMinute)/60), burst)
		r.limCfg = rl
	}
	now := r.o.Now()
	if r.limiter.AllowN(now, 1) {
		return true, 0
	}
	release() // the tenant's token goes back: nothing is created now
	res := r.limiter.ReserveN(now, 1)
	d := res.DelayFrom(now)
	res.CancelAt(now)
	if d < 10*time.Millisecond {
		d = 10 * time.Millisecond
	}
	return false, d
}

// syncGroup gathers the group's state, asks the planner what it needs and
// applies the plan: deletions first (announced pending-deletion), then the
// creates, each subject to the create rate limits. When a deletion fails no
// instance is created (the plan counted on it) and the key is retried.
func (r *Reconciler) syncGroup(ctx context.Context, k groups.Key) (time.Duration, error) {
	cfg := r.cfg()
	g, exists := r.o.Groups.Get(k)
	recs := r.o.Instances.ListGroup(k.Tenant, k.ID)
	members := make([]planner.Member, 0, len(recs))
	for _, rec := range recs {
		if !rec.OnDemand {
			members = append(members, r.member(rec))
		}
	}
	in := planner.Group{Exists: exists}
	if exists {
		in.Size = g.Spec.Size
		in.Expiry = planner.Expiry{ForcedAge: cfg.Shard.Expiry.ForcedAge.D(), EligibleAge: cfg.Shard.Expiry.EligibleAge.D()}
		in.MaxUnavailable, in.Paused = g.Spec.Rollout.MaxUnavailable, g.Spec.Rollout.Paused
		if eff, err := groups.Resolve(cfg, &g.Spec, groups.Overrides{}); err == nil {
			in.Infra = &eff
		}
	}
	surge := r.tuning().Surge
	if exists {
		surge = g.Spec.Rollout.Surge(surge)
	}
	p := planner.PlanGroup(in, members, r.o.Now(), r.healthTuning(), surge)
	var errs []error
	for _, d := range p.Deletions {
		if err := r.BeginDeletion(ctx, d.ID, d.Reason, false, d.Message); err != nil {
			errs = append(errs, err)
		}
	}
	if !exists {
		return 0, errors.Join(errs...)
	}
	var after time.Duration
	n := 0
	for ; n < p.Creates && len(errs) == 0; n++ {
		ok, wait := r.reserveCreate(g.Tenant)
		if !ok {
			after = wait
			break
		}
	}
	errs = append(errs, r.createManyForGroup(ctx, g, cfg, n)...)
	r.publishGroup(g, false)
	if len(errs) > 0 {
		return 0, errors.Join(errs...)
	}
	return after, nil
}

// NewRecord returns the pending record of a new instance of tenant (of
// groupID when set) with the resolved settings eff.
func (r *Reconciler) NewRecord(tenant, groupID string, eff groups.Effective, labels map[string]string) (*instances.Record, error) {
	prefix := groupID
	if prefix == "" {
		prefix = eff.Template
	}
	id, err := instances.NewID(prefix)
	if err != nil {
		return nil, err
	}
	now := r.o.Now().UTC()
	return &instances.Record{
		ID: id, Tenant: tenant, GroupID: groupID, Shard: r.o.Shard, ProviderID: provider.ID(r.o.Cluster, r.o.Shard, id),
		State: instances.StatePending, Template: eff.Template, InstanceType: eff.InstanceType, SubnetPool: eff.SubnetPool,
		Vars: eff.Vars, Args: eff.Args, Labels: labels, DrainTimeout: eff.DrainTimeout, NoDrain: eff.DrainTimeout == 0, CreatedAt: now, UpdatedAt: now,
		UserDataSHA256: eff.UserDataSHA256, UserDataFormat: eff.UserDataFormat,
	}, nil
}

// createParallelism bounds the creates of one group's pass that run at
// once: each is a record write, a nonce, the provider's create and a record
// update, and replacing a hundred lost members one after the other took
// seconds (bench: BenchmarkVMsGoing).
const createParallelism = 16

// createManyForGroup creates n members of g, up to createParallelism at a
// time, and returns the errors of those that failed.
func (r *Reconciler) createManyForGroup(ctx context.Context, g *groups.Group, cfg *config.Config, n int) []error {
	var (
		mu   sync.Mutex
		errs []error
		eg   errgroup.Group
	)
	eg.SetLimit(createParallelism)
	for range n {
		eg.Go(func() error {
			if err := r.createForGroup(ctx, g, cfg); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			return nil // every create runs; their errors are returned together
		})
	}
	_ = eg.Wait()
	return errs
}

func (r *Reconciler) createForGroup(ctx context.Context, g *groups.Group, cfg *config.Config) error {
	eff, err := groups.Resolve(cfg, &g.Spec, groups.Overrides{})
	if err == nil {
		// The template's tenants list may have changed since the group was
		// accepted: a template no longer for this tenant makes no instance.
		if reason := cfg.CheckTemplateTenant(eff.Template, g.Tenant); reason != "" {
			err = errors.New(reason)
		}
	}
	if err != nil {
		err = fmt.Errorf("group %s: %w", g.Key(), err)
		r.reportError(g.Tenant, g.ID, "", nstancev1.ErrorSource_ERROR_SOURCE_CONFIG, err)
		return err
	}
	rec, err := r.NewRecord(g.Tenant, g.ID, eff, g.Spec.Labels)
	if err != nil {
		return err
	}
	if err := r.o.Instances.Create(ctx, rec); err != nil {
		r.reportError(g.Tenant, g.ID, rec.ID, nstancev1.ErrorSource_ERROR_SOURCE_RECONCILE, err)
		return err
	}
	return r.launch(ctx, rec)
}

// launch asks the provider for a recorded instance. On failure the provider
// side is cleaned up and the record removed so the group retries afresh.
func (r *Reconciler) launch(ctx context.Context, rec *instances.Record) error {
	fail := func(err error) error {
		r.reportError(rec.Tenant, rec.GroupID, rec.ID, nstancev1.ErrorSource_ERROR_SOURCE_PROVIDER, err)
		if derr := r.o.Provider.Delete(ctx, rec.ID); derr != nil {
			r.log.Error(derr, "cleaning up failed create", "instance", rec.ID)
		}
		if rec.OnDemand {
			// On-demand: keep the record (the caller holds its id) and retry.
			_, _ = r.o.Instances.Update(ctx, rec.ID, func(x *instances.Record) error {
				x.Message = err.Error()
				x.UpdatedAt = r.o.Now().UTC()
				return nil
			})
			return err
		}
		if r.o.RevokeAgent != nil {
			if rerr := r.o.RevokeAgent(ctx, rec.ID, "instance create failed"); rerr != nil {
				// Keep the record: the next pass retries the deletion.
				r.log.Error(rerr, "revoking the agent of a failed create", "instance", rec.ID)
				return err
			}
		}
		if derr := r.o.Instances.Delete(ctx, rec.ID); derr != nil {
			r.log.Error(derr, "removing record of failed create", "instance", rec.ID)
		}
		return err
	}
	req := provider.CreateRequest{
		InstanceID: rec.ID, ProviderID: rec.ProviderID, Cluster: r.o.Cluster, Shard: r.o.Shard, Tenant: rec.Tenant,
		GroupID: rec.GroupID, Template: rec.Template, InstanceType: rec.InstanceType, SubnetPool: rec.SubnetPool,
		Vars: rec.Vars, Args: rec.Args, Labels: rec.Labels, RegistrationAddr: r.o.RegistrationAddr, AgentAddr: r.o.AgentAddr,
	}
	if r.o.Nonces != nil {
		tok, err := r.o.Nonces.MintAgentNonce(ctx, AgentNonceRequest{InstanceID: rec.ID, Tenant: rec.Tenant, GroupID: rec.GroupID})
		if err != nil {
			return fail(err)
		}
		req.AgentNonce = tok
	}
	if r.o.CACert != nil {
		ca, err := r.o.CACert(ctx)
		if err != nil {
			return fail(fmt.Errorf("reading cluster CA: %w", err))
		}
		req.CACertPEM = ca
	}
	if r.o.UserData != nil {
		data, format, err := r.o.UserData(ctx, rec)
		if err != nil {
			return fail(fmt.Errorf("instance %s: %w", rec.ID, err))
		}
		req.UserData, req.UserDataFormat = data, format
		if len(data) > 0 && rec.BootUserDataSHA256 == "" {
			// Recorded before the create: the status says what it booted with.
			sum := userdata.Sum(data)
			if _, err := r.o.Instances.Update(ctx, rec.ID, func(x *instances.Record) error {
				x.BootUserDataSHA256 = sum
				return nil
			}); err != nil {
				return fail(fmt.Errorf("recording the user data of instance %s: %w", rec.ID, err))
			}
		}
	}
	pctx, cancel := r.providerCtx(ctx)
	inst, err := r.o.Provider.Create(pctx, req)
	cancel()
	if err != nil {
		return fail(fmt.Errorf("creating instance %s: %w", rec.ID, err))
	}
	state := instances.StateCreating
	if inst.State == provider.StateRunning {
		state = instances.StateRunning
	}
	_, err = r.o.Instances.Update(ctx, rec.ID, func(x *instances.Record) error {
		if !x.State.Active() {
			return instances.ErrNoChange
		}
		x.State, x.Message, x.UpdatedAt = state, "", r.o.Now().UTC()
		if len(inst.Addresses) > 0 {
			// Registration checks the agent against these.
			x.Addresses = slices.Clone(inst.Addresses)
		}
		return nil
	})
	return err
}

func (r *Reconciler) providerCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	d := r.cfg().Shard.Timeouts.ProviderCall.D()
	if d <= 0 {
		d = 2 * time.Minute
	}
	return context.WithTimeout(ctx, d)
}

func (r *Reconciler) syncInstance(ctx context.Context, id string) (time.Duration, error) {
	rec, ok := r.o.Instances.Get(id)
	if !ok {
		return 0, nil
	}
	gk := groups.Key{Tenant: rec.Tenant, ID: rec.GroupID}
	defer func() {
		if rec.GroupID != "" {
			r.EnqueueGroup(gk)
		}
	}()
	now := r.o.Now()
	switch rec.State {
	case instances.StatePending:
		if !rec.OnDemand {
			// Left by a crash between record and provider call, or still waiting on the group's rate limit.
			return 0, r.launch(ctx, rec)
		}
		ok, wait := r.reserveCreate("") // charged to the tenant on admission
		if !ok {
			return wait, nil
		}
		return 0, r.launch(ctx, rec)
	case instances.StatePendingDeletion:
		if rec.DrainHeld {
			// Deregistered from its load balancers first, then drained.
			wake, released, err := r.syncLoadBalancers(ctx, r.curTerm(), id)
			if err != nil || !released {
				return wake, err
			}
			if err := r.releaseDrain(ctx, id); err != nil {
				return 0, err
			}
			if rec, ok = r.o.Instances.Get(id); !ok {
				return 0, nil
			}
		}
		if rec.DrainAcked || rec.DrainDeadline == nil || !now.Before(*rec.DrainDeadline) {
			return 0, r.deleteNow(ctx, rec)
		}
		return rec.DrainDeadline.Sub(now), nil
	case instances.StateDeleting:
		return 0, r.deleteNow(ctx, rec)
	}
	// Active and created: compare with the provider.
	pctx, cancel := r.providerCtx(ctx)
	obs, err := r.o.Provider.Status(pctx, id)
	cancel()
	if errors.Is(err, provider.ErrNotFound) {
		msg := "instance disappeared from the provider"
		r.reportError(rec.Tenant, rec.GroupID, rec.ID, nstancev1.ErrorSource_ERROR_SOURCE_PROVIDER, errors.New(msg))
		return 0, r.finish(ctx, rec, nstancev1.DeletionReason_DELETION_REASON_UNHEALTHY, msg)
	}
	if err != nil {
		r.reportError(rec.Tenant, rec.GroupID, rec.ID, nstancev1.ErrorSource_ERROR_SOURCE_PROVIDER, err)
		return 0, err
	}
	switch {
	case obs.State == provider.StateStopped:
		if rec.State != instances.StateStopped {
			if _, err := r.o.Instances.Update(ctx, id, func(x *instances.Record) error {
				if !x.State.Active() {
					return instances.ErrNoChange
				}
				x.State, x.Message, x.UpdatedAt = instances.StateStopped, obs.Message, now.UTC()
				x.WorkloadGone = true
				return nil
			}); err != nil {
				return 0, err
			}
			r.reportError(rec.Tenant, rec.GroupID, rec.ID, nstancev1.ErrorSource_ERROR_SOURCE_PROVIDER, fmt.Errorf("instance stopped: %s", obs.Message))
		}
		if rec.GroupID == "" || rec.OnDemand {
			return 0, r.BeginDeletion(ctx, id, nstancev1.DeletionReason_DELETION_REASON_UNHEALTHY, false, "instance stopped: "+obs.Message)
		}
		// Group members are replaced first; the group drains this one afterwards.
		return 0, nil
	case obs.State == provider.StateRunning && rec.State != instances.StateRunning && rec.State != instances.StateUnhealthy:
		if _, err := r.o.Instances.Update(ctx, id, func(x *instances.Record) error {
			// Unhealthy is only left by replacement.
			if !x.State.Active() || x.State == instances.StateRunning || x.State == instances.StateUnhealthy {
				return instances.ErrNoChange
			}
			x.State, x.Message, x.UpdatedAt = instances.StateRunning, "", now.UTC()
			if len(obs.Addresses) > 0 {
				x.Addresses = slices.Clone(obs.Addresses)
			}
			return nil
		}); err != nil {
			return 0, err
		}
	}
	if len(obs.Addresses) > 0 && !slices.Equal(obs.Addresses, rec.Addresses) {
		// The provider's addresses are what registration checks callers against.
		if _, err := r.o.Instances.Update(ctx, id, func(x *instances.Record) error {
			if !x.State.Active() || slices.Equal(obs.Addresses, x.Addresses) {
				return instances.ErrNoChange
			}
			x.Addresses = slices.Clone(obs.Addresses)
			return nil
		}); err != nil {
			return 0, err
		}
	}
	if err := r.noteHealth(ctx, rec); err != nil {
		return 0, err
	}
	// Running at the provider: is the VM going away anyway?
	vanishWake := r.vanishing(ctx, rec)
	lbWake, _, err := r.syncLoadBalancers(ctx, r.curTerm(), id)
	if err != nil {
		return 0, err
	}
	if vanishWake > 0 && (lbWake == 0 || vanishWake < lbWake) {
		lbWake = vanishWake
	}
	if rec.OnDemand && r.expired(rec, r.cfg().Shard.Expiry.OndemandAge.D()) {
		return 0, r.BeginDeletion(ctx, id, nstancev1.DeletionReason_DELETION_REASON_EXPIRY, false, "on-demand instance reached expiry.ondemand_age")
	}
	if rec.OnDemand && planner.Urgent(rec) && rec.State != instances.StateStopped {
		reason := nstancev1.DeletionReason_DELETION_REASON_UNHEALTHY
		if rec.TerminationNotice != "" {
			reason = nstancev1.DeletionReason_DELETION_REASON_SPOT_TERMINATION
		}
		return 0, r.BeginDeletion(ctx, id, reason, false, rec.Message)
	}
	return lbWake, nil
}

// BeginDeletion moves an active instance to pending_deletion (or straight to
// deletion when skipDrain) and announces it. Instances already on their way
// out are left alone.
func (r *Reconciler) BeginDeletion(ctx context.Context, id string, reason nstancev1.DeletionReason, skipDrain bool, msg string) error {
	changed, held := false, false
	now := r.o.Now().UTC()
	rec, err := r.o.Instances.Update(ctx, id, func(x *instances.Record) error {
		if !x.State.Active() {
			if skipDrain && x.State == instances.StatePendingDeletion && !x.DrainAcked {
				x.DrainAcked = true
				x.UpdatedAt = now
				return nil
			}
			return instances.ErrNoChange
		}
		// A member marked for scale-down with skip_drain was drained by
		// its caller already, whatever removes it now.
		// A member whose drain timeout is 0 is never drained.
		skipDrain = skipDrain || x.ScaleDownSkipDrain || x.NoDrain
		deadline := now.Add(r.drainTimeout(x))
		x.State, x.DeletionReason, x.DrainDeadline, x.DrainAcked = instances.StatePendingDeletion, reason, &deadline, skipDrain
		x.Message, x.UpdatedAt = msg, now
		// Live at a load balancer: deregistered (and its delay waited)
		// before its drain is announced and its deadline runs.
		held = false
		for _, st := range x.LoadBalancers {
			held = held || st.Live()
		}
		x.DrainHeld = held
		changed = true
		return nil
	})
	if err != nil {
		if errors.Is(err, instances.ErrNotFound) {
			return nil
		}
		return err
	}
	if changed && !skipDrain && !held {
		r.publishInstance(rec, nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION, msg)
	}
	r.EnqueueInstance(id)
	if rec.GroupID != "" {
		r.EnqueueGroup(groups.Key{Tenant: rec.Tenant, ID: rec.GroupID})
	}
	return nil
}

// drainTimeout is x's drain timeout: its own, else the shard's default,
// else FallbackDrainTimeout.
func (r *Reconciler) drainTimeout(x *instances.Record) time.Duration {
	if x.NoDrain {
		return 0
	}
	d := x.DrainTimeout
	if d <= 0 {
		d = r.cfg().Shard.DefaultDrainTimeout.D()
	}
	if d <= 0 {
		d = FallbackDrainTimeout
	}
	return d
}

func (r *Reconciler) deleteNow(ctx context.Context, rec *instances.Record) error {
	changed := false
	rec, err := r.o.Instances.Update(ctx, rec.ID, func(x *instances.Record) error {
		if x.State == instances.StateDeleting {
			return instances.ErrNoChange
		}
		x.State, x.UpdatedAt = instances.StateDeleting, r.o.Now().UTC()
		changed = true
		return nil
	})
	if err != nil {
		if errors.Is(err, instances.ErrNotFound) {
			return nil
		}
		return err
	}
	if changed {
		r.publishInstance(rec, nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETING, rec.Message)
	}
	pctx, cancel := r.providerCtx(ctx)
	err = r.o.Provider.Delete(pctx, rec.ID)
	cancel()
	if err != nil {
		err = fmt.Errorf("deleting instance %s: %w", rec.ID, err)
		r.reportError(rec.Tenant, rec.GroupID, rec.ID, nstancev1.ErrorSource_ERROR_SOURCE_PROVIDER, err)
		return err
	}
	return r.finish(ctx, rec, rec.DeletionReason, rec.Message)
}

// finish removes the record of an instance that no longer exists at the
// provider and announces the deletion.
func (r *Reconciler) finish(ctx context.Context, rec *instances.Record, reason nstancev1.DeletionReason, msg string) error {
	if r.o.RevokeAgent != nil {
		if err := r.o.RevokeAgent(ctx, rec.ID, "instance deleted"); err != nil {
			return fmt.Errorf("revoking the agent certificates of %s: %w", rec.ID, err)
		}
	}
	r.removeLeftovers(ctx, rec)
	if err := r.o.Instances.Delete(ctx, rec.ID); err != nil {
		return err
	}
	r.forget(rec.ID)
	rec.DeletionReason = reason
	r.publishInstance(rec, nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED, msg)
	if rec.GroupID != "" {
		r.EnqueueGroup(groups.Key{Tenant: rec.Tenant, ID: rec.GroupID})
	}
	return nil
}

func (r *Reconciler) publishInstance(rec *instances.Record, st nstancev1.InstanceEventStatus, msg string) {
	ev := &nstancev1.InstanceEvent{
		Status: st, Reason: rec.DeletionReason, InstanceId: rec.ID, ProviderId: rec.ProviderID, GroupId: rec.GroupID,
		OccurredAt: timestamppb.New(r.o.Now()), Shard: r.o.Shard, Message: msg, Replaced: rec.Replaced(),
	}
	if st == nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION && rec.DrainDeadline != nil {
		ev.DrainDeadline = timestamppb.New(*rec.DrainDeadline)
	}
	r.o.Events.Instances.Publish(rec.Tenant, ev)
}

// reportError publishes an error to the watchers of its tenant only. An
// error that belongs to no tenant (the provider's list failed, an orphan
// could not be deleted) is the shard's business: it goes to the server log,
// never to every tenant.
func (r *Reconciler) reportError(tenant, group, inst string, src nstancev1.ErrorSource, err error) {
	if tenant == "" {
		r.log.Error(err, "shard error (no tenant to report it to)", "source", src.String(), "group", group, "instance", inst)
		return
	}
	r.log.Error(err, "reconcile error", "tenant", tenant, "group", group, "instance", inst)
	ev := &nstancev1.ErrorEvent{Source: src, GroupId: group, InstanceId: inst, Message: err.Error(),
		OccurredAt: timestamppb.New(r.o.Now()), Shard: r.o.Shard}
	r.o.Events.Errors.Publish(tenant, ev)
}

// ReportConfigError publishes a config error to the watchers of tenant (the
// tenant of the admin whose RefreshConfig met it).
func (r *Reconciler) ReportConfigError(tenant string, err error) {
	r.reportError(tenant, "", "", nstancev1.ErrorSource_ERROR_SOURCE_CONFIG, err)
}

// ReportInstanceError publishes a problem with what an instance's template
// and vars produce (e.g. files above shard.limits.max_file_bytes) to the
// watchers of its tenant, as a config error.
func (r *Reconciler) ReportInstanceError(tenant, group, inst string, err error) {
	r.reportError(tenant, group, inst, nstancev1.ErrorSource_ERROR_SOURCE_CONFIG, err)
}

// GroupStatus returns the wire status of a group with its observed instances.
func (r *Reconciler) GroupStatus(g *groups.Group) *nstancev1.GroupStatus {
	var ids []string
	ready, upToDate := 0, 0
	now := r.o.Now()
	eff, effErr := groups.Resolve(r.cfg(), &g.Spec, groups.Overrides{})
	for _, rec := range r.o.Instances.ListGroup(g.Tenant, g.ID) {
		if rec.OnDemand || !rec.State.Active() {
			continue
		}
		ids = append(ids, rec.ProviderID)
		if r.ready(rec, now) {
			ready++
		}
		if effErr == nil && !planner.Drifted(rec, eff) {
			upToDate++
		}
	}
	sort.Strings(ids)
	return &nstancev1.GroupStatus{
		Spec: g.SpecProto(), ActualSize: uint32(len(ids)), ReadyCount: uint32(ready), UpToDateCount: uint32(upToDate), ProviderIds: ids,
		Static: g.Static, Etag: g.ETag, UpdatedAt: timestamppb.New(g.UpdatedAt), Shard: r.o.Shard,
		UserDataSha256: g.Spec.UserDataSHA256,
	}
}

func statusSignature(st *nstancev1.GroupStatus) string {
	return fmt.Sprintf("%s|%d|%d|%d|%s", st.Etag, st.ActualSize, st.ReadyCount, st.UpToDateCount, strings.Join(st.ProviderIds, ","))
}

// publishGroup sends an UPSERT when the group's status changed since the
// last one sent (always when force).
func (r *Reconciler) publishGroup(g *groups.Group, force bool) {
	st := r.GroupStatus(g)
	sig := statusSignature(st)
	same := false
	if tm := r.curTerm(); tm != nil {
		tm.statusMu.Lock()
		same = tm.lastStatus[g.Key()] == sig
		tm.lastStatus[g.Key()] = sig
		tm.statusMu.Unlock()
	}
	if same && !force {
		return
	}
	r.o.Events.Groups.Publish(g.Tenant, &nstancev1.GroupEvent{
		Type: nstancev1.GroupEventType_GROUP_EVENT_TYPE_UPSERT, GroupId: g.ID, Group: st,
		OccurredAt: timestamppb.New(r.o.Now()), Shard: r.o.Shard,
	})
}
