package v1beta1

// MachinePool Machines (the Cluster API MachinePool Machines contract): an
// NstanceMachinePool reports status.infrastructureMachineKind NstanceMachine
// and keeps one NstanceMachine per instance of its group, so core CAPI
// creates a Machine for each. Such an NstanceMachine mirrors an instance the
// group already has; it never creates one.
const (
	// PoolMachineKind is the pool's status.infrastructureMachineKind.
	PoolMachineKind = "NstanceMachine"

	// PoolInstanceAnnotation is set on an NstanceMachine that mirrors an
	// instance of a pool's group; its value is the instance ID, and
	// spec.shard names the instance's shard. Set when the object is created
	// and never changed.
	PoolInstanceAnnotation = "nstance.dev/pool-instance"

	// ReleasedAnnotationPrefix, followed by the UID of a deleting pool
	// NstanceMachine, is written on the MachinePool in the same patch that
	// lowers its spec.replicas for that instance, so the decrement happens
	// once however often the deletion is retried. Its value is the instance
	// ID. It is removed once the instance is gone.
	ReleasedAnnotationPrefix = "released.nstance.dev/"
)

// PoolInstanceID returns the instance an NstanceMachine mirrors, or "" for
// an NstanceMachine that creates its own instance.
func PoolInstanceID(m *NstanceMachine) string {
	return m.Annotations[PoolInstanceAnnotation]
}
