package apiserver

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nstance-dev/nstance/internal/devk8s/object"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
	"github.com/nstance-dev/nstance/internal/devk8s/strategy"
)

// collector runs the background work that a real control plane does in
// kube-controller-manager and the kubelet: CRD cleanup always; with
// Options.Controllers also ownerReference garbage collection and the
// controllers the built-in strategies bring (namespace deletion, finishing
// graceful pod deletion, PodDisruptionBudget status, DaemonSet pods), in
// the order of strategy.Builtins.
func (s *Server) collector(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-s.gcKick:
			if !ok {
				return
			}
		case <-t.C:
		}
		s.collect()
	}
}

func (s *Server) collect() {
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	s.cleanupCRDs()
	if !s.opts.Controllers {
		return
	}
	s.collectGarbage()
	c := cluster{s}
	for _, ctl := range s.controllers {
		if res, ok := s.reg.Lookup(ctl.gvr); ok {
			ctl.Controller.Sync(c, res)
		}
	}
}

// controller is a built-in strategy's controller and its resource.
type controller struct {
	strategy.Controller
	gvr schema.GroupVersionResource
}

// controllerWakes reports a change some controller reacts to at once.
func (s *Server) controllerWakes(ev store.Event) bool {
	if !s.opts.Controllers {
		return false
	}
	for _, ctl := range s.controllers {
		if ctl.Wakes(ev) {
			return true
		}
	}
	return false
}

// cluster is the Server as the strategies' controllers see it: reads and
// writes go through the same paths as requests from dev-k8s itself (no
// user, no field manager).
type cluster struct{ s *Server }

func (c cluster) Lookup(gvr schema.GroupVersionResource) (*registry.Resource, bool) {
	return c.s.reg.Lookup(gvr)
}

func (c cluster) Resources() []*registry.Resource { return c.s.reg.All() }

func (c cluster) List(res *registry.Resource, ns string) []*store.Entry {
	entries, _ := c.s.store.List(res.StorageName(), ns)
	return entries
}

func (c cluster) Mutate(res *registry.Resource, ns, name string, fn store.MutateFunc) error {
	_, err := c.s.store.Mutate(res.StorageName(), ns, name, fn)
	return err
}

func (c cluster) Create(res *registry.Resource, ns string, obj map[string]any) error {
	_, _, err := c.s.createObject(request{res: res, namespace: ns}, obj, false)
	return err
}

func (c cluster) Delete(res *registry.Resource, ns, name string, opts metav1.DeleteOptions) error {
	_, _, err := c.s.deleteObject(res, ns, name, opts)
	return err
}

func (c cluster) Log() logr.Logger { return c.s.log }

func (c cluster) LogErr(err error, msg string, kv ...any) { c.s.logErr(err, msg, kv...) }

func (s *Server) logErr(err error, msg string, kv ...any) {
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		s.log.Error(err, msg, kv...)
	}
}

// removeFinalizer drops one finalizer, deleting the object when it was the
// last one of an object being deleted.
func (s *Server) removeFinalizer(res *registry.Resource, ns, name, fin string) error {
	_, err := s.store.Mutate(res.StorageName(), ns, name, func(cur map[string]any) (store.Mutation, error) {
		if cur == nil {
			return store.Mutation{}, apierrors.NewNotFound(res.GroupResource(), name)
		}
		next := deepCopy(cur)
		md := metaOf(next)
		setFinalizers(md, without(finalizers(md), fin))
		return s.finishUpdate(request{res: res, namespace: ns, name: name}, cur, next)
	})
	return err
}

func (s *Server) cleanupCRDs() {
	res := s.crdResource()
	entries, _ := s.store.List(crdStorage, "")
	for _, e := range entries {
		md := metaOf(e.Object)
		if !hasDeletionTimestamp(e.Object) || !contains(finalizers(md), strategy.CRDFinalizer) {
			continue
		}
		group := nestedString(e.Object, "spec", "group")
		plural := nestedString(e.Object, "spec", "names", "plural")
		crs, _ := s.store.List(s.reg.StorageDir(group, plural), "")
		crRes, ok := s.reg.ByStorageName(s.reg.StorageDir(group, plural))
		if ok {
			for _, cr := range crs {
				cmd := metaOf(cr.Object)
				_, _, err := s.deleteObject(crRes, str(cmd, "namespace"), str(cmd, "name"), metav1.DeleteOptions{})
				s.logErr(err, "delete custom resource of deleted CRD")
			}
			if crs, _ = s.store.List(crRes.StorageName(), ""); len(crs) > 0 {
				continue
			}
		}
		s.logErr(s.removeFinalizer(res, "", str(md, "name"), strategy.CRDFinalizer), "finish CRD deletion")
	}
}

