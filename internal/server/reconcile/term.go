package reconcile

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/client-go/util/workqueue"

	"github.com/nstance-dev/nstance/internal/server/agentlive"
	"github.com/nstance-dev/nstance/internal/server/groups"
)

// Agents is what a leadership term gives the reconciler of its agents.
type Agents struct {
	// Live is the term's live table of agents (nil: no Agent service).
	// With Options.MonitorAgents the reconciler reads readiness from it and
	// holds its change subscription; it forgets deleted instances in it.
	Live *agentlive.Table
	// Files reaches the term's Agent service (nil: none).
	Files Files
}

// Files is the part of the Agent service the reconciler calls.
type Files interface {
	// Notify re-plans the files of the given instances (all when none).
	Notify(instanceIDs ...string)
	// Forget drops what is held for a deleted instance.
	Forget(instanceID string)
}

// term is one leadership term of the reconciler: built by begin, dropped by
// end. Nothing in it outlives the term, so the next one starts empty.
//
// Its locks guard what goroutines other than the term's own loop touch
// (workers, API handlers, agent streams): statusMu the last group status
// published per group (so workers and API handlers publish a change once),
// healthMu the health pass's memory (written by the pass and by workers
// forgetting deleted instances). orphans and lastGC need no lock: only
// the term's loop touches them.
type term struct {
	queue workqueue.TypedRateLimitingInterface[item]
	start time.Time
	// health is Agents.Live when health is monitored, else nil.
	health *agentlive.Table
	live   *agentlive.Table
	files  Files

	loaded   chan struct{} // reads are served (from the cache or storage)
	verified chan struct{} // the index equals storage; the reconciler acts
	done     chan struct{} // Run returned

	statusMu   sync.Mutex
	lastStatus map[groups.Key]string

	healthMu sync.Mutex
	wasReady map[string]bool // readiness seen by the last health pass
	checked  map[string]int  // missed reports already checked with the provider

	orphans map[string]time.Time // provider instances without a record: first seen
	// lb is the term's memory of load balancer calls (retries, reconciled entries).
	lb *lbMemory
	// lastGC is when garbage was last collected (zero: not yet this term).
	lastGC time.Time
	// probes paces the provider checks that follow a sign of a VM going
	// away (vanishing): a network blip that drops every agent's stream at
	// once must not turn into a storm of provider calls for as long as
	// the agents stay away.
	probes *rate.Limiter
}

// Pace of the provider checks after vanishing signs (the first check of
// each sign is not limited: it is what finds a killed VM at once).
const (
	probeRate  = 20 // per second
	probeBurst = 200
)

// newTerm builds a term with the agents given and a fresh queue. With
// health monitored, the one change subscription of the live table feeds
// the queue: an instance's first report of the term, a new agent version,
// a termination notice, a reported host shutdown and a lost connection wake
// the instance (and through it its group): the instance's reconcile asks
// the provider at once.
func (r *Reconciler) newTerm(agents Agents) *term {
	tm := &term{
		queue: r.newQueue(), start: r.o.Now(), live: agents.Live, files: agents.Files,
		loaded: make(chan struct{}), verified: make(chan struct{}), done: make(chan struct{}),
		lastStatus: map[groups.Key]string{}, wasReady: map[string]bool{}, checked: map[string]int{},
		orphans: map[string]time.Time{}, lb: newLBMemory(), probes: rate.NewLimiter(probeRate, probeBurst),
	}
	if r.o.MonitorAgents && agents.Live != nil {
		tm.health = agents.Live
		q := tm.queue
		tm.health.Subscribe(func(c agentlive.Change) { q.Add(item{kind: kindInst, id: c.InstanceID}) })
	}
	return tm
}

func (r *Reconciler) curTerm() *term {
	r.termMu.Lock()
	defer r.termMu.Unlock()
	return r.cur
}

// termOrEnded returns the running term, or whether one ran and ended.
func (r *Reconciler) termOrEnded() (*term, bool) {
	r.termMu.Lock()
	defer r.termMu.Unlock()
	return r.cur, r.ended != nil
}

// monitored is the running term's live table when health is monitored.
func (r *Reconciler) monitored() *agentlive.Table {
	if tm := r.curTerm(); tm != nil {
		return tm.health
	}
	return nil
}

// QueueLen is the number of keys waiting in the running term's queue (0
// between terms).
func (r *Reconciler) QueueLen() int {
	if tm := r.curTerm(); tm != nil {
		return tm.queue.Len()
	}
	return 0
}
