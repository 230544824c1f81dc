package v1beta1

import (
	"crypto/sha256"
	"encoding/hex"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// RollingOutCondition is True on an NstanceMachinePool while some shard has
// members that are not up to date (created with other infra settings than
// the pool asks for now: image, template, instance type, subnet pool,
// bootstrap data); its message tells the progress. Whoever must not resize
// a pool mid-rollout (the cluster autoscaler) reads it.
const RollingOutCondition = "RollingOut"

// UpToDateCondition is True on the NstanceMachine of a pool instance while
// its instance matches its group's infra settings, False while a rollout
// still has to replace it. Core Cluster API marks every MachinePool Machine
// UpToDate itself, so this is where an outdated one shows.
const UpToDateCondition = "UpToDate"

// Reasons of RollingOut and UpToDate.
const (
	// RollingOutReason: shards have members that are not up to date and
	// one of them is being replaced.
	RollingOutReason = "RollingOut"
	// RolloutPausedReason: members are not up to date and spec.strategy.paused
	// holds the rollout.
	RolloutPausedReason = "RolloutPaused"
	// NotRollingOutReason: every member is up to date.
	NotRollingOutReason = "NotRollingOut"
	// UpToDateReason: the instance matches its group's infra settings.
	UpToDateReason = "UpToDate"
	// NotUpToDateReason: the instance was created with other infra settings
	// than its group now has.
	NotUpToDateReason = "NotUpToDate"
)

// Defaults of spec.strategy.rollingUpdate, as for a Cluster API
// MachineDeployment.
var (
	DefaultMaxSurge       = intstr.FromInt32(1)
	DefaultMaxUnavailable = intstr.FromInt32(0)
)

// MachinePoolStrategy says how a pool replaces members whose infra settings
// changed (image, template, instance type, subnet pool, bootstrap data).
type MachinePoolStrategy struct {
	// rollingUpdate bounds the replacement, counted over all of the pool's
	// shards. Unset: maxSurge 1, maxUnavailable 0.
	// +optional
	RollingUpdate *MachineRollingUpdate `json:"rollingUpdate,omitempty"`

	// paused holds the rollout: members that are not up to date stay (and
	// count as replicas) until it is false again. Scaling, scale-down
	// victims and the replacement of unhealthy members go on. This is not
	// Cluster API's cluster.x-k8s.io/paused annotation, which stops every
	// sync of the pool.
	// +optional
	Paused bool `json:"paused,omitempty"`
}

// MachineRollingUpdate bounds a pool's rollout as a MachineDeployment's
// rolling update does, over all of the pool's shards.
// +kubebuilder:validation:XValidation:rule="!(has(self.maxSurge) && (self.maxSurge == 0 || self.maxSurge == '0%') && has(self.maxUnavailable) && (self.maxUnavailable == 0 || self.maxUnavailable == '0%'))",message="maxSurge and maxUnavailable must not both be 0"
type MachineRollingUpdate struct {
	// maxSurge is how many instances beyond the pool's replicas the rollout
	// may run, over all shards: a number, or a percentage of the replicas
	// rounded up. Unset: 1.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^[0-9]+%$')",message="want a number >= 0 or a percentage such as 25%"
	MaxSurge *intstr.IntOrString `json:"maxSurge,omitempty"`

	// maxUnavailable is how many replicas below the pool's replicas may be
	// unready while the rollout replaces them, over all shards: a number,
	// or a percentage of the replicas rounded down. Unset: 0.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^[0-9]+%$')",message="want a number >= 0 or a percentage such as 25%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
}

// ShardRollout is one shard's part of its pool's rollout budget, sent to the
// server as the group's rollout strategy.
type ShardRollout struct {
	// maxSurge is how many members beyond the size this shard may run while
	// it replaces members that are not up to date. Unset: the server's
	// shard.rotation_surge.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	MaxSurge *int32 `json:"maxSurge,omitempty"`

	// maxUnavailable is how many members below the size may be unready
	// while they are replaced.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	MaxUnavailable int32 `json:"maxUnavailable,omitempty"`

	// paused keeps this shard's members that are not up to date: the pool
	// gives its budget to another shard, or its rollout is paused.
	// +optional
	Paused bool `json:"paused,omitempty"`
}

// InfraDigest is a short digest of the settings whose change makes the
// shard group's members drift on the server (template, instanceType,
// subnetPool, image, bootstrapDataSecretName; vars are not among them: the
// server pushes them to running agents). status.observedInfra holds the one
// the server confirmed last.
func (s *NstanceShardGroupSpec) InfraDigest() string {
	h := sha256.New()
	for _, f := range []string{s.Template, s.InstanceType, s.SubnetPool, s.Image, s.BootstrapDataSecretName} {
		h.Write([]byte(f))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
