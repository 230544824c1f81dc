package strategy

import (
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nstance-dev/nstance/internal/devk8s/object"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
)

// PodDisruptionBudgets are policy/v1 PodDisruptionBudgets, whose status
// Sync computes as the disruption controller does.
type PodDisruptionBudgets struct{ Generic }

// Resource is the registry entry.
func (PodDisruptionBudgets) Resource() registry.Resource {
	return registry.Resource{Group: "policy", Version: "v1", Resource: "poddisruptionbudgets", Kind: "PodDisruptionBudget", Namespaced: true, ShortNames: []string{"pdb"}, Status: true, Generation: true, BuiltIn: true, Storage: true}
}

// PrepareForCreate starts the status at zero.
func (PodDisruptionBudgets) PrepareForCreate(_ *registry.Resource, obj map[string]any) {
	obj["status"] = map[string]any{"disruptionsAllowed": int64(0), "currentHealthy": int64(0), "desiredHealthy": int64(0), "expectedPods": int64(0)}
}

// Columns are kubectl's PodDisruptionBudget columns.
func (PodDisruptionBudgets) Columns() []Column {
	return withNameAge(
		pathCol("Min Available", "string", 0, "spec", "minAvailable"),
		pathCol("Max Unavailable", "string", 0, "spec", "maxUnavailable"),
		pathCol("Allowed Disruptions", "integer", 0, "status", "disruptionsAllowed"),
	)
}

// Wakes: the status follows on the next pass.
func (PodDisruptionBudgets) Wakes(store.Event) bool { return false }

// Sync computes PodDisruptionBudget status as the disruption controller
// does, from the Ready condition of the selected pods.
func (PodDisruptionBudgets) Sync(c Cluster, pdbRes *registry.Resource) {
	podRes, ok := c.Lookup(schema.GroupVersionResource{Version: "v1", Resource: "pods"})
	if !ok {
		return
	}
	for _, e := range c.List(pdbRes, "") {
		var pdb policyv1.PodDisruptionBudget
		if err := object.ToTyped(e.Object, &pdb); err != nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil {
			continue
		}
		expected, healthy := int32(0), int32(0)
		alive := map[string]bool{}
		for _, pe := range c.List(podRes, pdb.Namespace) {
			var pod corev1.Pod
			if err := object.ToTyped(pe.Object, &pod); err != nil || !sel.Matches(labels.Set(pod.Labels)) {
				continue
			}
			if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
				continue
			}
			alive[pod.Name] = true
			expected++
			if _, disrupted := pdb.Status.DisruptedPods[pod.Name]; PodReady(&pod) && !disrupted {
				healthy++
			}
		}
		desired := expected
		switch {
		case pdb.Spec.MinAvailable != nil:
			v, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MinAvailable, int(expected), true)
			if err == nil {
				desired = int32(v)
			}
		case pdb.Spec.MaxUnavailable != nil:
			v, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MaxUnavailable, int(expected), true)
			if err == nil {
				desired = expected - int32(v)
			}
		}
		allowed := healthy - desired
		if allowed < 0 {
			allowed = 0
		}
		st := pdb.Status.DeepCopy()
		for p := range st.DisruptedPods {
			if !alive[p] {
				delete(st.DisruptedPods, p)
			}
		}
		if len(st.DisruptedPods) == 0 {
			st.DisruptedPods = nil
		}
		st.ObservedGeneration, st.ExpectedPods, st.CurrentHealthy, st.DesiredHealthy, st.DisruptionsAllowed = pdb.Generation, expected, healthy, desired, allowed
		cond := metav1.Condition{Type: policyv1.DisruptionAllowedCondition, Status: metav1.ConditionTrue, Reason: policyv1.SufficientPodsReason, ObservedGeneration: pdb.Generation}
		if allowed == 0 {
			cond.Status, cond.Reason = metav1.ConditionFalse, policyv1.InsufficientPodsReason
		}
		meta.SetStatusCondition(&st.Conditions, cond)
		out, err := runtime.DefaultUnstructuredConverter.ToUnstructured(st)
		if err != nil {
			continue
		}
		err = c.Mutate(pdbRes, pdb.Namespace, pdb.Name, func(cur map[string]any) (store.Mutation, error) {
			if cur == nil {
				return store.Mutation{}, apierrors.NewNotFound(pdbRes.GroupResource(), pdb.Name)
			}
			cur["status"] = out
			return store.Mutation{Object: cur}, nil
		})
		c.LogErr(err, "update PodDisruptionBudget status")
	}
}
