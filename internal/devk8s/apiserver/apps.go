package apiserver

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
)

// The apps/v1 workloads (Deployment, ReplicaSet, StatefulSet, DaemonSet):
// the defaults, create/update preparation and validation kube-apiserver's
// apps registry applies (pkg/apis/apps/v1 defaults, pkg/registry/apps
// strategies, pkg/apis/apps/validation), for the fields controllers and
// clients read. The pod template gets the PodSpec defaults and the
// container checks clients run into, not the whole core validation.

func isApps(res *registry.Resource) bool {
	if !res.BuiltIn || res.Group != "apps" {
		return false
	}
	switch res.Resource {
	case "deployments", "replicasets", "statefulsets", "daemonsets":
		return true
	}
	return false
}

func childMap(m map[string]any, k string) map[string]any {
	c, _ := m[k].(map[string]any)
	if c == nil {
		c = map[string]any{}
		m[k] = c
	}
	return c
}

// appsDefaults applies the apps/v1 defaulting functions to an object
// decoded from a request or a file.
func appsDefaults(res *registry.Resource, obj map[string]any) {
	if !isApps(res) {
		return
	}
	spec := childMap(obj, "spec")
	switch res.Resource {
	case "deployments":
		setDefault(spec, "replicas", int64(1))
		strategy := childMap(spec, "strategy")
		setDefault(strategy, "type", string(appsv1.RollingUpdateDeploymentStrategyType))
		if str(strategy, "type") == string(appsv1.RollingUpdateDeploymentStrategyType) {
			ru := childMap(strategy, "rollingUpdate")
			setDefault(ru, "maxUnavailable", "25%")
			setDefault(ru, "maxSurge", "25%")
		}
		setDefault(spec, "revisionHistoryLimit", int64(10))
		setDefault(spec, "progressDeadlineSeconds", int64(600))
	case "replicasets":
		setDefault(spec, "replicas", int64(1))
	case "daemonsets":
		strategy := childMap(spec, "updateStrategy")
		setDefault(strategy, "type", string(appsv1.RollingUpdateDaemonSetStrategyType))
		if str(strategy, "type") == string(appsv1.RollingUpdateDaemonSetStrategyType) {
			ru := childMap(strategy, "rollingUpdate")
			setDefault(ru, "maxUnavailable", int64(1))
			setDefault(ru, "maxSurge", int64(0))
		}
		setDefault(spec, "revisionHistoryLimit", int64(10))
	case "statefulsets":
		setDefault(spec, "podManagementPolicy", string(appsv1.OrderedReadyPodManagement))
		strategy := childMap(spec, "updateStrategy")
		if str(strategy, "type") == "" {
			strategy["type"] = string(appsv1.RollingUpdateStatefulSetStrategyType)
			childMap(strategy, "rollingUpdate")
		}
		if ru, ok := strategy["rollingUpdate"].(map[string]any); ok && str(strategy, "type") == string(appsv1.RollingUpdateStatefulSetStrategyType) {
			setDefault(ru, "partition", int64(0))
		}
		policy := childMap(spec, "persistentVolumeClaimRetentionPolicy")
		setDefault(policy, "whenDeleted", string(appsv1.RetainPersistentVolumeClaimRetentionPolicyType))
		setDefault(policy, "whenScaled", string(appsv1.RetainPersistentVolumeClaimRetentionPolicyType))
		setDefault(spec, "replicas", int64(1))
		setDefault(spec, "revisionHistoryLimit", int64(10))
	}
	defaultTemplateSpec(childMap(childMap(spec, "template"), "spec"))
}

