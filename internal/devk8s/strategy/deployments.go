package strategy

import (
	appsv1 "k8s.io/api/apps/v1"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/nstance-dev/nstance/internal/devk8s/object"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
)

// Deployments are apps/v1 Deployments.
type Deployments struct{ Generic }

// Resource is the registry entry.
func (Deployments) Resource() registry.Resource {
	return registry.Resource{Group: "apps", Version: "v1", Resource: "deployments", Kind: "Deployment", Namespaced: true, ShortNames: []string{"deploy"}, Categories: []string{"all"}, Status: true, Generation: true, BuiltIn: true, Storage: true}
}

// Default applies the apps/v1 Deployment defaults.
func (Deployments) Default(_ *registry.Resource, obj map[string]any) {
	spec := object.ChildMap(obj, "spec")
	object.SetDefault(spec, "replicas", int64(1))
	st := object.ChildMap(spec, "strategy")
	object.SetDefault(st, "type", string(appsv1.RollingUpdateDeploymentStrategyType))
	if object.Str(st, "type") == string(appsv1.RollingUpdateDeploymentStrategyType) {
		ru := object.ChildMap(st, "rollingUpdate")
		object.SetDefault(ru, "maxUnavailable", "25%")
		object.SetDefault(ru, "maxSurge", "25%")
	}
	object.SetDefault(spec, "revisionHistoryLimit", int64(10))
	object.SetDefault(spec, "progressDeadlineSeconds", int64(600))
	defaultTemplateSpec(templateSpec(spec))
}

// PrepareForCreate starts with an empty status.
func (Deployments) PrepareForCreate(_ *registry.Resource, obj map[string]any) {
	appsPrepareForCreate(obj)
}

// PrepareForUpdate defaults first (so a request that leaves defaulted
// fields out changes nothing); the generation also follows annotations.
func (d Deployments) PrepareForUpdate(res *registry.Resource, cur, next map[string]any) bool {
	d.NormalizeFile(res, cur, next)
	return !object.Equal(object.NonEmptyMap(object.Meta(cur)["annotations"]), object.NonEmptyMap(object.Meta(next)["annotations"]))
}

// NormalizeFile gives a hand-edited file the defaults and type pruning an
// API write gets.
func (d Deployments) NormalizeFile(res *registry.Resource, _, obj map[string]any) {
	d.Default(res, obj)
	normalizeTyped(obj, &appsv1.Deployment{})
}

// DecodeError words a body that does not fit the Go type.
func (Deployments) DecodeError(res *registry.Resource, obj map[string]any, convErr error) error {
	return appsDecodeError(res, obj, convErr, &appsv1.Deployment{})
}

// Validate runs the Deployment validation.
func (Deployments) Validate(res *registry.Resource, old, obj map[string]any) error {
	var d, od appsv1.Deployment
	if err := object.ToTyped(obj, &d); err != nil {
		return badRequest(err)
	}
	errs := validateDeploymentSpec(&d.Spec, field.NewPath("spec"))
	errs = append(errs, validateDeploymentStatus(&d.Status, field.NewPath("status"))...)
	if old != nil && object.ToTyped(old, &od) == nil {
		errs = append(errs, apimachineryvalidation.ValidateImmutableField(d.Spec.Selector, od.Spec.Selector, field.NewPath("spec", "selector"))...)
	}
	return invalid(res, obj, errs)
}

// Columns are kubectl's Deployment columns.
func (Deployments) Columns() []Column {
	upToDate, available := numCol("Up-to-date", "status", "updatedReplicas"), numCol("Available", "status", "availableReplicas")
	upToDate.Def.Type, available.Def.Type = "string", "string"
	return appsColumns(readyCol(), upToDate, available, containersCol(), imagesCol(), selectorCol())
}

