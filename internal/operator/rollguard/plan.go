package rollguard

// ScaleDownDisabledAnnotation is cluster-autoscaler's per-Node opt-out: it
// never chooses a Node carrying it with the value "true" for scale-down.
const ScaleDownDisabledAnnotation = "cluster-autoscaler.kubernetes.io/scale-down-disabled"

// OwnedAnnotation records that the operator set ScaleDownDisabledAnnotation
// on the Node, so it removes only its own, never a user's.
const OwnedAnnotation = "nstance.dev/scale-down-disabled"

// HeldAnnotation on a pool records that its Nodes may carry the operator's
// guard: set before the first Node is guarded, removed after a release pass
// that read every Node from the API server. Without it a release pass on a
// cache that has not yet seen the latest guard would leave that guard on.
const HeldAnnotation = "nstance.dev/scale-down-guard"

// Node is what Plan reads of a Node's annotations.
type Node struct {
	Name string
	// Disabled is ScaleDownDisabledAnnotation's value, "" when absent;
	// HasDisabled says whether it is present at all.
	Disabled    string
	HasDisabled bool
	// Owned: the operator's record is there.
	Owned bool
}

// Action on one Node.
type Action int

const (
	// Keep leaves the Node alone.
	Keep Action = iota
	// Disable sets ScaleDownDisabledAnnotation "true" and OwnedAnnotation.
	Disable
	// Release removes OwnedAnnotation and, when it is still the operator's
	// "true", ScaleDownDisabledAnnotation.
	Release
)

// Plan decides what a pool's Node needs. While rolling, a Node without the
// autoscaler's annotation gets it (a user's own, whatever its value, is left
// as it is); otherwise the operator's record goes, taking the annotation with
// it unless someone changed its value since.
func Plan(rolling bool, n Node) Action {
	switch {
	case rolling && !n.HasDisabled && !n.Owned:
		return Disable
	case !rolling && n.Owned:
		return Release
	}
	return Keep
}

// PoolStep is what a pass over a pool's Nodes does besides each Node's
// Action: the pool's HeldAnnotation record around them.
type PoolStep struct {
	// Hold records HeldAnnotation before the first Node is guarded (a crash
	// between the two leaves a record and no guard, never the reverse).
	Hold bool
	// ReadLive reads every Node from the API server instead of the cache:
	// the cache may not yet show a guard written moments ago.
	ReadLive bool
	// Unhold drops the record after a pass without errors.
	Unhold bool
}

// PlanPool decides a pass's PoolStep: held is whether the pool carries
// HeldAnnotation, disables whether any of its Nodes is to be guarded now.
func PlanPool(rolling, held, disables bool) PoolStep {
	switch {
	case rolling && !held && disables:
		return PoolStep{Hold: true}
	case !rolling && held:
		return PoolStep{ReadLive: true, Unhold: true}
	}
	return PoolStep{}
}
