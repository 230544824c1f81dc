package app

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
	"github.com/nstance-dev/nstance/internal/server/leaderaddr"
)

// leading is what a server needs to lead its shard, set up once in Run:
// the gRPC configuration (without the per-term Agent service), the
// assembly, the bind addresses, the shutdown grace and the leader address.
type leading struct {
	grpc     grpcserve.Config
	built    *Assembly
	bind     *config.Bind
	shutdown time.Duration
	addr     leaderaddr.Holder
}

// leaderTerm is everything this server runs for one shard lease. newTerm
// starts its parts in order; stop ends them in reverse, so a part never
// outlives what it uses and nothing of a term is left for the next one:
//
//  1. the revocation list is made current (nothing to stop);
//  2. the nonce sweep and
//  3. the reconciler with the term's Agent service and live table run as
//     one errgroup, each stopped on its own;
//  4. the leader address is held (released before waiting for the work:
//     a standby may take over as soon as the lease allows);
//  5. the gRPC servers serve (stopped first).
type leaderTerm struct {
	log   logr.Logger
	agent *Term
	grpc  *grpcserve.Servers
	jobs  *errgroup.Group
	// stops holds each started part's stop, in start order.
	stops []func()
}

// newTerm starts a term's parts; on an error it has stopped what it
// started and the server steps down.
func (a *App) newTerm(lctx, appCtx context.Context, n int64, l *leading) (_ *leaderTerm, err error) {
	t := &leaderTerm{log: a.log().WithValues("term", n)}
	var jobsCtx context.Context
	t.jobs, jobsCtx = errgroup.WithContext(lctx)
	defer func() {
		if err != nil {
			t.stop()
		}
	}()

	if err := a.loadRevocations(lctx); err != nil {
		return nil, fmt.Errorf("loading revocations on leadership: %w", err)
	}
	if t.agent, err = l.built.NewTerm(); err != nil {
		return nil, err
	}
	// The term's agents are reachable (metrics, Assembly.Term) from before
	// anything serves until everything has stopped, across restarts of the
	// reconciler.
	l.built.setTerm(t.agent)
	t.stops = append(t.stops, func() { l.built.clearTerm(t.agent) })
	t.run(jobsCtx, "nonce sweep", func(ctx context.Context) { a.sweepNonces(ctx, t.log) })
	t.run(jobsCtx, "reconciler", func(ctx context.Context) {
		leadUntilDone(ctx, t.log, func(ctx context.Context) error { return l.built.runTerm(ctx, t.agent) })
	})

	// The shard's fixed address is held before serving and given up when
	// the term ends (the elector ends lctx before the lease could pass to
	// a standby; a VIP's kernel lifetime also ends with the lease).
	t.stops = append(t.stops, func() { releaseLeaderAddress(l.addr, t.log) })
	if err := l.addr.Acquire(lctx); err != nil {
		return nil, fmt.Errorf("acquiring the leader address: %w", err)
	}

	ls, err := a.listenGRPC(l.bind)
	if err != nil {
		return nil, fmt.Errorf("binding gRPC listeners: %w", err)
	}
	gcfg := l.grpc
	gcfg.Gate, gcfg.Agent = a.revocations, t.agent.Agent
	if t.grpc, err = grpcserve.Start(gcfg, ls); err != nil {
		return nil, fmt.Errorf("starting gRPC servers: %w", err)
	}
	a.mu.Lock()
	a.servingSince = time.Now()
	a.mu.Unlock()
	t.stops = append(t.stops, func() {
		a.mu.Lock()
		a.servingSince = time.Time{}
		a.mu.Unlock()
		a.stopGRPC(t.grpc, appCtx, l.shutdown)
	})
	ad := a.Addrs()
	t.log.Info("serving gRPC as shard leader", "registration", ad.Registration, "operator", ad.Operator, "agent", ad.Agent)
	return t, nil
}

// run starts job as part of the term's errgroup, with a stop that ends
// it and waits for it.
func (t *leaderTerm) run(ctx context.Context, name string, job func(context.Context)) {
	jctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	t.jobs.Go(func() error {
		defer close(done)
		job(jctx)
		return nil
	})
	t.stops = append(t.stops, func() {
		cancel()
		<-done
		t.log.V(1).Info("term job stopped", "job", name)
	})
}

// stop ends the term's parts in reverse order and waits for its jobs.
func (t *leaderTerm) stop() {
	for i := len(t.stops) - 1; i >= 0; i-- {
		t.stops[i]()
	}
	t.stops = nil
	if t.jobs != nil {
		_ = t.jobs.Wait() // the jobs return no errors; all have stopped
	}
}

// leadUntilDone runs the term's work until ctx ends: it is restarted
// after an error, so a storage hiccup never leaves a leader that serves
// gRPC but does not converge.
func leadUntilDone(ctx context.Context, log logr.Logger, lead func(context.Context) error) {
	for {
		err := lead(ctx)
		if ctx.Err() != nil {
			return
		}
		log.Error(err, "shard leadership work stopped; restarting it")
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
	}
}

// stopGRPC stops the term's gRPC servers: at once when leadership was
// lost (another server may already serve), gracefully when the process
// shuts down while still leading, but never beyond the time this server
// may act.
func (a *App) stopGRPC(srv *grpcserve.Servers, appCtx context.Context, shutdown time.Duration) {
	if appCtx.Err() == nil {
		srv.Stop()
		return
	}
	grace := shutdown
	if st := (leaderFence{a: a}).elector().Status(); st.Leading {
		grace = min(grace, time.Until(st.ValidUntil))
	} else {
		grace = 0
	}
	srv.GracefulStop(max(grace, 0))
}

// leadShard runs while this server holds the shard lease: the standby's
// cache refresh stops (the term's record store writes the cache), the
// term starts, and it is stopped when lctx ends.
func (a *App) leadShard(lctx, appCtx context.Context, n int64, l *leading) {
	a.standby.stop()
	defer a.standby.start()
	t, err := a.newTerm(lctx, appCtx, n, l)
	if err != nil {
		a.log().WithValues("term", n).Error(err, "starting the leadership term; stepping down")
		return
	}
	a.mu.Lock()
	a.term = t
	a.mu.Unlock()
	<-lctx.Done()
	t.stop()
	a.mu.Lock()
	a.term = nil
	a.mu.Unlock()
	t.log.Info("stopped serving gRPC")
}

// standbyJob runs a job only while this server does not lead its shard
// (the cache refresh): stopped when a term starts, started again after it.
type standbyJob struct {
	parent context.Context
	job    func(context.Context)

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
	closed bool
}

func (j *standbyJob) start() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.cancel != nil || j.closed || j.parent.Err() != nil {
		return
	}
	ctx, cancel := context.WithCancel(j.parent)
	done := make(chan struct{})
	j.cancel, j.done = cancel, done
	go func() {
		defer close(done)
		j.job(ctx)
	}()
}

// close stops the job for good (the server stops).
func (j *standbyJob) close() {
	j.mu.Lock()
	j.closed = true
	j.mu.Unlock()
	j.stop()
}

func (j *standbyJob) stop() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.cancel == nil {
		return
	}
	j.cancel()
	<-j.done
	j.cancel, j.done = nil, nil
}
