package strategy

import (
	appsv1 "k8s.io/api/apps/v1"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/nstance-dev/nstance/internal/devk8s/object"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
)

// ReplicaSets are apps/v1 ReplicaSets.
type ReplicaSets struct{ Generic }

// Resource is the registry entry.
func (ReplicaSets) Resource() registry.Resource {
	return registry.Resource{Group: "apps", Version: "v1", Resource: "replicasets", Kind: "ReplicaSet", Namespaced: true, ShortNames: []string{"rs"}, Categories: []string{"all"}, Status: true, Generation: true, BuiltIn: true, Storage: true}
}

// Default applies the apps/v1 ReplicaSet defaults.
func (ReplicaSets) Default(_ *registry.Resource, obj map[string]any) {
	spec := object.ChildMap(obj, "spec")
	object.SetDefault(spec, "replicas", int64(1))
	defaultTemplateSpec(templateSpec(spec))
}

// PrepareForCreate starts with an empty status.
func (ReplicaSets) PrepareForCreate(_ *registry.Resource, obj map[string]any) {
	appsPrepareForCreate(obj)
}

// PrepareForUpdate defaults first, so a request that leaves defaulted
// fields out changes nothing.
func (r ReplicaSets) PrepareForUpdate(res *registry.Resource, cur, next map[string]any) bool {
	r.NormalizeFile(res, cur, next)
	return false
}

// NormalizeFile gives a hand-edited file the defaults and type pruning an
// API write gets.
func (r ReplicaSets) NormalizeFile(res *registry.Resource, _, obj map[string]any) {
	r.Default(res, obj)
	normalizeTyped(obj, &appsv1.ReplicaSet{})
}

// DecodeError words a body that does not fit the Go type.
func (ReplicaSets) DecodeError(res *registry.Resource, obj map[string]any, convErr error) error {
	return appsDecodeError(res, obj, convErr, &appsv1.ReplicaSet{})
}

// Validate runs the ReplicaSet validation.
func (ReplicaSets) Validate(res *registry.Resource, old, obj map[string]any) error {
	var rs, ors appsv1.ReplicaSet
	if err := object.ToTyped(obj, &rs); err != nil {
		return badRequest(err)
	}
	errs := validateReplicaSetSpec(&rs.Spec, field.NewPath("spec"))
	errs = append(errs, validateReplicaSetStatus(&rs.Status, field.NewPath("status"))...)
	if old != nil && object.ToTyped(old, &ors) == nil {
		errs = append(errs, apimachineryvalidation.ValidateImmutableField(rs.Spec.Selector, ors.Spec.Selector, field.NewPath("spec", "selector"))...)
	}
	return invalid(res, obj, errs)
}

// Columns are kubectl's ReplicaSet columns.
func (ReplicaSets) Columns() []Column {
	return appsColumns(numCol("Desired", "spec", "replicas"), numCol("Current", "status", "replicas"), numCol("Ready", "status", "readyReplicas"),
		containersCol(), imagesCol(), selectorCol())
}

func validateReplicaSetSpec(spec *appsv1.ReplicaSetSpec, p *field.Path) field.ErrorList {
	errs := nonNegative(int32Val(spec.Replicas), p.Child("replicas"))
	errs = append(errs, nonNegative(int64(spec.MinReadySeconds), p.Child("minReadySeconds"))...)
	// kube-apiserver names the ReplicaSet's empty selector a deployment's.
	errs = append(errs, validateSelector(spec.Selector, p.Child("selector"), "deployment")...)
	errs = append(errs, validateTemplateForSelector(spec.Selector, &spec.Template, p.Child("selector"), p.Child("template"), "ReplicaSet")...)
	return errs
}

func validateReplicaSetStatus(st *appsv1.ReplicaSetStatus, p *field.Path) field.ErrorList {
	errs := nonNegative(int64(st.Replicas), p.Child("replicas"))
	errs = append(errs, nonNegative(int64(st.FullyLabeledReplicas), p.Child("fullyLabeledReplicas"))...)
	errs = append(errs, nonNegative(int64(st.ReadyReplicas), p.Child("readyReplicas"))...)
	errs = append(errs, nonNegative(int64(st.AvailableReplicas), p.Child("availableReplicas"))...)
	errs = append(errs, nonNegative(st.ObservedGeneration, p.Child("observedGeneration"))...)
	if st.TerminatingReplicas != nil {
		errs = append(errs, nonNegative(int64(*st.TerminatingReplicas), p.Child("terminatingReplicas"))...)
	}
	errs = append(errs, replicaCounts(p, st.Replicas, "fullyLabeledReplicas", st.FullyLabeledReplicas, "readyReplicas", st.ReadyReplicas, "availableReplicas", st.AvailableReplicas)...)
	if st.AvailableReplicas > st.ReadyReplicas {
		errs = append(errs, field.Invalid(p.Child("availableReplicas"), st.AvailableReplicas, "cannot be greater than readyReplicas"))
	}
	return errs
}
