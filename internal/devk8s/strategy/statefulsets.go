package strategy

import (
	appsv1 "k8s.io/api/apps/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/nstance-dev/nstance/internal/devk8s/object"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
)

// StatefulSets are apps/v1 StatefulSets.
type StatefulSets struct{ Generic }

// Resource is the registry entry.
func (StatefulSets) Resource() registry.Resource {
	return registry.Resource{Group: "apps", Version: "v1", Resource: "statefulsets", Kind: "StatefulSet", Namespaced: true, ShortNames: []string{"sts"}, Categories: []string{"all"}, Status: true, Generation: true, BuiltIn: true, Storage: true}
}

// Default applies the apps/v1 StatefulSet defaults.
func (StatefulSets) Default(_ *registry.Resource, obj map[string]any) {
	spec := object.ChildMap(obj, "spec")
	object.SetDefault(spec, "podManagementPolicy", string(appsv1.OrderedReadyPodManagement))
	st := object.ChildMap(spec, "updateStrategy")
	if object.Str(st, "type") == "" {
		st["type"] = string(appsv1.RollingUpdateStatefulSetStrategyType)
		object.ChildMap(st, "rollingUpdate")
	}
	if ru, ok := st["rollingUpdate"].(map[string]any); ok && object.Str(st, "type") == string(appsv1.RollingUpdateStatefulSetStrategyType) {
		object.SetDefault(ru, "partition", int64(0))
	}
	policy := object.ChildMap(spec, "persistentVolumeClaimRetentionPolicy")
	object.SetDefault(policy, "whenDeleted", string(appsv1.RetainPersistentVolumeClaimRetentionPolicyType))
	object.SetDefault(policy, "whenScaled", string(appsv1.RetainPersistentVolumeClaimRetentionPolicyType))
	object.SetDefault(spec, "replicas", int64(1))
	object.SetDefault(spec, "revisionHistoryLimit", int64(10))
	defaultTemplateSpec(templateSpec(spec))
}

// PrepareForCreate starts with an empty status.
func (StatefulSets) PrepareForCreate(_ *registry.Resource, obj map[string]any) {
	appsPrepareForCreate(obj)
}

// PrepareForUpdate defaults first, so a request that leaves defaulted
// fields out changes nothing.
func (s StatefulSets) PrepareForUpdate(res *registry.Resource, cur, next map[string]any) bool {
	s.NormalizeFile(res, cur, next)
	return false
}

// NormalizeFile gives a hand-edited file the defaults and type pruning an
// API write gets.
func (s StatefulSets) NormalizeFile(res *registry.Resource, _, obj map[string]any) {
	s.Default(res, obj)
	normalizeTyped(obj, &appsv1.StatefulSet{})
}

// DecodeError words a body that does not fit the Go type.
func (StatefulSets) DecodeError(res *registry.Resource, obj map[string]any, convErr error) error {
	return appsDecodeError(res, obj, convErr, &appsv1.StatefulSet{})
}

// NameRule: StatefulSet names are DNS-1123 labels (they name pods and
// hostnames).
func (StatefulSets) NameRule() apimachineryvalidation.ValidateNameFunc {
	return apimachineryvalidation.NameIsDNSLabel
}

// Validate runs the StatefulSet validation.
func (StatefulSets) Validate(res *registry.Resource, old, obj map[string]any) error {
	var ss, oss appsv1.StatefulSet
	if err := object.ToTyped(obj, &ss); err != nil {
		return badRequest(err)
	}
	var errs field.ErrorList
	errs = append(errs, validateStatefulSetSpec(&ss.Spec, field.NewPath("spec"), old == nil)...)
	errs = append(errs, validateStatefulSetStatus(&ss.Status, field.NewPath("status"))...)
	if old != nil && object.ToTyped(old, &oss) == nil {
		errs = append(errs, validateStatefulSetUpdate(&ss.Spec, &oss.Spec)...)
	}
	return invalid(res, obj, errs)
}