// defaultTemplateSpec applies SetDefaults_PodSpec and SetDefaults_Container
// (the Pod-only defaults are not applied to templates).
func defaultTemplateSpec(spec map[string]any) {
	setDefault(spec, "dnsPolicy", string(corev1.DNSClusterFirst))
	setDefault(spec, "restartPolicy", string(corev1.RestartPolicyAlways))
	setDefault(spec, "securityContext", map[string]any{})
	setDefault(spec, "terminationGracePeriodSeconds", int64(corev1.DefaultTerminationGracePeriodSeconds))
	setDefault(spec, "schedulerName", corev1.DefaultSchedulerName)
	for _, key := range []string{"initContainers", "containers"} {
		for _, c := range asList(spec[key]) {
			m, _ := c.(map[string]any)
			if m == nil {
				continue
			}
			if str(m, "imagePullPolicy") == "" {
				m["imagePullPolicy"] = string(pullPolicy(str(m, "image")))
			}
			setDefault(m, "terminationMessagePath", corev1.TerminationMessagePathDefault)
			setDefault(m, "terminationMessagePolicy", string(corev1.TerminationMessageReadFile))
			for _, p := range asList(m["ports"]) {
				if pm, _ := p.(map[string]any); pm != nil {
					setDefault(pm, "protocol", string(corev1.ProtocolTCP))
				}
			}
		}
	}
}

// pullPolicy is Always for an untagged or :latest image, IfNotPresent
// otherwise (a digest counts as a tag).
func pullPolicy(image string) corev1.PullPolicy {
	name := image
	digest := false
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '@' {
			name, digest = name[:i], true
			break
		}
	}
	tag := ""
	for i := len(name) - 1; i >= 0 && name[i] != '/'; i-- {
		if name[i] == ':' {
			tag = name[i+1:]
			break
		}
	}
	if tag == "latest" || (tag == "" && !digest) {
		return corev1.PullAlways
	}
	return corev1.PullIfNotPresent
}

// appsPrepareCreate is PrepareForCreate: the status starts empty (the typed
// round trip writes its zero fields) and a DaemonSet's template generation
// starts at 1.
func appsPrepareCreate(res *registry.Resource, obj map[string]any) {
	if !isApps(res) {
		return
	}
	delete(obj, "status")
	if res.Resource == "daemonsets" {
		md := metaOf(obj)
		ann := childMap(md, "annotations")
		if g, err := strconv.ParseInt(str(ann, appsv1.DeprecatedTemplateGeneration), 10, 64); err != nil || g < 1 {
			ann[appsv1.DeprecatedTemplateGeneration] = "1"
		}
	}
}

// appsPrepareUpdate is PrepareForUpdate for writes through the main
// resource, before the generic part compares specs: defaults first (so a
// request that leaves defaulted fields out changes nothing), then the
// DaemonSet template generation (kept from the stored object, bumped with
// the template) and a Deployment's generation that also follows its
// annotations.
func appsPrepareUpdate(res *registry.Resource, sub string, cur, next map[string]any) (bumpGeneration bool) {
	if !isApps(res) || sub != "" {
		return false
	}
	appsDefaults(res, next)
	normalizeApps(res, next)
	md, cmd := metaOf(next), metaOf(cur)
	switch res.Resource {
	case "daemonsets":
		gen, _ := strconv.ParseInt(str(stringAnyMap(cmd["annotations"]), appsv1.DeprecatedTemplateGeneration), 10, 64)
		if !jsonEqual(nestedMap(cur, "spec")["template"], nestedMap(next, "spec")["template"]) {
			gen++
		}
		childMap(md, "annotations")[appsv1.DeprecatedTemplateGeneration] = strconv.FormatInt(gen, 10)
	case "deployments":
		return !jsonEqual(stringAnyMap(cmd["annotations"]), stringAnyMap(md["annotations"]))
	}
	return false
}

func stringAnyMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	if len(m) == 0 {
		return nil
	}
	return m
}

