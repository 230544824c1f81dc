package apiserver

import (
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
	"github.com/nstance-dev/nstance/internal/devk8s/strategy"
)

func toTyped(obj map[string]any, out any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructured(obj, out)
}

func tooManyRequests(cause string, retryAfter int) error {
	err := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", retryAfter)
	err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{Type: policyv1.DisruptionBudgetCause, Message: cause})
	return err
}

func (s *Server) evict(w http.ResponseWriter, r *http.Request, rq request) {
	body, err := s.readMap(r)
	if err != nil {
		writeError(w, err)
		return
	}
	var ev policyv1.Eviction
	if err := toTyped(body, &ev); err != nil {
		writeError(w, apierrors.NewBadRequest(fmt.Sprintf("decode Eviction: %v", err)))
		return
	}
	if ev.Name != "" && ev.Name != rq.name {
		writeError(w, apierrors.NewBadRequest("name in URL does not match name in Eviction object"))
		return
	}
	opts := metav1.DeleteOptions{}
	if ev.DeleteOptions != nil {
		opts = *ev.DeleteOptions
	}
	if isDryRun(r) {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	status, err := s.evictPod(rq.res, rq.namespace, rq.name, opts)
	if err != nil {
		writeError(w, err)
		return
	}
	status.Kind, status.APIVersion = "Status", "v1"
	writeJSON(w, int(status.Code), status)
}

// evictPod follows kube-apiserver's eviction rules: terminal, pending or
// terminating pods go without a budget check; otherwise exactly one
// matching PodDisruptionBudget must allow a disruption, which is then used up.
func (s *Server) evictPod(res *registry.Resource, ns, name string, opts metav1.DeleteOptions) (*metav1.Status, error) {
	e, ok := s.store.Get(res.StorageName(), ns, name)
	if !ok {
		return nil, apierrors.NewNotFound(res.GroupResource(), name)
	}
	var pod corev1.Pod
	if err := toTyped(e.Object, &pod); err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	ignorePDB := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed ||
		pod.Status.Phase == corev1.PodPending || pod.DeletionTimestamp != nil
	if !ignorePDB {
		pdbs, err := s.matchingPDBs(ns, pod.Labels)
		if err != nil {
			return nil, err
		}
		if len(pdbs) > 1 {
			return &metav1.Status{Status: metav1.StatusFailure, Message: "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.", Code: 500}, nil
		}
		if len(pdbs) == 1 {
			pdb := pdbs[0]
			unhealthyOK := false
			if !strategy.PodReady(&pod) {
				if p := pdb.Spec.UnhealthyPodEvictionPolicy; p != nil && *p == policyv1.AlwaysAllow {
					unhealthyOK = true
				} else if pdb.Status.CurrentHealthy >= pdb.Status.DesiredHealthy && pdb.Status.DesiredHealthy > 0 {
					unhealthyOK = true
				}
			}
			if !unhealthyOK {
				if err := s.useDisruption(ns, pod.Name, pdb, len(opts.DryRun) > 0); err != nil {
					return nil, err
				}
			}
		}
	}
	if err := s.markEvicting(res, ns, name, len(opts.DryRun) > 0); err != nil {
		return nil, err
	}
	if _, _, err := s.deleteObject(res, ns, name, opts); err != nil {
		return nil, err
	}
	return &metav1.Status{Status: metav1.StatusSuccess, Code: http.StatusCreated}, nil
}

func (s *Server) matchingPDBs(ns string, podLabels map[string]string) ([]policyv1.PodDisruptionBudget, error) {
	pdbRes, _ := s.reg.Lookup(schema.GroupVersionResource{Group: "policy", Version: "v1", Resource: "poddisruptionbudgets"})
	entries, _ := s.store.List(pdbRes.StorageName(), ns)
	var out []policyv1.PodDisruptionBudget
	for _, e := range entries {
		var pdb policyv1.PodDisruptionBudget
		if err := toTyped(e.Object, &pdb); err != nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(podLabels)) {
			continue
		}
		out = append(out, pdb)
	}
	return out, nil
}

