package apiserver

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
)

// collector runs the background work that a real control plane does in
// kube-controller-manager and the kubelet: CRD cleanup always; with
// Options.Controllers also ownerReference garbage collection, namespace
// deletion, finishing graceful pod deletion, PodDisruptionBudget status and
// DaemonSet pods (daemonset.go).
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
	s.finishNamespaces()
	s.reapPods()
	s.syncPDBs()
	s.syncDaemonSets()
}

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
		if !hasDeletionTimestamp(e.Object) || !contains(finalizers(md), crdFinalizer) {
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
		s.logErr(s.removeFinalizer(res, "", str(md, "name"), crdFinalizer), "finish CRD deletion")
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

func ownerRefs(obj map[string]any) []metav1.OwnerReference {
	raw := asList(metaOf(obj)["ownerReferences"])
	if len(raw) == 0 {
		return nil
	}
	var refs []metav1.OwnerReference
	for _, r := range raw {
		m, _ := r.(map[string]any)
		var ref metav1.OwnerReference
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &ref); err == nil {
			refs = append(refs, ref)
		}
	}
	return refs
}

func (s *Server) collectGarbage() {
	dependents := map[string]int{}
	for _, res := range s.reg.All() {
		if !res.Storage {
			continue
		}
		entries, _ := s.store.List(res.StorageName(), "")
		for _, e := range entries {
			refs := ownerRefs(e.Object)
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

func (s *Server) finishNamespaces() {
	nsRes, _ := s.reg.Lookup(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"})
	entries, _ := s.store.List("namespaces", "")
	for _, e := range entries {
		if !hasDeletionTimestamp(e.Object) {
			continue
		}
		ns := str(metaOf(e.Object), "name")
		remaining := 0
		for _, res := range s.reg.All() {
			if !res.Namespaced || !res.Storage {
				continue
			}
			items, _ := s.store.List(res.StorageName(), ns)
			for _, it := range items {
				remaining++
				if !hasDeletionTimestamp(it.Object) {
					_, _, err := s.deleteObject(res, ns, str(metaOf(it.Object), "name"), metav1.DeleteOptions{})
					s.logErr(err, "delete namespace content")
				}
			}
		}
		if remaining > 0 {
			continue
		}
		_, err := s.store.Mutate("namespaces", "", ns, func(cur map[string]any) (store.Mutation, error) {
			if cur == nil {
				return store.Mutation{}, apierrors.NewNotFound(nsRes.GroupResource(), ns)
			}
			if spec, _ := cur["spec"].(map[string]any); spec != nil {
				delete(spec, "finalizers")
			}
			if len(finalizers(metaOf(cur))) == 0 {
				return store.Mutation{Delete: true}, nil
			}
			return store.Mutation{Object: cur}, nil
		})
		s.logErr(err, "finish namespace deletion")
	}
}

// reapPods ends graceful pod deletions whose deadline passed, standing in
// for the kubelet.
func (s *Server) reapPods() {
	res, _ := s.reg.Lookup(schema.GroupVersionResource{Version: "v1", Resource: "pods"})
	entries, _ := s.store.List("pods", "")
	now := timeNow()
	for _, e := range entries {
		md := metaOf(e.Object)
		ts, err := time.Parse(time.RFC3339, str(md, "deletionTimestamp"))
		if err != nil || now.Before(ts) {
			continue
		}
		if g, _ := int64Of(md["deletionGracePeriodSeconds"]); g == 0 {
			continue
		}
		name, ns := str(md, "name"), str(md, "namespace")
		_, err = s.store.Mutate(res.StorageName(), ns, name, func(cur map[string]any) (store.Mutation, error) {
			if cur == nil {
				return store.Mutation{}, apierrors.NewNotFound(res.GroupResource(), name)
			}
			cmd := metaOf(cur)
			cmd["deletionGracePeriodSeconds"] = int64(0)
			if len(finalizers(cmd)) == 0 {
				return store.Mutation{Delete: true}, nil
			}
			return store.Mutation{Object: cur}, nil
		})
		s.logErr(err, "finish pod deletion")
	}
}

// syncPDBs computes PodDisruptionBudget status as the disruption controller
// does, from the Ready condition of the selected pods.
func (s *Server) syncPDBs() {
	pdbRes, _ := s.reg.Lookup(schema.GroupVersionResource{Group: "policy", Version: "v1", Resource: "poddisruptionbudgets"})
	entries, _ := s.store.List(pdbRes.StorageName(), "")
	for _, e := range entries {
		var pdb policyv1.PodDisruptionBudget
		if err := toTyped(e.Object, &pdb); err != nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil {
			continue
		}
		pods, _ := s.store.List("pods", pdb.Namespace)
		expected, healthy := int32(0), int32(0)
		alive := map[string]bool{}
		for _, pe := range pods {
			var pod corev1.Pod
			if err := toTyped(pe.Object, &pod); err != nil || !sel.Matches(labels.Set(pod.Labels)) {
				continue
			}
			if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
				continue
			}
			alive[pod.Name] = true
			expected++
			if _, disrupted := pdb.Status.DisruptedPods[pod.Name]; podReadyCond(&pod) && !disrupted {
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
		_, err = s.store.Mutate(pdbRes.StorageName(), pdb.Namespace, pdb.Name, func(cur map[string]any) (store.Mutation, error) {
			if cur == nil {
				return store.Mutation{}, apierrors.NewNotFound(pdbRes.GroupResource(), pdb.Name)
			}
			cur["status"] = out
			return store.Mutation{Object: cur}, nil
		})
		s.logErr(err, "update PodDisruptionBudget status")
	}
}
