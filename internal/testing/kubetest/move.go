package kubetest

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The two halves of a simulated `clusterctl move` in one API server: the
// objects leave the source (MoveAway) and arrive at the target (MoveIn).
// objs are in clusterctl's order, owners first.

// serverSet is the metadata the API server sets, which a move does not carry.
var serverSet = []string{"uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "deletionTimestamp", "deletionGracePeriodSeconds"}

// MoveAway deletes objs in reverse order, each with its finalizers removed
// first (as clusterctl does on the source), and waits up to timeout for
// each to be gone.
func MoveAway(ctx context.Context, c client.Client, objs []*unstructured.Unstructured, timeout time.Duration) error {
	for i := len(objs) - 1; i >= 0; i-- {
		o := objs[i].DeepCopy()
		what := fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
		if len(o.GetFinalizers()) > 0 {
			if err := c.Patch(ctx, o, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
				return fmt.Errorf("removing the finalizers of %s: %w", what, err)
			}
		}
		if err := client.IgnoreNotFound(c.Delete(ctx, o)); err != nil {
			return fmt.Errorf("deleting %s: %w", what, err)
		}
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
			cur := &unstructured.Unstructured{}
			cur.SetGroupVersionKind(o.GroupVersionKind())
			err := c.Get(ctx, client.ObjectKeyFromObject(o), cur)
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		})
		if err != nil {
			return fmt.Errorf("waiting for %s to be deleted: %w", what, err)
		}
	}
	return nil
}

// MoveIn creates objs in order without status and server-set metadata,
// with owner references rewritten to the owners' new UIDs. An object the
// target already has is updated instead (clusterctl move updates it), when
// updateExisting; otherwise that is an error.
func MoveIn(ctx context.Context, c client.Client, objs []*unstructured.Unstructured, updateExisting bool) error {
	newUID := map[types.UID]types.UID{}
	for _, src := range objs {
		o := src.DeepCopy()
		unstructured.RemoveNestedField(o.Object, "status")
		for _, f := range serverSet {
			unstructured.RemoveNestedField(o.Object, "metadata", f)
		}
		refs := o.GetOwnerReferences()
		for i := range refs {
			if u, ok := newUID[refs[i].UID]; ok {
				refs[i].UID = u
			}
		}
		o.SetOwnerReferences(refs)
		err := c.Create(ctx, o)
		if apierrors.IsAlreadyExists(err) && updateExisting {
			cur := &unstructured.Unstructured{}
			cur.SetGroupVersionKind(o.GroupVersionKind())
			if err = c.Get(ctx, client.ObjectKeyFromObject(o), cur); err == nil {
				o.SetResourceVersion(cur.GetResourceVersion())
				o.SetUID(cur.GetUID())
				err = c.Update(ctx, o)
			}
		}
		if err != nil {
			return fmt.Errorf("moving %s %s/%s in: %w", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
		newUID[src.GetUID()] = o.GetUID()
	}
	return nil
}
