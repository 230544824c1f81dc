// Package rollguard keeps cluster-autoscaler from resizing a pool while it
// rolls out: while the NstanceMachinePool's RollingOut condition is True,
// every Node of the pool carries cluster-autoscaler's
// cluster-autoscaler.kubernetes.io/scale-down-disabled annotation, which the
// operator sets only where the Node had none and removes (with its own
// nstance.dev/scale-down-disabled record) when the rollout ends. Plan
// decides per Node; the Reconciler patches the workload Nodes.
package rollguard