// validateApps runs the apps validation for a create (old nil) or update.
func (s *Server) validateApps(res *registry.Resource, old, obj map[string]any) error {
	name := str(metaOf(obj), "name")
	gk := res.GVK().GroupKind()
	var errs field.ErrorList
	switch res.Resource {
	case "deployments":
		var d, od appsv1.Deployment
		if err := toTyped(obj, &d); err != nil {
			return apierrors.NewBadRequest(err.Error())
		}
		errs = validateDeploymentSpec(&d.Spec, field.NewPath("spec"))
		errs = append(errs, validateDeploymentStatus(&d.Status, field.NewPath("status"))...)
		if old != nil && toTyped(old, &od) == nil {
			errs = append(errs, apimachineryvalidation.ValidateImmutableField(d.Spec.Selector, od.Spec.Selector, field.NewPath("spec", "selector"))...)
		}
	case "replicasets":
		var rs, ors appsv1.ReplicaSet
		if err := toTyped(obj, &rs); err != nil {
			return apierrors.NewBadRequest(err.Error())
		}
		errs = validateReplicaSetSpec(&rs.Spec, field.NewPath("spec"))
		errs = append(errs, validateReplicaSetStatus(&rs.Status, field.NewPath("status"))...)
		if old != nil && toTyped(old, &ors) == nil {
			errs = append(errs, apimachineryvalidation.ValidateImmutableField(rs.Spec.Selector, ors.Spec.Selector, field.NewPath("spec", "selector"))...)
		}
	case "statefulsets":
		var ss, oss appsv1.StatefulSet
		if err := toTyped(obj, &ss); err != nil {
			return apierrors.NewBadRequest(err.Error())
		}
		errs = append(errs, validateStatefulSetSpec(&ss.Spec, field.NewPath("spec"), old == nil)...)
		errs = append(errs, validateStatefulSetStatus(&ss.Status, field.NewPath("status"))...)
		if old != nil && toTyped(old, &oss) == nil {
			errs = append(errs, validateStatefulSetUpdate(&ss.Spec, &oss.Spec)...)
		}
	case "daemonsets":
		var ds, ods appsv1.DaemonSet
		if err := toTyped(obj, &ds); err != nil {
			return apierrors.NewBadRequest(err.Error())
		}
		if old != nil && toTyped(old, &ods) == nil {
			errs = append(errs, apimachineryvalidation.ValidateImmutableField(ds.Spec.Selector, ods.Spec.Selector, field.NewPath("spec", "selector"))...)
		}
		errs = append(errs, validateDaemonSetSpec(&ds.Spec, field.NewPath("spec"))...)
		errs = append(errs, validateDaemonSetStatus(&ds.Status, field.NewPath("status"))...)
	}
	if len(errs) > 0 {
		return apierrors.NewInvalid(gk, name, errs)
	}
	return nil
}

func nonNegative(v int64, p *field.Path) field.ErrorList {
	return apimachineryvalidation.ValidateNonnegativeField(v, p)
}

func int32Val(p *int32) int64 {
	if p == nil {
		return 0
	}
	return int64(*p)
}

// validateSelector checks a workload's selector: required, well formed and
// not empty.
func validateSelector(sel *metav1.LabelSelector, p *field.Path, kind string) field.ErrorList {
	if sel == nil {
		return field.ErrorList{field.Required(p, "")}
	}
	errs := metav1validation.ValidateLabelSelector(sel, metav1validation.LabelSelectorValidationOptions{}, p)
	if len(sel.MatchLabels)+len(sel.MatchExpressions) == 0 {
		errs = append(errs, field.Invalid(p, sel, "empty selector is invalid for "+kind))
	}
	return errs
}

// validateTemplateForSelector is ValidatePodTemplateSpecForReplicaSet.
func validateTemplateForSelector(sel *metav1.LabelSelector, tmpl *corev1.PodTemplateSpec, selPath, p *field.Path, kind string) field.ErrorList {
	selector, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return field.ErrorList{field.Invalid(selPath, sel, "invalid label selector")}
	}
	var errs field.ErrorList
	if !selector.Empty() && !selector.Matches(labels.Set(tmpl.Labels)) {
		errs = append(errs, field.Invalid(p.Child("metadata", "labels"), tmpl.Labels, "`selector` does not match template `labels`"))
	}
	errs = append(errs, validatePodTemplate(tmpl, p)...)
	errs = append(errs, restartAlways(tmpl, p, kind)...)
	return errs
}