// Columns are kubectl's StatefulSet columns.
func (StatefulSets) Columns() []Column {
	return appsColumns(readyCol(), containersCol(), imagesCol())
}

func validateStatefulSetSpec(spec *appsv1.StatefulSetSpec, p *field.Path, creating bool) field.ErrorList {
	var errs field.ErrorList
	switch spec.PodManagementPolicy {
	case "":
		errs = append(errs, field.Required(p.Child("podManagementPolicy"), ""))
	case appsv1.OrderedReadyPodManagement, appsv1.ParallelPodManagement:
	default:
		errs = append(errs, field.Invalid(p.Child("podManagementPolicy"), spec.PodManagementPolicy, "must be 'OrderedReady' or 'Parallel'"))
	}
	up := p.Child("updateStrategy")
	switch spec.UpdateStrategy.Type {
	case "":
		errs = append(errs, field.Required(up, ""))
	case appsv1.OnDeleteStatefulSetStrategyType:
		if spec.UpdateStrategy.RollingUpdate != nil {
			errs = append(errs, field.Invalid(up.Child("rollingUpdate"), internalSTSRollingUpdate(spec.UpdateStrategy.RollingUpdate), "only allowed for updateStrategy 'RollingUpdate'"))
		}
	case appsv1.RollingUpdateStatefulSetStrategyType:
		if ru := spec.UpdateStrategy.RollingUpdate; ru != nil {
			rp := up.Child("rollingUpdate")
			errs = append(errs, nonNegative(int64Ptr32(ru.Partition), rp.Child("partition"))...)
			if ru.MaxUnavailable != nil {
				errs = append(errs, validatePositiveIntOrPercent(ru.MaxUnavailable, rp.Child("maxUnavailable"))...)
				if intOrPercentValue(ru.MaxUnavailable) == 0 {
					errs = append(errs, field.Invalid(rp.Child("maxUnavailable"), *ru.MaxUnavailable, "cannot be 0"))
				}
				errs = append(errs, notOver100(ru.MaxUnavailable, rp.Child("maxUnavailable"))...)
			}
		}
	default:
		errs = append(errs, field.Invalid(up, internalSTSStrategy(spec.UpdateStrategy), "must be 'RollingUpdate' or 'OnDelete'"))
	}
	if pol := spec.PersistentVolumeClaimRetentionPolicy; pol != nil {
		pp := p.Child("persistentVolumeClaimRetentionPolicy")
		for _, f := range []struct {
			name string
			v    appsv1.PersistentVolumeClaimRetentionPolicyType
		}{{"whenDeleted", pol.WhenDeleted}, {"whenScaled", pol.WhenScaled}} {
			switch f.v {
			case appsv1.RetainPersistentVolumeClaimRetentionPolicyType, appsv1.DeletePersistentVolumeClaimRetentionPolicyType:
			default:
				errs = append(errs, field.NotSupported(pp.Child(f.name), f.v, []string{string(appsv1.RetainPersistentVolumeClaimRetentionPolicyType), string(appsv1.DeletePersistentVolumeClaimRetentionPolicyType)}))
			}
		}
	}
	errs = append(errs, nonNegative(int32Val(spec.Replicas), p.Child("replicas"))...)
	errs = append(errs, nonNegative(int64(spec.MinReadySeconds), p.Child("minReadySeconds"))...)
	if spec.Ordinals != nil {
		errs = append(errs, nonNegative(int64(spec.Ordinals.Start), p.Child("ordinals.start"))...)
	}
	if creating && spec.ServiceName != "" {
		for _, msg := range validation.IsDNS1123Label(spec.ServiceName) {
			errs = append(errs, field.Invalid(p.Child("serviceName"), spec.ServiceName, msg))
		}
	}
	errs = append(errs, validateSelector(spec.Selector, p.Child("selector"), "statefulset")...)
	selector, err := metav1.LabelSelectorAsSelector(spec.Selector)
	if err != nil {
		errs = append(errs, field.Invalid(p.Child("selector"), spec.Selector, ""))
	} else {
		tp := p.Child("template")
		if !selector.Empty() && !selector.Matches(labels.Set(spec.Template.Labels)) {
			errs = append(errs, field.Invalid(tp.Child("metadata", "labels"), spec.Template.Labels, "`selector` does not match template `labels`"))
		}
		errs = append(errs, validatePodTemplate(&spec.Template, tp)...)
		// The StatefulSet path checks the template's labels and
		// annotations a second time.
		errs = append(errs, metav1validation.ValidateLabels(spec.Template.Labels, tp.Child("labels"))...)
		errs = append(errs, apimachineryvalidation.ValidateAnnotations(spec.Template.Annotations, tp.Child("annotations"))...)
	}
	errs = append(errs, restartAlways(&spec.Template, p.Child("template"), "StatefulSet")...)
	return errs
}

