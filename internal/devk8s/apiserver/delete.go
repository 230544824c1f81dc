package apiserver

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
	"github.com/nstance-dev/nstance/internal/devk8s/strategy"
)

// deleteOptions reads DeleteOptions from the body or the query.
func (s *Server) deleteOptions(r *http.Request) (metav1.DeleteOptions, error) {
	var opts metav1.DeleteOptions
	body, err := s.readMap(r)
	if err != nil {
		return opts, err
	}
	if len(body) > 0 {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(body, &opts); err != nil {
			return opts, apierrors.NewBadRequest(fmt.Sprintf("decode DeleteOptions: %v", err))
		}
	}
	q := r.URL.Query()
	if v := q.Get("gracePeriodSeconds"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return opts, apierrors.NewBadRequest(fmt.Sprintf("invalid gracePeriodSeconds %q", v))
		}
		opts.GracePeriodSeconds = &n
	}
	if v := q.Get("propagationPolicy"); v != "" {
		p := metav1.DeletionPropagation(v)
		opts.PropagationPolicy = &p
	}
	if v := q.Get("orphanDependents"); v != "" {
		b := isTrue(v)
		opts.OrphanDependents = &b //nolint:staticcheck // deprecated, still served by kube-apiserver
	}
	if isDryRun(r) {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	return opts, nil
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request, rq request) {
	opts, err := s.deleteOptions(r)
	if err != nil {
		writeError(w, err)
		return
	}
	result, deleted, err := s.deleteObject(rq.res, rq.namespace, rq.name, opts)
	if err != nil {
		writeError(w, err)
		return
	}
	if deleted && !rq.res.ReturnDeleted {
		md := metaOf(result.Object)
		writeJSON(w, http.StatusOK, successStatus(&metav1.StatusDetails{Name: rq.name, Group: rq.res.Group, Kind: rq.res.Resource, UID: types.UID(str(md, "uid"))}))
		return
	}
	s.writeEntry(w, r, http.StatusOK, rq.res, result)
}

// deleteObject deletes, or starts deleting, one object. deleted tells
// whether it is gone; otherwise the returned entry carries the
// deletionTimestamp and remaining finalizers.
func (s *Server) deleteObject(res *registry.Resource, ns, name string, opts metav1.DeleteOptions) (*store.Entry, bool, error) {
	if err := validPolicy(opts); err != nil {
		return nil, false, err
	}
	deleted, stampDeletion := false, false
	st := s.strategy(res)
	gd, _ := st.(strategy.GracefulDeleter)
	fd, _ := st.(strategy.FinalizingDeleter)
	result, err := s.store.Mutate(res.StorageName(), ns, name, dryRunFunc(len(opts.DryRun) > 0, func(cur map[string]any) (store.Mutation, error) {
		if cur == nil {
			return store.Mutation{}, apierrors.NewNotFound(res.GroupResource(), name)
		}
		md := metaOf(cur)
		if p := opts.Preconditions; p != nil {
			gk := schema.GroupResource{Group: res.Group, Resource: res.Kind}
			if p.UID != nil && string(*p.UID) != str(md, "uid") {
				return store.Mutation{}, apierrors.NewConflict(gk, name, fmt.Errorf("the UID in the precondition (%s) does not match the UID in record (%s). The object might have been deleted and then recreated", *p.UID, str(md, "uid")))
			}
			if p.ResourceVersion != nil && *p.ResourceVersion != str(md, "resourceVersion") {
				return store.Mutation{}, apierrors.NewConflict(gk, name, fmt.Errorf("the ResourceVersion in the precondition (%s) does not match the ResourceVersion in record (%s). The object might have been modified", *p.ResourceVersion, str(md, "resourceVersion")))
			}
		}
		fs := finalizers(md)
		policy := propagation(opts)
		changed := false
		if !hasDeletionTimestamp(cur) || !contains(fs, policy) {
			switch policy {
			case metav1.FinalizerOrphanDependents, metav1.FinalizerDeleteDependents:
				if !contains(fs, policy) {
					fs = append(without(fs, metav1.FinalizerOrphanDependents, metav1.FinalizerDeleteDependents), policy)
					changed = true
				}
			}
		}
		var grace int64
		graceful := false
		if gd != nil {
			grace, graceful = gd.GracePeriod(cur, opts)
		}
		if len(fs) == 0 && !graceful && (fd == nil || !fd.SpecFinalizers(cur)) {
			deleted = true
			if gd != nil && !hasDeletionTimestamp(cur) {
				// Graceful kinds (pods) are deleted gracefully even with
				// no grace period: the deletion timestamp is recorded
				// first.
				stampDeletion = true
				md["deletionTimestamp"] = timestamp(timeNow())
				md["deletionGracePeriodSeconds"] = int64(0)
				md["generation"] = generationOf(md) + 1
				return store.Mutation{Object: cur}, nil
			}
			return store.Mutation{Delete: true}, nil
		}
		if hasDeletionTimestamp(cur) && !changed {
			// Already being deleted: a shorter grace period may still
			// bring the deadline forward.
			if graceful {
				if cg, ok := int64Of(md["deletionGracePeriodSeconds"]); ok && grace < cg {
					md["deletionGracePeriodSeconds"] = grace
					md["deletionTimestamp"] = timestamp(timeNow().Add(time.Duration(grace) * time.Second))
					return store.Mutation{Object: cur}, nil
				}
			}
			return store.Mutation{Object: cur}, nil
		}
		setFinalizers(md, fs)
		if !hasDeletionTimestamp(cur) {
			now := timeNow()
			md["deletionTimestamp"] = timestamp(now.Add(time.Duration(grace) * time.Second))
			md["deletionGracePeriodSeconds"] = grace
			if res.Generation {
				md["generation"] = generationOf(md) + 1
			}
			if fd != nil {
				fd.PrepareForDelete(cur)
			}
		}
		return store.Mutation{Object: cur}, nil
	}))
	if err != nil {
		return nil, false, err
	}
	if stampDeletion && len(opts.DryRun) == 0 {
		final, err := s.store.Mutate(res.StorageName(), ns, name, func(cur map[string]any) (store.Mutation, error) {
			if cur == nil {
				return store.Mutation{}, apierrors.NewNotFound(res.GroupResource(), name)
			}
			return store.Mutation{Delete: true}, nil
		})
		if err != nil {
			return nil, false, err
		}
		return final.Entry, true, nil
	}
	return result.Entry, deleted, nil
}

