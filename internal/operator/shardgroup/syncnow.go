package shardgroup

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/controller-runtime/pkg/log"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/userdata"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// sent is what was last sent to a shard for one group: the generation of
// the shard group whose spec it was. Its lock serialises the upserts of the
// group on the shard.
type sent struct {
	mu  sync.Mutex
	uid types.UID
	gen int64
}

// sentGuard is the generation guard: a spec is never sent after one of a
// newer generation of the same shard group (the UID tells a re-created one).
type sentGuard struct {
	m sync.Map // shard + "/" + group -> *sent
}

// lock locks the entry of sg's group on its shard; the caller unlocks it.
func (s *sentGuard) lock(sg *infrav1.NstanceShardGroup) *sent {
	v, _ := s.m.LoadOrStore(sg.Spec.Shard+"/"+sg.Spec.Group, &sent{})
	e := v.(*sent)
	e.mu.Lock()
	return e
}

// forget drops the entry of a deleted shard group.
func (s *sentGuard) forget(sg *infrav1.NstanceShardGroup) {
	s.m.Delete(sg.Spec.Shard + "/" + sg.Spec.Group)
}

// outdated reports whether a copy of generation gen of the shard group uid
// is older than the one whose spec was last sent (held: e is locked).
func (e *sent) outdated(uid types.UID, gen int64) bool {
	return e.uid == uid && gen < e.gen
}

// record notes that generation gen of uid was sent (held: e is locked).
func (e *sent) record(uid types.UID, gen int64) {
	if e.uid != uid || gen > e.gen {
		e.uid, e.gen = uid, gen
	}
}

// SyncNow sends sg's group spec to its shard at once. The pool reconciler
// calls it with the shard group it has just written (the API server's
// answer), so a replica edit reaches the server without waiting for the
// shard group's watch event and a pass of this controller: two queue hops
// and a read less on the path from a MachinePool edit to UpsertGroup.
//
// Only the plain case is handled here: a known, healthy shard, readable
// bootstrap data and a server that accepts the spec. Anything else is left
// to Reconcile, which the write brings anyway and which also writes the
// status and the Events. Upserts of a group on a shard are serialised with
// Reconcile's, and neither sends the spec of an older generation of the
// shard group than one already sent, so a pass over a lagging cached copy
// never undoes a newer size.
func (r *Reconciler) SyncNow(ctx context.Context, sg *infrav1.NstanceShardGroup) {
	shard := sg.Spec.Shard
	if !sg.DeletionTimestamp.IsZero() || annotations.HasPaused(sg) || !r.Conns.Known(shard) || !r.Conns.Healthy(shard) {
		return
	}
	c, err := r.Conns.Client(shard)
	if err != nil {
		return
	}
	reader := r.Reader
	if reader == nil {
		reader = r.Client
	}
	data, err := userdata.Read(ctx, reader, sg.Namespace, sg.Spec.BootstrapDataSecretName)
	if err != nil {
		return
	}
	desired := DesiredSpec(sg, data)
	e := r.sent.lock(sg)
	defer e.mu.Unlock()
	if e.outdated(sg.UID, sg.Generation) {
		return
	}
	if current, ok := r.Groups.Get(shard, sg.Spec.Group); ok && SpecMatches(desired, current) {
		return
	}
	cctx, cancel := r.callCtx(ctx)
	start := time.Now()
	resp, err := c.UpsertGroup(cctx, &nstancev1.UpsertGroupRequest{Group: desired})
	cancel()
	r.Metrics.ObserveSync(shard, "upsert", time.Since(start), err)
	if err != nil {
		log.FromContext(ctx).V(1).Info("direct UpsertGroup failed; the shard group's reconcile retries", "shardGroup", sg.Name, "error", err.Error())
		return
	}
	r.Groups.PutResponse(shard, resp.GetGroup())
	e.record(sg.UID, sg.Generation)
}