// ownerState looks an owner reference up: alive (same uid) and its entry.
func (s *Server) ownerState(ns string, ref metav1.OwnerReference) (*store.Entry, *registry.Resource, bool) {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return nil, nil, false
	}
	res, ok := s.reg.ForKind(gv.WithKind(ref.Kind))
	if !ok {
		return nil, nil, false
	}
	if !res.Namespaced {
		ns = ""
	}
	e, ok := s.store.Get(res.StorageName(), ns, ref.Name)
	if !ok || str(metaOf(e.Object), "uid") != string(ref.UID) {
		return nil, res, false
	}
	return e, res, true
}

func (s *Server) collectGarbage() {
	dependents := map[string]int{}
	for _, res := range s.reg.All() {
		if !res.Storage {
			continue
		}
		entries, _ := s.store.List(res.StorageName(), "")
		for _, e := range entries {
			refs := object.OwnerRefs(e.Object)
			if len(refs) == 0 {
				continue
			}
			md := metaOf(e.Object)
			ns, name := str(md, "namespace"), str(md, "name")
			alive, deleteMe := 0, false
			var orphanFrom []string
			for _, ref := range refs {
				owner, ownerRes, ok := s.ownerState(ns, ref)
				if !ok {
					if ownerRes == nil {
						// An owner of a kind this server does not serve
						// (batch/v1 Job, say) cannot be looked up;
						// kube-apiserver's collector leaves such dependents
						// alone rather than deleting them.
						alive++
					}
					continue
				}
				alive++
				dependents[string(ref.UID)]++
				ofs := finalizers(metaOf(owner.Object))
				if hasDeletionTimestamp(owner.Object) && contains(ofs, metav1.FinalizerDeleteDependents) {
					deleteMe = true
				}
				if hasDeletionTimestamp(owner.Object) && contains(ofs, metav1.FinalizerOrphanDependents) {
					orphanFrom = append(orphanFrom, string(ref.UID))
				}
			}
			switch {
			case len(orphanFrom) > 0:
				s.logErr(s.dropOwnerRefs(res, ns, name, orphanFrom), "orphan dependent")
				for _, uid := range orphanFrom {
					dependents[uid]--
				}
			case alive == 0 || deleteMe:
				if !hasDeletionTimestamp(e.Object) {
					policy := metav1.DeletePropagationBackground
					_, _, err := s.deleteObject(res, ns, name, metav1.DeleteOptions{PropagationPolicy: &policy})
					s.logErr(err, "garbage-collect dependent", "resource", res.Resource, "name", name)
				}
			}
		}
	}
	// Owners waiting on their dependents finish once none are left.
	for _, res := range s.reg.All() {
		if !res.Storage {
			continue
		}
		entries, _ := s.store.List(res.StorageName(), "")
		for _, e := range entries {
			if !hasDeletionTimestamp(e.Object) {
				continue
			}
			md := metaOf(e.Object)
			if dependents[str(md, "uid")] > 0 {
				continue
			}
			for _, f := range []string{metav1.FinalizerDeleteDependents, metav1.FinalizerOrphanDependents} {
				if contains(finalizers(md), f) {
					s.logErr(s.removeFinalizer(res, str(md, "namespace"), str(md, "name"), f), "finish owner deletion")
				}
			}
		}
	}
}

func (s *Server) dropOwnerRefs(res *registry.Resource, ns, name string, uids []string) error {
	_, err := s.store.Mutate(res.StorageName(), ns, name, func(cur map[string]any) (store.Mutation, error) {
		if cur == nil {
			return store.Mutation{}, apierrors.NewNotFound(res.GroupResource(), name)
		}
		md := metaOf(cur)
		var keep []any
		for _, r := range asList(md["ownerReferences"]) {
			m, _ := r.(map[string]any)
			if !contains(uids, str(m, "uid")) {
				keep = append(keep, r)
			}
		}
		if len(keep) == 0 {
			delete(md, "ownerReferences")
		} else {
			md["ownerReferences"] = keep
		}
		return store.Mutation{Object: cur}, nil
	})
	return err
}
