package strategy

import (
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/nstance-dev/nstance/internal/devk8s/object"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
)

// DaemonSets are apps/v1 DaemonSets; their controller is in
// daemonset_controller.go.
type DaemonSets struct{ Generic }

// Resource is the registry entry.
func (DaemonSets) Resource() registry.Resource {
	return registry.Resource{Group: "apps", Version: "v1", Resource: "daemonsets", Kind: "DaemonSet", Namespaced: true, ShortNames: []string{"ds"}, Categories: []string{"all"}, Status: true, Generation: true, BuiltIn: true, Storage: true}
}

// Default applies the apps/v1 DaemonSet defaults.
func (DaemonSets) Default(_ *registry.Resource, obj map[string]any) {
	spec := object.ChildMap(obj, "spec")
	st := object.ChildMap(spec, "updateStrategy")
	object.SetDefault(st, "type", string(appsv1.RollingUpdateDaemonSetStrategyType))
	if object.Str(st, "type") == string(appsv1.RollingUpdateDaemonSetStrategyType) {
		ru := object.ChildMap(st, "rollingUpdate")
		object.SetDefault(ru, "maxUnavailable", int64(1))
		object.SetDefault(ru, "maxSurge", int64(0))
	}
	object.SetDefault(spec, "revisionHistoryLimit", int64(10))
	defaultTemplateSpec(templateSpec(spec))
}

// PrepareForCreate starts with an empty status and template generation 1.
func (DaemonSets) PrepareForCreate(_ *registry.Resource, obj map[string]any) {
	appsPrepareForCreate(obj)
	initTemplateGeneration(obj)
}

// PrepareForUpdate defaults first (so a request that leaves defaulted
// fields out changes nothing), then keeps the template generation of the
// stored object, bumped with the template.
func (d DaemonSets) PrepareForUpdate(res *registry.Resource, cur, next map[string]any) bool {
	d.NormalizeFile(res, cur, next)
	return false
}

// NormalizeFile gives a hand-edited file the defaults and type pruning an
// API write gets, and its template generation (1 for a new file, bumped
// when an edit changes the template).
func (d DaemonSets) NormalizeFile(res *registry.Resource, old, obj map[string]any) {
	d.Default(res, obj)
	normalizeTyped(obj, &appsv1.DaemonSet{})
	if old == nil {
		initTemplateGeneration(obj)
		return
	}
	gen, _ := strconv.ParseInt(object.Str(object.NonEmptyMap(object.Meta(old)["annotations"]), appsv1.DeprecatedTemplateGeneration), 10, 64)
	if !object.Equal(object.NestedMap(old, "spec")["template"], object.NestedMap(obj, "spec")["template"]) {
		gen++
	}
	object.ChildMap(object.Meta(obj), "annotations")[appsv1.DeprecatedTemplateGeneration] = strconv.FormatInt(gen, 10)
}

// initTemplateGeneration starts a new DaemonSet's template generation at
// 1 unless it has a valid one.
func initTemplateGeneration(obj map[string]any) {
	ann := object.ChildMap(object.Meta(obj), "annotations")
	if g, err := strconv.ParseInt(object.Str(ann, appsv1.DeprecatedTemplateGeneration), 10, 64); err != nil || g < 1 {
		ann[appsv1.DeprecatedTemplateGeneration] = "1"
	}
}

// DecodeError words a body that does not fit the Go type.
func (DaemonSets) DecodeError(res *registry.Resource, obj map[string]any, convErr error) error {
	return appsDecodeError(res, obj, convErr, &appsv1.DaemonSet{})
}

// Validate runs the DaemonSet validation.
func (DaemonSets) Validate(res *registry.Resource, old, obj map[string]any) error {
	var ds, ods appsv1.DaemonSet
	if err := object.ToTyped(obj, &ds); err != nil {
		return badRequest(err)
	}
	var errs field.ErrorList
	if old != nil && object.ToTyped(old, &ods) == nil {
		errs = append(errs, apimachineryvalidation.ValidateImmutableField(ds.Spec.Selector, ods.Spec.Selector, field.NewPath("spec", "selector"))...)
	}
	errs = append(errs, validateDaemonSetSpec(&ds.Spec, field.NewPath("spec"))...)
	errs = append(errs, validateDaemonSetStatus(&ds.Status, field.NewPath("status"))...)
	return invalid(res, obj, errs)
}

// Columns are kubectl's DaemonSet columns.
func (DaemonSets) Columns() []Column {
	return appsColumns(numCol("Desired", "status", "desiredNumberScheduled"), numCol("Current", "status", "currentNumberScheduled"),
		numCol("Ready", "status", "numberReady"), numCol("Up-to-date", "status", "updatedNumberScheduled"),
		numCol("Available", "status", "numberAvailable"),
		Column{Def: metav1.TableColumnDefinition{Name: "Node Selector", Type: "string"}, Cell: func(o map[string]any) any {
			sel := object.StringMap(object.NestedMap(o, "spec", "template", "spec")["nodeSelector"])
			if len(sel) == 0 {
				return "<none>"
			}
			return labels.Set(sel).String()
		}},
		containersCol(), imagesCol(), selectorCol())
}

