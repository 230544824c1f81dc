package machinepool

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/webhook"
)

// poolRollout is one pass's rollout decision for a pool.
type poolRollout struct {
	plan   RolloutPlan
	paused bool
	// prevRolling is the shard that held the budget before this pass.
	prevRolling string
}

// static reports a pool imported from a shard's config file: the server
// owns its groups, so no rollout budget is sent for them.
func static(pool *infrav1.NstanceMachinePool) bool {
	return pool.Annotations[webhook.StaticAnnotation] == "true"
}

// planRollout reads the pool's shard groups and applies PlanRollout: a
// shard's counts are known when its server confirmed the infra settings the
// pool asks for now (status.observedInfra), with secret as the bootstrap
// data Secret; sizes are the sizes this pass gives the shards.
func (r *Reconciler) planRollout(ctx context.Context, pool *infrav1.NstanceMachinePool, sizes map[string]int32, secret string, desired int32) (*poolRollout, error) {
	sgs, err := r.shardGroups(ctx, pool)
	if err != nil {
		return nil, err
	}
	want := (&infrav1.NstanceShardGroupSpec{
		Template: pool.Spec.Template, InstanceType: pool.Spec.InstanceType, SubnetPool: pool.Spec.SubnetPool,
		Image: pool.Spec.Image, BootstrapDataSecretName: secret,
	}).InfraDigest()
	byShard := make(map[string]*infrav1.NstanceShardGroup, len(sgs))
	for i := range sgs {
		if sgs[i].DeletionTimestamp.IsZero() {
			byShard[sgs[i].Spec.Shard] = &sgs[i]
		}
	}
	out := &poolRollout{}
	states := make([]ShardState, 0, len(pool.Spec.Shards))
	for _, shard := range pool.Spec.Shards {
		st := ShardState{Shard: shard, Size: sizes[shard]}
		switch sg := byShard[shard]; {
		case sg == nil:
			// A shard group yet to be created has no members to roll.
			st.Known = true
		case sg.Status.ObservedInfra == "" && sg.Status.Replicas == 0:
			// Nor has one the server has not answered for yet.
			st.Known = true
			st.Budget = sg.Spec.Rollout != nil && sg.Spec.Rollout.MaxSurge != nil
		default:
			st.Known = sg.Status.ObservedInfra == want
			st.Replicas, st.UpToDate = sg.Status.Replicas, sg.Status.UpToDateReplicas
			st.Budget = sg.Spec.Rollout != nil && sg.Spec.Rollout.MaxSurge != nil
			if st.Budget && out.prevRolling == "" {
				out.prevRolling = shard
			}
		}
		states = append(states, st)
	}
	surge, unavailable, paused, err := RolloutBounds(pool.Spec.Strategy, desired)
	if err != nil {
		return nil, err
	}
	out.plan, out.paused = PlanRollout(states, surge, unavailable, paused), paused
	return out, nil
}

// reportRollout writes status.upToDateReplicas and the RollingOut
// condition, and records the Events of the change.
func (r *Reconciler) reportRollout(pool *infrav1.NstanceMachinePool, ro *poolRollout, replicas int32) {
	prevReason := ""
	if c := conditions.Get(pool, infrav1.RollingOutCondition); c != nil {
		prevReason = c.Reason
	}
	rolling, reason, msg := RolloutStatus(ro.plan, replicas, ro.paused)
	pool.Status.UpToDateReplicas = ro.plan.UpToDate
	setCond(pool, infrav1.RollingOutCondition, rolling, reason, msg)
	if r.Recorder == nil {
		return
	}
	for _, ev := range RolloutEvents(prevReason, ro.prevRolling, ro.plan, reason, msg) {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeNormal, ev.Reason, "Rollout", "%s", ev.Message)
	}
}
