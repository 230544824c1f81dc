package strategy

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
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

	"github.com/nstance-dev/nstance/internal/devk8s/object"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
)

// What the apps/v1 workloads (Deployment, ReplicaSet, StatefulSet,
// DaemonSet) share: the defaults, create/update preparation and validation
// kube-apiserver's apps registry applies (pkg/apis/apps/v1 defaults,
// pkg/registry/apps strategies, pkg/apis/apps/validation), for the fields
// controllers and clients read. The pod template gets the PodSpec defaults
// and the container checks clients run into, not the whole core
// validation. Each kind's own rules are in its file.

// templateSpec returns spec.template.spec, added if missing.
func templateSpec(spec map[string]any) map[string]any {
	return object.ChildMap(object.ChildMap(spec, "template"), "spec")
}

// normalizeTyped passes an object through its Go type (as decoding does),
// so that comparing it with the stored object sees only real changes.
// Objects that do not decode are left for the round trip to refuse.
func normalizeTyped(obj map[string]any, typed any) {
	if runtime.DefaultUnstructuredConverter.FromUnstructured(obj, typed) != nil {
		return
	}
	out, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
	if err != nil {
		return
	}
	object.Replace(obj, out)
}

// appsDecodeError answers a request body that does not fit the kind's Go
// type as kube-apiserver's decoder does, naming the field and its type.
func appsDecodeError(res *registry.Resource, obj map[string]any, convErr error, typed any) error {
	msg := convErr.Error()
	if data, err := json.Marshal(obj); err == nil {
		if err := utiljson.Unmarshal(data, typed); err != nil {
			msg = err.Error()
		}
	}
	return apierrors.NewBadRequest(fmt.Sprintf("%s in version %q cannot be handled as a %s: %s", res.Kind, res.Version, res.Kind, msg))
}

// appsPrepareForCreate: the status starts empty (the typed round trip
// writes its zero fields).
func appsPrepareForCreate(obj map[string]any) { delete(obj, "status") }

// invalid wraps validation errors of obj, nil when there are none.
func invalid(res *registry.Resource, obj map[string]any, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(res.GVK().GroupKind(), object.Str(object.Meta(obj), "name"), errs)
}

// appsColumns are Name, the kind's columns and Age where kubectl shows it
// for the apps kinds: before the wide (priority 1) columns.
func appsColumns(cols ...Column) []Column {
	cols = append([]Column{NameColumn()}, cols...)
	for i, c := range cols {
		if c.Def.Priority > 0 {
			return append(cols[:i:i], append([]Column{AgeColumn()}, cols[i:]...)...)
		}
	}
	return append(cols, AgeColumn())
}

// numCol is an integer column read at a path.
func numCol(name string, path ...string) Column {
	return Column{Def: metav1.TableColumnDefinition{Name: name, Type: "integer"}, Cell: func(o map[string]any) any {
		v, _ := object.Nested(o, path...)
		n, _ := object.Int64(v)
		return n
	}}
}

// readyCol is ready/desired replicas.
func readyCol() Column {
	return Column{Def: metav1.TableColumnDefinition{Name: "Ready", Type: "string"}, Cell: func(o map[string]any) any {
		r, _ := object.Nested(o, "status", "readyReplicas")
		want, _ := object.Nested(o, "spec", "replicas")
		rn, _ := object.Int64(r)
		wn, _ := object.Int64(want)
		return fmt.Sprintf("%d/%d", rn, wn)
	}}
}

// defaultTemplateSpec applies SetDefaults_PodSpec and SetDefaults_Container
// (the Pod-only defaults are not applied to templates).
func defaultTemplateSpec(spec map[string]any) {
	object.SetDefault(spec, "dnsPolicy", string(corev1.DNSClusterFirst))
	object.SetDefault(spec, "restartPolicy", string(corev1.RestartPolicyAlways))
	object.SetDefault(spec, "securityContext", map[string]any{})
	object.SetDefault(spec, "terminationGracePeriodSeconds", int64(corev1.DefaultTerminationGracePeriodSeconds))
	object.SetDefault(spec, "schedulerName", corev1.DefaultSchedulerName)
	for _, key := range []string{"initContainers", "containers"} {
		for _, c := range object.List(spec[key]) {
			m, _ := c.(map[string]any)
			if m == nil {
				continue
			}
			if object.Str(m, "imagePullPolicy") == "" {
				m["imagePullPolicy"] = string(pullPolicy(object.Str(m, "image")))
			}
			object.SetDefault(m, "terminationMessagePath", corev1.TerminationMessagePathDefault)
			object.SetDefault(m, "terminationMessagePolicy", string(corev1.TerminationMessageReadFile))
			for _, p := range object.List(m["ports"]) {
				if pm, _ := p.(map[string]any); pm != nil {
					object.SetDefault(pm, "protocol", string(corev1.ProtocolTCP))
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

func templateContainers(o map[string]any, key string) string {
	var out []string
	for _, c := range object.List(object.NestedMap(o, "spec", "template", "spec")["containers"]) {
		m, _ := c.(map[string]any)
		out = append(out, object.Str(m, key))
	}
	return strings.Join(out, ",")
}

func containersCol() Column {
	return Column{Def: metav1.TableColumnDefinition{Name: "Containers", Type: "string", Priority: 1},
		Cell: func(o map[string]any) any { return templateContainers(o, "name") }}
}

func imagesCol() Column {
	return Column{Def: metav1.TableColumnDefinition{Name: "Images", Type: "string", Priority: 1},
		Cell: func(o map[string]any) any { return templateContainers(o, "image") }}
}

func selectorCol() Column {
	return Column{Def: metav1.TableColumnDefinition{Name: "Selector", Type: "string", Priority: 1}, Cell: func(o map[string]any) any {
		var sel metav1.LabelSelector
		if err := object.ToTyped(object.NestedMap(o, "spec", "selector"), &sel); err != nil {
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

func badRequest(err error) error { return apierrors.NewBadRequest(err.Error()) }