func int64Ptr32(p *int32) int64 { return int32Val(p) }

// validateStatefulSetUpdate refuses changes outside the fields a
// StatefulSet lets change.
func validateStatefulSetUpdate(spec, old *appsv1.StatefulSetSpec) field.ErrorList {
	clone := spec.DeepCopy()
	clone.Replicas = old.Replicas
	clone.Template = old.Template
	clone.UpdateStrategy = old.UpdateStrategy
	clone.MinReadySeconds = old.MinReadySeconds
	clone.Ordinals = old.Ordinals
	clone.RevisionHistoryLimit = old.RevisionHistoryLimit
	clone.PersistentVolumeClaimRetentionPolicy = old.PersistentVolumeClaimRetentionPolicy
	if apiequality.Semantic.DeepEqual(*clone, *old) {
		return nil
	}
	return field.ErrorList{field.Forbidden(field.NewPath("spec"), "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden")}
}

func validateStatefulSetStatus(st *appsv1.StatefulSetStatus, p *field.Path) field.ErrorList {
	errs := nonNegative(int64(st.Replicas), p.Child("replicas"))
	errs = append(errs, nonNegative(int64(st.ReadyReplicas), p.Child("readyReplicas"))...)
	errs = append(errs, nonNegative(int64(st.CurrentReplicas), p.Child("currentReplicas"))...)
	errs = append(errs, nonNegative(int64(st.UpdatedReplicas), p.Child("updatedReplicas"))...)
	errs = append(errs, nonNegative(int64(st.AvailableReplicas), p.Child("availableReplicas"))...)
	errs = append(errs, nonNegative(st.ObservedGeneration, p.Child("observedGeneration"))...)
	if st.CollisionCount != nil {
		errs = append(errs, nonNegative(int64(*st.CollisionCount), p.Child("collisionCount"))...)
	}
	msg := "cannot be greater than status.replicas"
	for _, f := range []struct {
		name string
		v    int32
	}{{"readyReplicas", st.ReadyReplicas}, {"currentReplicas", st.CurrentReplicas}, {"updatedReplicas", st.UpdatedReplicas}} {
		if f.v > st.Replicas {
			errs = append(errs, field.Invalid(p.Child(f.name), f.v, msg))
		}
	}
	if st.AvailableReplicas > st.Replicas {
		errs = append(errs, field.Invalid(p.Child("availableReplicas"), st.AvailableReplicas, msg))
	}
	if st.AvailableReplicas > st.ReadyReplicas {
		errs = append(errs, field.Invalid(p.Child("availableReplicas"), st.AvailableReplicas, "cannot be greater than status.readyReplicas"))
	}
	return errs
}

func internalSTSRollingUpdate(ru *appsv1.RollingUpdateStatefulSetStrategy) *internalSTSRolling {
	if ru == nil {
		return nil
	}
	return &internalSTSRolling{Partition: int32(int32Val(ru.Partition)), MaxUnavailable: ru.MaxUnavailable}
}

func internalSTSStrategy(s appsv1.StatefulSetUpdateStrategy) internalSTSUpdate {
	return internalSTSUpdate{Type: string(s.Type), RollingUpdate: internalSTSRollingUpdate(s.RollingUpdate)}
}