func validateDeploymentSpec(spec *appsv1.DeploymentSpec, p *field.Path) field.ErrorList {
	errs := nonNegative(int32Val(spec.Replicas), p.Child("replicas"))
	errs = append(errs, validateSelector(spec.Selector, p.Child("selector"), "deployment")...)
	errs = append(errs, validateTemplateForSelector(spec.Selector, &spec.Template, p.Child("selector"), p.Child("template"), "ReplicaSet")...)
	sp := p.Child("strategy")
	switch spec.Strategy.Type {
	case appsv1.RecreateDeploymentStrategyType:
		if spec.Strategy.RollingUpdate != nil {
			errs = append(errs, field.Forbidden(sp.Child("rollingUpdate"), "may not be specified when strategy `type` is 'Recreate'"))
		}
	case appsv1.RollingUpdateDeploymentStrategyType:
		if ru := spec.Strategy.RollingUpdate; ru == nil {
			errs = append(errs, field.Required(sp.Child("rollingUpdate"), "this should be defaulted and never be nil"))
		} else {
			rp := sp.Child("rollingUpdate")
			errs = append(errs, validatePositiveIntOrPercent(ru.MaxUnavailable, rp.Child("maxUnavailable"))...)
			errs = append(errs, validatePositiveIntOrPercent(ru.MaxSurge, rp.Child("maxSurge"))...)
			if intOrPercentValue(ru.MaxUnavailable) == 0 && intOrPercentValue(ru.MaxSurge) == 0 {
				errs = append(errs, field.Invalid(rp.Child("maxUnavailable"), ru.MaxUnavailable, "may not be 0 when `maxSurge` is 0"))
			}
			errs = append(errs, notOver100(ru.MaxUnavailable, rp.Child("maxUnavailable"))...)
		}
	default:
		errs = append(errs, field.NotSupported(sp, internalDeploymentStrategy(spec.Strategy), []string{string(appsv1.RecreateDeploymentStrategyType), string(appsv1.RollingUpdateDeploymentStrategyType)}))
	}
	errs = append(errs, nonNegative(int64(spec.MinReadySeconds), p.Child("minReadySeconds"))...)
	if spec.RevisionHistoryLimit != nil {
		errs = append(errs, nonNegative(int64(*spec.RevisionHistoryLimit), p.Child("revisionHistoryLimit"))...)
	}
	if spec.ProgressDeadlineSeconds != nil {
		errs = append(errs, nonNegative(int64(*spec.ProgressDeadlineSeconds), p.Child("progressDeadlineSeconds"))...)
		if *spec.ProgressDeadlineSeconds <= spec.MinReadySeconds {
			errs = append(errs, field.Invalid(p.Child("progressDeadlineSeconds"), spec.ProgressDeadlineSeconds, "must be greater than minReadySeconds"))
		}
	}
	return errs
}

func validateDeploymentStatus(st *appsv1.DeploymentStatus, p *field.Path) field.ErrorList {
	errs := nonNegative(st.ObservedGeneration, p.Child("observedGeneration"))
	errs = append(errs, nonNegative(int64(st.Replicas), p.Child("replicas"))...)
	errs = append(errs, nonNegative(int64(st.UpdatedReplicas), p.Child("updatedReplicas"))...)
	errs = append(errs, nonNegative(int64(st.ReadyReplicas), p.Child("readyReplicas"))...)
	errs = append(errs, nonNegative(int64(st.AvailableReplicas), p.Child("availableReplicas"))...)
	errs = append(errs, nonNegative(int64(st.UnavailableReplicas), p.Child("unavailableReplicas"))...)
	if st.TerminatingReplicas != nil {
		errs = append(errs, nonNegative(int64(*st.TerminatingReplicas), p.Child("terminatingReplicas"))...)
	}
	if st.CollisionCount != nil {
		errs = append(errs, nonNegative(int64(*st.CollisionCount), p.Child("collisionCount"))...)
	}
	errs = append(errs, replicaCounts(p, st.Replicas, "updatedReplicas", st.UpdatedReplicas, "readyReplicas", st.ReadyReplicas, "availableReplicas", st.AvailableReplicas)...)
	if st.AvailableReplicas > st.ReadyReplicas {
		errs = append(errs, field.Invalid(p.Child("availableReplicas"), st.AvailableReplicas, "cannot be greater than readyReplicas"))
	}
	return errs
}

func internalDeploymentStrategy(s appsv1.DeploymentStrategy) internalStrategy {
	out := internalStrategy{Type: string(s.Type)}
	if ru := s.RollingUpdate; ru != nil {
		out.RollingUpdate = &internalRollingUpdate{MaxUnavailable: orZero(ru.MaxUnavailable), MaxSurge: orZero(ru.MaxSurge)}
	}
	return out
}