func validateDaemonSetSpec(spec *appsv1.DaemonSetSpec, p *field.Path) field.ErrorList {
	errs := metav1validation.ValidateLabelSelector(spec.Selector, metav1validation.LabelSelectorValidationOptions{}, p.Child("selector"))
	selector, err := metav1.LabelSelectorAsSelector(spec.Selector)
	if err == nil && !selector.Matches(labels.Set(spec.Template.Labels)) {
		errs = append(errs, field.Invalid(p.Child("template", "metadata", "labels"), spec.Template.Labels, "`selector` does not match template `labels`"))
	}
	if spec.Selector != nil && len(spec.Selector.MatchLabels)+len(spec.Selector.MatchExpressions) == 0 {
		errs = append(errs, field.Invalid(p.Child("selector"), spec.Selector, "empty selector is invalid for daemonset"))
	}
	errs = append(errs, validatePodTemplate(&spec.Template, p.Child("template"))...)
	errs = append(errs, restartAlways(&spec.Template, p.Child("template"), "DaemonSet")...)
	errs = append(errs, nonNegative(int64(spec.MinReadySeconds), p.Child("minReadySeconds"))...)
	up := p.Child("updateStrategy")
	switch spec.UpdateStrategy.Type {
	case appsv1.OnDeleteDaemonSetStrategyType:
	case appsv1.RollingUpdateDaemonSetStrategyType:
		ru := spec.UpdateStrategy.RollingUpdate
		if ru == nil {
			errs = append(errs, field.Required(up.Child("rollingUpdate"), ""))
			break
		}
		rp := up.Child("rollingUpdate")
		errs = append(errs, validatePositiveIntOrPercent(ru.MaxUnavailable, rp.Child("maxUnavailable"))...)
		errs = append(errs, validatePositiveIntOrPercent(ru.MaxSurge, rp.Child("maxSurge"))...)
		errs = append(errs, notOver100(ru.MaxUnavailable, rp.Child("maxUnavailable"))...)
		errs = append(errs, notOver100(ru.MaxSurge, rp.Child("maxSurge"))...)
		hasUnavailable, hasSurge := intOrPercentValue(ru.MaxUnavailable) != 0, intOrPercentValue(ru.MaxSurge) != 0
		switch {
		case hasUnavailable && hasSurge:
			errs = append(errs, field.Invalid(rp.Child("maxSurge"), ru.MaxSurge, "may not be set when maxUnavailable is non-zero"))
		case !hasUnavailable && !hasSurge:
			errs = append(errs, field.Required(rp.Child("maxUnavailable"), "cannot be 0 when maxSurge is 0"))
		}
	default:
		errs = append(errs, field.NotSupported(up, internalDSStrategy(spec.UpdateStrategy), []string{string(appsv1.RollingUpdateDaemonSetStrategyType), string(appsv1.OnDeleteDaemonSetStrategyType)}))
	}
	if spec.RevisionHistoryLimit != nil {
		errs = append(errs, nonNegative(int64(*spec.RevisionHistoryLimit), p.Child("revisionHistoryLimit"))...)
	}
	return errs
}

func validateDaemonSetStatus(st *appsv1.DaemonSetStatus, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"currentNumberScheduled", int64(st.CurrentNumberScheduled)}, {"numberMisscheduled", int64(st.NumberMisscheduled)},
		{"desiredNumberScheduled", int64(st.DesiredNumberScheduled)}, {"numberReady", int64(st.NumberReady)},
		{"observedGeneration", st.ObservedGeneration}, {"updatedNumberScheduled", int64(st.UpdatedNumberScheduled)},
		{"numberAvailable", int64(st.NumberAvailable)}, {"numberUnavailable", int64(st.NumberUnavailable)},
	} {
		errs = append(errs, nonNegative(f.v, p.Child(f.name))...)
	}
	if st.CollisionCount != nil {
		errs = append(errs, nonNegative(int64(*st.CollisionCount), p.Child("collisionCount"))...)
	}
	return errs
}

func internalDSStrategy(s appsv1.DaemonSetUpdateStrategy) internalStrategy {
	out := internalStrategy{Type: string(s.Type)}
	if ru := s.RollingUpdate; ru != nil {
		out.RollingUpdate = &internalRollingUpdate{MaxUnavailable: orZero(ru.MaxUnavailable), MaxSurge: orZero(ru.MaxSurge)}
	}
	return out
}
