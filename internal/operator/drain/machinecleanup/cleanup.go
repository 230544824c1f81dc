package machinecleanup

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

// ReasonInstanceDeleted is the reason of the Event on the NstanceMachine.
const ReasonInstanceDeleted = "InstanceDeleted"

// Cleaner removes the objects of deleted instances from the operator's
// cluster.
type Cleaner struct {
	// Client deletes Machines and NstanceMachines and patches Machines.
	Client client.Client
	// Reader reads Machines uncached before marking them; nil means Client.
	Reader client.Reader
	// Recorder records the Event on the NstanceMachine (nil: none).
	Recorder events.EventRecorder
}

// Remove removes what stands for instance id on shard, whose NstanceMachine
// is m (nil: nothing to do). An NstanceMachine already being deleted is
// left to that deletion.
func (c *Cleaner) Remove(ctx context.Context, m *infrav1.NstanceMachine, shard, id string) error {
	if m == nil || !m.DeletionTimestamp.IsZero() {
		return nil
	}
	why := fmt.Sprintf("instance %s was deleted on shard %s", id, shard)
	if ref, ok := owningMachine(m); ok {
		key := client.ObjectKey{Namespace: m.Namespace, Name: ref.Name}
		ok, err := c.excludeFromCAPIDrain(ctx, key, ref.UID, why)
		if err != nil {
			return fmt.Errorf("mark Machine %s: %w", ref.Name, err)
		}
		if !ok {
			return nil
		}
		c.event(m, "%s; deleting Machine %s", why, ref.Name)
		machine := &clusterv1.Machine{}
		machine.Namespace, machine.Name = key.Namespace, key.Name
		if err := c.Client.Delete(ctx, machine, client.Preconditions{UID: &ref.UID}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete Machine %s: %w", ref.Name, err)
		}
		return nil
	}
	c.event(m, "%s; deleting NstanceMachine", why)
	if err := c.Client.Delete(ctx, m); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete NstanceMachine %s: %w", m.Name, err)
	}
	return nil
}

// ownerRef is the part of an owner reference Remove needs.
type ownerRef struct {
	Name string
	UID  types.UID
}

// owningMachine returns the first owner of m that is a Cluster API Machine.
func owningMachine(m *infrav1.NstanceMachine) (ownerRef, bool) {
	for _, ref := range m.OwnerReferences {
		if ref.Kind == "Machine" && strings.HasPrefix(ref.APIVersion, clusterv1.GroupVersion.Group+"/") {
			return ownerRef{Name: ref.Name, UID: ref.UID}, true
		}
	}
	return ownerRef{}, false
}

// excludeFromCAPIDrain sets core Cluster API's exclude-node-draining and
// exclude-wait-for-node-volume-detach annotations on the Machine with uid,
// whose VM is gone (drained before, or stopped). ok is false when that
// Machine no longer exists (another one may have taken its name).
func (c *Cleaner) excludeFromCAPIDrain(ctx context.Context, key client.ObjectKey, uid types.UID, why string) (bool, error) {
	// Read uncached: a Machine missing from a lagging cache must not be
	// taken for a deleted one.
	reader := c.Reader
	if reader == nil {
		reader = c.Client
	}
	var m clusterv1.Machine
	if err := reader.Get(ctx, key, &m); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, err
	}
	if m.UID != uid {
		return false, nil
	}
	_, drainExcluded := m.Annotations[clusterv1.ExcludeNodeDrainingAnnotation]
	_, detachExcluded := m.Annotations[clusterv1.ExcludeWaitForNodeVolumeDetachAnnotation]
	if drainExcluded && detachExcluded {
		return true, nil
	}
	patch := client.MergeFromWithOptions(m.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[clusterv1.ExcludeNodeDrainingAnnotation] = why
	m.Annotations[clusterv1.ExcludeWaitForNodeVolumeDetachAnnotation] = why
	if err := c.Client.Patch(ctx, &m, patch); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

func (c *Cleaner) event(m *infrav1.NstanceMachine, format string, args ...any) {
	if c.Recorder != nil {
		c.Recorder.Eventf(m, nil, corev1.EventTypeNormal, ReasonInstanceDeleted, "Drain", format, args...)
	}
}
