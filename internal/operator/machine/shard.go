package machine

import (
	"fmt"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

// ReasonShardMismatch: spec.shard and the owning Machine's
// spec.failureDomain name different shards, so no instance is created.
const ReasonShardMismatch = "ShardMismatch"

// placement is the shard an NstanceMachine's instance is created in, or
// why none can be chosen yet (reason and message for its conditions).
type placement struct {
	shard, reason, message string
}

// chooseShard decides where a new instance goes. The owning Machine's
// spec.failureDomain wins: it is how Cluster API spreads Machines over the
// NstanceCluster's failure domains, which are the shards. spec.shard may
// repeat it, but a different value is a conflict reported as
// ShardMismatch rather than an instance silently placed in one of the two.
// Without a failure domain spec.shard decides, then defaultShard. A
// Cluster API-managed NstanceMachine (cluster-name label) waits for its
// Machine, which carries the failure domain, unless it names its shard and
// was not cloned from a template: the operator's own on-demand machines
// carry their shard and are placed before core CAPI adopts them, while a
// MachineSet creates the NstanceMachine from its template before the
// Machine that owns it, so deciding early could miss a mismatch.
func chooseShard(nm *infrav1.NstanceMachine, machine *clusterv1.Machine, defaultShard string) placement {
	if machine != nil && machine.Spec.FailureDomain != "" {
		fd := machine.Spec.FailureDomain
		if nm.Spec.Shard != "" && nm.Spec.Shard != fd {
			return placement{reason: ReasonShardMismatch, message: fmt.Sprintf(
				"spec.shard %q differs from the failureDomain %q of Machine %s; set one of them, or both to the same shard",
				nm.Spec.Shard, fd, machine.Name)}
		}
		return placement{shard: fd}
	}
	if machine == nil {
		_, managed := nm.Labels[clusterv1.ClusterNameLabel]
		_, cloned := nm.Annotations[clusterv1.TemplateClonedFromNameAnnotation]
		if managed && (nm.Spec.Shard == "" || cloned) {
			return placement{reason: ReasonWaitingForMachine, message: "waiting for the owning Machine"}
		}
	}
	if nm.Spec.Shard != "" {
		return placement{shard: nm.Spec.Shard}
	}
	return placement{shard: defaultShard}
}