func validPolicy(opts metav1.DeleteOptions) error {
	if opts.PropagationPolicy == nil {
		return nil
	}
	switch *opts.PropagationPolicy {
	case metav1.DeletePropagationBackground, metav1.DeletePropagationForeground, metav1.DeletePropagationOrphan:
	default:
		return apierrors.NewInvalid(schema.GroupKind{Group: "meta.k8s.io", Kind: "DeleteOptions"}, "", field.ErrorList{field.NotSupported(field.NewPath("propagationPolicy"), *opts.PropagationPolicy, []string{"Foreground", "Background", "Orphan", "nil"})})
	}
	if opts.OrphanDependents != nil { //nolint:staticcheck // deprecated, still served by kube-apiserver
		return apierrors.NewInvalid(schema.GroupKind{Group: "meta.k8s.io", Kind: "DeleteOptions"}, "", field.ErrorList{field.Invalid(field.NewPath("propagationPolicy"), *opts.PropagationPolicy, "orphanDependents and deletionPropagation cannot be both set")})
	}
	return nil
}

// propagation returns the finalizer the delete options ask for, or "".
func propagation(opts metav1.DeleteOptions) string {
	if opts.OrphanDependents != nil { //nolint:staticcheck // deprecated, still served by kube-apiserver
		if *opts.OrphanDependents { //nolint:staticcheck // as above
			return metav1.FinalizerOrphanDependents
		}
		return ""
	}
	if opts.PropagationPolicy == nil {
		return ""
	}
	switch *opts.PropagationPolicy {
	case metav1.DeletePropagationForeground:
		return metav1.FinalizerDeleteDependents
	case metav1.DeletePropagationOrphan:
		return metav1.FinalizerOrphanDependents
	}
	return ""
}

func contains(xs []string, x string) bool {
	if x == "" {
		return false
	}
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func without(xs []string, drop ...string) []string {
	var out []string
	for _, v := range xs {
		if !contains(drop, v) {
			out = append(out, v)
		}
	}
	return out
}

// waitsForGracePeriod: an object of a graceful kind (a pod) whose
// deletion deadline has not passed stays even after its last finalizer
// goes.
func (s *Server) waitsForGracePeriod(res *registry.Resource, obj map[string]any) bool {
	gd, ok := s.strategy(res).(strategy.GracefulDeleter)
	return ok && gd.WaitsForGracePeriod(obj)
}

func (s *Server) deleteCollection(w http.ResponseWriter, r *http.Request, rq request) {
	opts, err := s.deleteOptions(r)
	if err != nil {
		writeError(w, err)
		return
	}
	q := r.URL.Query()
	sel, err := s.parseSelectors(rq.res, q.Get("labelSelector"), q.Get("fieldSelector"))
	if err != nil {
		writeError(w, err)
		return
	}
	entries, _ := s.store.List(rq.res.StorageName(), rq.namespace)
	var items [][]byte
	for _, e := range entries {
		if !sel.matches(e.Object) {
			continue
		}
		md := metaOf(e.Object)
		out, _, err := s.deleteObject(rq.res, str(md, "namespace"), str(md, "name"), opts)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			writeError(w, err)
			return
		}
		items = append(items, entryBytes(rq.res, out))
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, `{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":"%d"},"items":[`, rq.res.ListKind, rq.res.APIVersion(), s.store.CurrentRV())
	buf.Write(bytes.Join(items, []byte(",")))
	buf.WriteString("]}")
	writeRaw(w, http.StatusOK, buf.Bytes())
}