// useDisruption checks a budget and records the disruption in its status.
func (s *Server) useDisruption(ns, podName string, pdb policyv1.PodDisruptionBudget, dryRun bool) error {
	pdbRes, _ := s.reg.Lookup(schema.GroupVersionResource{Group: "policy", Version: "v1", Resource: "poddisruptionbudgets"})
	_, err := s.store.Mutate(pdbRes.StorageName(), ns, pdb.Name, func(cur map[string]any) (store.Mutation, error) {
		if cur == nil {
			return store.Mutation{}, apierrors.NewNotFound(pdbRes.GroupResource(), pdb.Name)
		}
		var p policyv1.PodDisruptionBudget
		if err := toTyped(cur, &p); err != nil {
			return store.Mutation{}, apierrors.NewInternalError(err)
		}
		if p.Status.ObservedGeneration < p.Generation {
			return store.Mutation{}, tooManyRequests(fmt.Sprintf("The disruption budget %s is still being processed by the server.", p.Name), 10)
		}
		if p.Status.DisruptionsAllowed < 0 {
			return store.Mutation{}, apierrors.NewForbidden(schema.GroupResource{Group: "policy", Resource: "poddisruptionbudget"}, p.Name, fmt.Errorf("pdb disruptions allowed is negative"))
		}
		if p.Status.DisruptionsAllowed == 0 {
			cond := meta.FindStatusCondition(p.Status.Conditions, policyv1.DisruptionAllowedCondition)
			var msg string
			switch {
			case cond != nil && cond.Status == metav1.ConditionFalse && cond.Message != "" && cond.Reason == policyv1.SyncFailedReason:
				msg = fmt.Sprintf("The disruption budget %s does not allow evicting pods currently because it failed sync: %s", p.Name, cond.Message)
			case p.Status.CurrentHealthy <= p.Status.DesiredHealthy:
				msg = fmt.Sprintf("The disruption budget %s needs %d healthy pods and has %d currently", p.Name, p.Status.DesiredHealthy, p.Status.CurrentHealthy)
			case cond != nil && cond.Status == metav1.ConditionFalse && cond.Message != "":
				msg = fmt.Sprintf("The disruption budget %s does not allow evicting pods currently (%s): %s", p.Name, cond.Reason, cond.Message)
			default:
				msg = fmt.Sprintf("The disruption budget %s does not allow evicting pods currently", p.Name)
			}
			return store.Mutation{}, tooManyRequests(msg, 0)
		}
		p.Status.DisruptionsAllowed--
		if p.Status.DisruptionsAllowed == 0 {
			meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{
				Type: policyv1.DisruptionAllowedCondition, Status: metav1.ConditionFalse,
				Reason: policyv1.InsufficientPodsReason, ObservedGeneration: p.Status.ObservedGeneration,
			})
		}
		if p.Status.DisruptedPods == nil {
			p.Status.DisruptedPods = map[string]metav1.Time{}
		}
		p.Status.DisruptedPods[podName] = metav1.Time{Time: time.Now()}
		st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&p.Status)
		if err != nil {
			return store.Mutation{}, apierrors.NewInternalError(err)
		}
		cur["status"] = st
		return store.Mutation{Object: cur, DryRun: dryRun}, nil
	})
	return err
}

// markEvicting adds the DisruptionTarget condition kube-apiserver sets
// before deleting an evicted pod.
func (s *Server) markEvicting(res *registry.Resource, ns, name string, dryRun bool) error {
	_, err := s.store.Mutate(res.StorageName(), ns, name, func(cur map[string]any) (store.Mutation, error) {
		if cur == nil {
			return store.Mutation{}, apierrors.NewNotFound(res.GroupResource(), name)
		}
		var pod corev1.Pod
		if err := toTyped(cur, &pod); err != nil {
			return store.Mutation{}, apierrors.NewInternalError(err)
		}
		if pod.DeletionTimestamp != nil || dryRun {
			return store.Mutation{Object: cur, DryRun: true}, nil
		}
		found := false
		for i := range pod.Status.Conditions {
			if pod.Status.Conditions[i].Type == corev1.DisruptionTarget {
				found = true
				pod.Status.Conditions[i].Status = corev1.ConditionTrue
				pod.Status.Conditions[i].Reason = "EvictionByEvictionAPI"
				pod.Status.Conditions[i].Message = "Eviction API: evicting"
			}
		}
		if !found {
			pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{
				Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "EvictionByEvictionAPI",
				Message: "Eviction API: evicting", LastTransitionTime: metav1.Now(),
			})
		}
		st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&pod.Status)
		if err != nil {
			return store.Mutation{}, apierrors.NewInternalError(err)
		}
		cur["status"] = st
		return store.Mutation{Object: cur}, nil
	})
	return err
}