func restartAlways(tmpl *corev1.PodTemplateSpec, p *field.Path, kind string) field.ErrorList {
	var errs field.ErrorList
	if tmpl.Spec.RestartPolicy != corev1.RestartPolicyAlways {
		errs = append(errs, field.NotSupported(p.Child("spec", "restartPolicy"), tmpl.Spec.RestartPolicy, []string{string(corev1.RestartPolicyAlways)}))
	}
	if tmpl.Spec.ActiveDeadlineSeconds != nil {
		errs = append(errs, field.Forbidden(p.Child("spec", "activeDeadlineSeconds"), "activeDeadlineSeconds in "+kind+" is not Supported"))
	}
	return errs
}

// validatePodTemplate covers the parts of ValidatePodTemplateSpec that
// clients run into: template labels and annotations, containers present,
// named (DNS labels, unique) and with an image.
func validatePodTemplate(tmpl *corev1.PodTemplateSpec, p *field.Path) field.ErrorList {
	errs := metav1validation.ValidateLabels(tmpl.Labels, p.Child("labels"))
	errs = append(errs, apimachineryvalidation.ValidateAnnotations(tmpl.Annotations, p.Child("annotations"))...)
	sp := p.Child("spec")
	names := sets.New[string]()
	errs = append(errs, validateContainerList(tmpl.Spec.Containers, sp.Child("containers"), names, true)...)
	errs = append(errs, validateContainerList(tmpl.Spec.InitContainers, sp.Child("initContainers"), names, false)...)
	return errs
}

func validateContainerList(cs []corev1.Container, p *field.Path, names sets.Set[string], required bool) field.ErrorList {
	if len(cs) == 0 {
		if required {
			return field.ErrorList{field.Required(p, "")}
		}
		return nil
	}
	var errs field.ErrorList
	for i := range cs {
		c := &cs[i]
		cp := p.Index(i)
		if c.Name == "" {
			errs = append(errs, field.Required(cp.Child("name"), ""))
		} else {
			for _, msg := range validation.IsDNS1123Label(c.Name) {
				errs = append(errs, field.Invalid(cp.Child("name"), c.Name, msg))
			}
		}
		if c.Image == "" {
			errs = append(errs, field.Required(cp.Child("image"), ""))
		}
		if c.Name != "" && names.Has(c.Name) {
			errs = append(errs, field.Duplicate(cp.Child("name"), c.Name))
		}
		names.Insert(c.Name)
	}
	return errs
}

func validatePositiveIntOrPercent(v *intstr.IntOrString, p *field.Path) field.ErrorList {
	if v == nil {
		return nil
	}
	if v.Type == intstr.String {
		var errs field.ErrorList
		for _, msg := range validation.IsValidPercent(v.StrVal) {
			errs = append(errs, field.Invalid(p, *v, msg))
		}
		return errs
	}
	return nonNegative(int64(v.IntValue()), p)
}

func percentValue(v *intstr.IntOrString) (int, bool) {
	if v == nil || v.Type != intstr.String || len(validation.IsValidPercent(v.StrVal)) != 0 {
		return 0, false
	}
	n, _ := strconv.Atoi(v.StrVal[:len(v.StrVal)-1])
	return n, true
}

func intOrPercentValue(v *intstr.IntOrString) int {
	if n, ok := percentValue(v); ok {
		return n
	}
	if v == nil {
		return 0
	}
	return v.IntValue()
}

