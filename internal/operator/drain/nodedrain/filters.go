package nodedrain

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Action is what a drain does with one pod.
type Action int

const (
	// Continue is a filter's "no opinion": the next filter decides, and
	// a pod no filter decides about is evicted.
	Continue Action = iota
	// Evict: the pod is evicted and holds the Node until it is gone.
	Evict
	// Wait: the pod is already terminating; it is not evicted again but
	// holds the Node until it is gone.
	Wait
	// Skip: the drain leaves the pod alone and does not wait for it.
	Skip
	// Fail: the filter could not decide (a lookup failed). The pod holds
	// the Node and the pass reports the error; the next pass asks again.
	Fail
)

func (a Action) String() string {
	switch a {
	case Continue:
		return "Continue"
	case Evict:
		return "Evict"
	case Wait:
		return "Wait"
	case Skip:
		return "Skip"
	case Fail:
		return "Fail"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Decision is a filter's verdict on one pod.
type Decision struct {
	Action Action
	// Reason says why, for logs and tests.
	Reason string
	// Err is set with Fail.
	Err error
}

// Filter decides about one pod, or returns Continue to let the next one
// decide.
type Filter func(ctx context.Context, p *corev1.Pod) Decision

// Decide runs filters in order; the first that does not Continue decides.
// A pod no filter decides about is evicted.
func Decide(ctx context.Context, p *corev1.Pod, filters []Filter) Decision {
	for _, f := range filters {
		if d := f(ctx, p); d.Action != Continue {
			return d
		}
	}
	return Decision{Action: Evict, Reason: "no rule keeps it"}
}

// MirrorPods leaves mirror (static) pods alone: the kubelet owns them and
// the API server refuses to evict them.
func MirrorPods(_ context.Context, p *corev1.Pod) Decision {
	if _, ok := p.Annotations[corev1.MirrorPodAnnotationKey]; ok {
		return Decision{Action: Skip, Reason: "mirror pod"}
	}
	return Decision{}
}

// FinishedPods leaves pods that succeeded or failed alone: they hold no
// workload any more.
func FinishedPods(_ context.Context, p *corev1.Pod) Decision {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return Decision{Action: Skip, Reason: "finished (" + string(p.Status.Phase) + ")"}
	}
	return Decision{}
}

// TerminatingPods waits for pods already being deleted (by an earlier
// eviction or by someone else) instead of evicting them again.
func TerminatingPods(_ context.Context, p *corev1.Pod) Decision {
	if p.DeletionTimestamp != nil {
		return Decision{Action: Wait, Reason: "already terminating"}
	}
	return Decision{}
}

// DaemonSets decides about pods controlled by a DaemonSet: those of a
// DaemonSet that exists are left alone (its controller would put them
// back, as `kubectl drain --ignore-daemonsets` does); those of a DaemonSet
// that is gone are left to the next filters, like any unmanaged pod. Each
// DaemonSet is looked up once; use one DaemonSets per pass. It is not safe
// for concurrent use.
type DaemonSets struct {
	reader client.Reader
	exists map[types.NamespacedName]bool
}

// NewDaemonSets looks DaemonSets up through r.
func NewDaemonSets(r client.Reader) *DaemonSets {
	return &DaemonSets{reader: r, exists: map[types.NamespacedName]bool{}}
}

// Filter is the DaemonSet rule as a Filter. A DaemonSet that cannot be
// looked up fails the pod (kubectl refuses to go on as well).
func (d *DaemonSets) Filter(ctx context.Context, p *corev1.Pod) Decision {
	ref := metav1.GetControllerOf(p)
	if ref == nil || ref.Kind != "DaemonSet" {
		return Decision{}
	}
	key := types.NamespacedName{Namespace: p.Namespace, Name: ref.Name}
	exists, ok := d.exists[key]
	if !ok {
		err := d.reader.Get(ctx, key, &appsv1.DaemonSet{})
		switch {
		case err == nil:
			exists = true
		case apierrors.IsNotFound(err):
			exists = false
		default:
			return Decision{Action: Fail, Reason: "DaemonSet lookup failed", Err: fmt.Errorf("look up DaemonSet %s of pod %s: %w", key, p.Name, err)}
		}
		d.exists[key] = exists
	}
	if exists {
		return Decision{Action: Skip, Reason: "DaemonSet pod"}
	}
	return Decision{}
}
