package drain

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/patch"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/workload"
)

// emit records an Event about the Node (in the workload cluster wl) and the
// NstanceMachine (in the operator's cluster); either may be nil.
func (c *Coordinator) emit(wl *workload.Cluster, node *corev1.Node, machine *infrav1.NstanceMachine, typ, reason, format string, args ...any) {
	if node != nil && wl != nil && wl.Recorder != nil {
		wl.Recorder.Eventf(node, typ, reason, format, args...)
	}
	if machine != nil && c.Recorder != nil {
		c.Recorder.Eventf(machine, nil, typ, reason, "Drain", format, args...)
	}
}

func (c *Coordinator) setCondition(ctx context.Context, m *infrav1.NstanceMachine, st metav1.ConditionStatus, reason, msg string) {
	if m == nil {
		return
	}
	// The patch helper writes only a change, and only this condition.
	helper, err := patch.NewHelper(m, c.Client)
	if err != nil {
		c.Log.Error(err, "set Drained condition", "nstanceMachine", m.Name)
		return
	}
	conditions.Set(m, metav1.Condition{Type: ConditionDrained, Status: st, Reason: reason, Message: msg})
	if err := helper.Patch(ctx, m, patch.WithOwnedConditions{Conditions: []string{ConditionDrained}}); err != nil && !apierrors.IsNotFound(err) {
		c.Log.Error(err, "set Drained condition", "nstanceMachine", m.Name)
	}
}