func notOver100(v *intstr.IntOrString, p *field.Path) field.ErrorList {
	if n, ok := percentValue(v); ok && n > 100 {
		return field.ErrorList{field.Invalid(p, *v, "must not be greater than 100%")}
	}
	return nil
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

func replicaCounts(p *field.Path, replicas int32, counts ...any) field.ErrorList {
	var errs field.ErrorList
	for i := 0; i+1 < len(counts); i += 2 {
		name, v := counts[i].(string), counts[i+1].(int32)
		if v > replicas {
			errs = append(errs, field.Invalid(p.Child(name), v, "cannot be greater than status.replicas"))
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

// appsColumns are kubectl's columns for the apps kinds (Name and Age
// around them).
func appsColumns(resource string) []column {
	num := func(name string, path ...string) column {
		return column{def: metav1.TableColumnDefinition{Name: name, Type: "integer"}, cell: func(o map[string]any) any {
			v, _ := nested(o, path...)
			n, _ := int64Of(v)
			return n
		}}
	}
	ready := column{def: metav1.TableColumnDefinition{Name: "Ready", Type: "string"}, cell: func(o map[string]any) any {
		r, _ := nested(o, "status", "readyReplicas")
		want, _ := nested(o, "spec", "replicas")
		rn, _ := int64Of(r)
		wn, _ := int64Of(want)
		return fmt.Sprintf("%d/%d", rn, wn)
	}}
	switch resource {
	case "deployments":
		upToDate, available := num("Up-to-date", "status", "updatedReplicas"), num("Available", "status", "availableReplicas")
		upToDate.def.Type, available.def.Type = "string", "string"
		return []column{ready, upToDate, available,
			containersCol(), imagesCol(), selectorCol()}
	case "replicasets":
		return []column{num("Desired", "spec", "replicas"), num("Current", "status", "replicas"), num("Ready", "status", "readyReplicas"),
			containersCol(), imagesCol(), selectorCol()}
	case "statefulsets":
		return []column{ready, containersCol(), imagesCol()}
	case "daemonsets":
		return []column{num("Desired", "status", "desiredNumberScheduled"), num("Current", "status", "currentNumberScheduled"),
			num("Ready", "status", "numberReady"), num("Up-to-date", "status", "updatedNumberScheduled"),
			num("Available", "status", "numberAvailable"),
			{def: metav1.TableColumnDefinition{Name: "Node Selector", Type: "string"}, cell: func(o map[string]any) any {
				sel := stringMap(nestedMap(o, "spec", "template", "spec")["nodeSelector"])
				if len(sel) == 0 {
					return "<none>"
				}
				return labels.Set(sel).String()
			}},
			containersCol(), imagesCol(), selectorCol()}
	}
	return nil
}

func templateContainers(o map[string]any, key string) string {
	var out []string
	for _, c := range asList(nestedMap(o, "spec", "template", "spec")["containers"]) {
		m, _ := c.(map[string]any)
		out = append(out, str(m, key))
	}
	return strings.Join(out, ",")
}

func containersCol() column {
	return column{def: metav1.TableColumnDefinition{Name: "Containers", Type: "string", Priority: 1},
		cell: func(o map[string]any) any { return templateContainers(o, "name") }}
}

func imagesCol() column {
	return column{def: metav1.TableColumnDefinition{Name: "Images", Type: "string", Priority: 1},
		cell: func(o map[string]any) any { return templateContainers(o, "image") }}
}

func selectorCol() column {
	return column{def: metav1.TableColumnDefinition{Name: "Selector", Type: "string", Priority: 1}, cell: func(o map[string]any) any {
		var sel metav1.LabelSelector
		if err := toTyped(nestedMap(o, "spec", "selector"), &sel); err != nil {
			return "<invalid>"
		}
		s, err := metav1.LabelSelectorAsSelector(&sel)
		if err != nil {
			return "<invalid>"
		}
		if s.Empty() {
			return "<none>"
		}
		parts := strings.Split(s.String(), ",")
		sort.Strings(parts)
		return strings.Join(parts, ",")
	}}
}

// withAge places the Age column where kubectl shows it: for the apps kinds
// before the wide (priority 1) columns, otherwise last.
func withAge(res *registry.Resource, cols []column) []column {
	if isApps(res) {
		for i, c := range cols {
			if c.def.Priority > 0 {
				return append(cols[:i:i], append([]column{ageCol()}, cols[i:]...)...)
			}
		}
	}
	return append(cols, ageCol())
}

// decodeError answers a request body that does not fit the kind's Go type
// as kube-apiserver's decoder does, naming the field and its type.
func decodeError(res *registry.Resource, obj map[string]any, convErr error) error {
	if !isApps(res) {
		return apierrors.NewBadRequest(fmt.Sprintf("decode %s: %v", res.Kind, convErr))
	}
	msg := convErr.Error()
	if data, err := json.Marshal(obj); err == nil {
		if typed, ok := typedApps(res); ok {
			if err := utiljson.Unmarshal(data, typed); err != nil {
				msg = err.Error()
			}
		}
	}
	return apierrors.NewBadRequest(fmt.Sprintf("%s in version %q cannot be handled as a %s: %s", res.Kind, res.Version, res.Kind, msg))
}

func typedApps(res *registry.Resource) (any, bool) {
	if !isApps(res) {
		return nil, false
	}
	switch res.Resource {
	case "deployments":
		return &appsv1.Deployment{}, true
	case "replicasets":
		return &appsv1.ReplicaSet{}, true
	case "statefulsets":
		return &appsv1.StatefulSet{}, true
	}
	return &appsv1.DaemonSet{}, true
}

// normalizeApps passes an object through its Go type (as decoding does),
// so that comparing it with the stored object sees only real changes.
// Objects that do not decode are left for the round trip to refuse.
func normalizeApps(res *registry.Resource, obj map[string]any) {
	typed, ok := typedApps(res)
	if !ok || runtime.DefaultUnstructuredConverter.FromUnstructured(obj, typed) != nil {
		return
	}
	out, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
	if err != nil {
		return
	}
	for k := range obj {
		delete(obj, k)
	}
	for k, v := range out {
		obj[k] = v
	}
}

// Error values quote kube-apiserver's internal types, which have no JSON
// tags: these mirror them so that messages print the same.
type (
	internalRollingUpdate struct {
		MaxUnavailable intstr.IntOrString
		MaxSurge       intstr.IntOrString
	}
	internalStrategy struct {
		Type          string
		RollingUpdate *internalRollingUpdate
	}
	internalSTSRolling struct {
		Partition      int32
		MaxUnavailable *intstr.IntOrString
	}
	internalSTSUpdate struct {
		Type          string
		RollingUpdate *internalSTSRolling
	}
)

func orZero(v *intstr.IntOrString) intstr.IntOrString {
	if v == nil {
		return intstr.IntOrString{}
	}
	return *v
}

func internalDeploymentStrategy(s appsv1.DeploymentStrategy) internalStrategy {
	out := internalStrategy{Type: string(s.Type)}
	if ru := s.RollingUpdate; ru != nil {
		out.RollingUpdate = &internalRollingUpdate{MaxUnavailable: orZero(ru.MaxUnavailable), MaxSurge: orZero(ru.MaxSurge)}
	}
	return out
}

func internalDSStrategy(s appsv1.DaemonSetUpdateStrategy) internalStrategy {
	out := internalStrategy{Type: string(s.Type)}
	if ru := s.RollingUpdate; ru != nil {
		out.RollingUpdate = &internalRollingUpdate{MaxUnavailable: orZero(ru.MaxUnavailable), MaxSurge: orZero(ru.MaxSurge)}
	}
	return out
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

// normalizeFile prepares a hand-edited object for the store: an apps
// object gets the defaults and type pruning an API write gets (before the
// generic part compares specs for its generation), and a DaemonSet its
// template generation (1 for a new file, bumped when an edit changes the
// template); then the generic server-managed fields.
func (s *Server) normalizeFile(storage string, old, obj map[string]any) {
	if res, ok := s.reg.ByStorageName(storage); ok && isApps(res) {
		appsDefaults(res, obj)
		normalizeApps(res, obj)
		if res.Resource == "daemonsets" {
			ann := childMap(metaOf(obj), "annotations")
			if old == nil {
				if g, err := strconv.ParseInt(str(ann, appsv1.DeprecatedTemplateGeneration), 10, 64); err != nil || g < 1 {
					ann[appsv1.DeprecatedTemplateGeneration] = "1"
				}
			} else {
				gen, _ := strconv.ParseInt(str(stringAnyMap(metaOf(old)["annotations"]), appsv1.DeprecatedTemplateGeneration), 10, 64)
				if !jsonEqual(nestedMap(old, "spec")["template"], nestedMap(obj, "spec")["template"]) {
					gen++
				}
				ann[appsv1.DeprecatedTemplateGeneration] = strconv.FormatInt(gen, 10)
			}
		}
	}
	s.normalizeFileObject(storage, old, obj)
}
