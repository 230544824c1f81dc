package watchfilter

import (
	"fmt"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/predicates"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

// Label is the label the filter value is matched against.
const Label = clusterv1.WatchLabel

// Filter is a --watch-filter value; empty reconciles every object.
type Filter string

// Validate reports a value that cannot be a label value.
func (f Filter) Validate() error {
	if msgs := validation.IsValidLabelValue(string(f)); len(msgs) > 0 {
		return fmt.Errorf("watch filter %q: %v", string(f), msgs)
	}
	return nil
}

// Matches says whether the operator reconciles obj.
func (f Filter) Matches(obj client.Object) bool {
	return f == "" || obj.GetLabels()[Label] == string(f)
}

// For is the option a controller's own kind is watched with: Cluster API's
// ResourceHasFilterLabel predicate, which lets everything through when f is
// empty.
func (f Filter) For(scheme *runtime.Scheme, log logr.Logger) builder.Predicates {
	return builder.WithPredicates(f.Predicate(scheme, log))
}

// Predicate is For's predicate, for sources that take one directly.
func (f Filter) Predicate(scheme *runtime.Scheme, log logr.Logger) predicate.Predicate {
	return predicates.ResourceHasFilterLabel(scheme, log, string(f))
}

// Inherit gives obj, made by the operator from parent (a pool's shard group or
// Machine), parent's filter label, if it has one.
func Inherit(parent, obj client.Object) {
	v, ok := parent.GetLabels()[Label]
	if !ok {
		return
	}
	Filter(v).Stamp(obj)
}

// Stamp labels obj, about to be created by the operator, with the filter
// value, so the operator that created it reconciles it. Empty f leaves obj as
// it is.
func (f Filter) Stamp(obj client.Object) {
	if f == "" {
		return
	}
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[Label] = string(f)
	obj.SetLabels(labels)
}
