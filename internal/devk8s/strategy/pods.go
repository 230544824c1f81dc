package strategy

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/nstance-dev/nstance/internal/devk8s/object"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
)

// Pods are core v1 Pods: deleted gracefully when bound to a node, the
// kubelet's part of which (ending the grace period) Sync stands in for.
type Pods struct{ Generic }

// Resource is the registry entry.
func (Pods) Resource() registry.Resource {
	return registry.Resource{Version: "v1", Resource: "pods", Kind: "Pod", Namespaced: true, ShortNames: []string{"po"}, Categories: []string{"all"}, Status: true, Subresources: []string{"eviction"}, Generation: true, BuiltIn: true, ReturnDeleted: true, Storage: true}
}

// PrepareForCreate sets the initial status.
func (Pods) PrepareForCreate(_ *registry.Resource, obj map[string]any) {
	obj["status"] = map[string]any{"phase": "Pending", "qosClass": "BestEffort"}
}

// Default applies the PodSpec and Container defaults clients rely on.
func (Pods) Default(_ *registry.Resource, obj map[string]any) {
	spec := object.ChildMap(obj, "spec")
	object.SetDefault(spec, "restartPolicy", "Always")
	object.SetDefault(spec, "terminationGracePeriodSeconds", int64(30))
	object.SetDefault(spec, "dnsPolicy", "ClusterFirst")
	object.SetDefault(spec, "securityContext", map[string]any{})
	object.SetDefault(spec, "schedulerName", "default-scheduler")
	object.SetDefault(spec, "enableServiceLinks", true)
	object.SetDefault(spec, "priority", int64(0))
	object.SetDefault(spec, "preemptionPolicy", "PreemptLowerPriority")
	for _, c := range object.List(spec["containers"]) {
		m, _ := c.(map[string]any)
		if m == nil {
			continue
		}
		object.SetDefault(m, "terminationMessagePath", "/dev/termination-log")
		object.SetDefault(m, "terminationMessagePolicy", "File")
		object.SetDefault(m, "resources", map[string]any{})
		image := object.Str(m, "image")
		policy := "IfNotPresent"
		if !strings.Contains(image[strings.LastIndex(image, "/")+1:], ":") || strings.HasSuffix(image, ":latest") {
			policy = "Always"
		}
		object.SetDefault(m, "imagePullPolicy", policy)
	}
}

// Validate requires containers with names (and images on create).
func (Pods) Validate(res *registry.Resource, old, obj map[string]any) error {
	name := object.Str(object.Meta(obj), "name")
	gk := res.GVK().GroupKind()
	containers := object.List(object.NestedMap(obj, "spec")["containers"])
	if len(containers) == 0 {
		return apierrors.NewInvalid(gk, name, field.ErrorList{field.Required(field.NewPath("spec", "containers"), "")})
	}
	var errs field.ErrorList
	for i, c := range containers {
		m, _ := c.(map[string]any)
		if object.Str(m, "name") == "" {
			errs = append(errs, field.Required(field.NewPath("spec", "containers").Index(i).Child("name"), ""))
		}
		if object.Str(m, "image") == "" && old == nil {
			errs = append(errs, field.Required(field.NewPath("spec", "containers").Index(i).Child("image"), ""))
		}
	}
	if len(errs) > 0 {
		return apierrors.NewInvalid(gk, name, errs)
	}
	return nil
}

// Fields are the Pod field selectors.
func (Pods) Fields() []Field {
	fs := pathFields("spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName")
	fs = append(fs, boolField("spec.hostNetwork"))
	return append(fs, pathFields("status.phase", "status.podIP", "status.nominatedNodeName")...)
}

// Columns are kubectl's Pod columns.
func (Pods) Columns() []Column {
	return withNameAge(
		Column{Def: metav1.TableColumnDefinition{Name: "Ready", Type: "string"}, Cell: podReady},
		Column{Def: metav1.TableColumnDefinition{Name: "Status", Type: "string"}, Cell: podStatus},
		pathCol("Restarts", "string", 0, "status", "restartCount"),
		pathCol("Node", "string", 1, "spec", "nodeName"),
	)
}

func podReady(o map[string]any) any {
	cs, _ := object.Nested(o, "spec", "containers")
	total := len(object.List(cs))
	ready := 0
	st, _ := object.Nested(o, "status", "containerStatuses")
	for _, c := range object.List(st) {
		if m, _ := c.(map[string]any); m != nil && m["ready"] == true {
			ready++
		}
	}
	return fmt.Sprintf("%d/%d", ready, total)
}

func podStatus(o map[string]any) any {
	if object.HasDeletionTimestamp(o) {
		return "Terminating"
	}
	if p := object.NestedString(o, "status", "phase"); p != "" {
		return p
	}
	return "Pending"
}

// GracePeriod: a pod bound to a node and still running waits for its
// grace period, as a kubelet would finish it.
func (Pods) GracePeriod(obj map[string]any, opts metav1.DeleteOptions) (int64, bool) {
	if object.NestedString(obj, "spec", "nodeName") == "" {
		return 0, false
	}
	switch object.NestedString(obj, "status", "phase") {
	case "Succeeded", "Failed":
		return 0, false
	}
	grace := int64(30)
	if v, ok := object.Nested(obj, "spec", "terminationGracePeriodSeconds"); ok {
		if n, ok := object.Int64(v); ok {
			grace = n
		}
	}
	if opts.GracePeriodSeconds != nil {
		grace = *opts.GracePeriodSeconds
	}
	if grace <= 0 {
		return 0, false
	}
	return grace, true
}

// WaitsForGracePeriod: a pod whose deletion deadline has not passed stays
// even after its last finalizer goes.
func (Pods) WaitsForGracePeriod(obj map[string]any) bool {
	g, _ := object.Int64(object.Meta(obj)["deletionGracePeriodSeconds"])
	return g > 0
}

// Sync ends graceful pod deletions whose deadline passed, standing in for
// the kubelet.
func (Pods) Sync(c Cluster, res *registry.Resource) {
	now := time.Now()
	for _, e := range c.List(res, "") {
		md := object.Meta(e.Object)
		ts, err := time.Parse(time.RFC3339, object.Str(md, "deletionTimestamp"))
		if err != nil || now.Before(ts) {
			continue
		}
		if g, _ := object.Int64(md["deletionGracePeriodSeconds"]); g == 0 {
			continue
		}
		name, ns := object.Str(md, "name"), object.Str(md, "namespace")
		err = c.Mutate(res, ns, name, func(cur map[string]any) (store.Mutation, error) {
			if cur == nil {
				return store.Mutation{}, apierrors.NewNotFound(res.GroupResource(), name)
			}
			cmd := object.Meta(cur)
			cmd["deletionGracePeriodSeconds"] = int64(0)
			if len(finalizers(cmd)) == 0 {
				return store.Mutation{Delete: true}, nil
			}
			return store.Mutation{Object: cur}, nil
		})
		c.LogErr(err, "finish pod deletion")
	}
}

// Wakes: pod deletions wake the collector anyway.
func (Pods) Wakes(store.Event) bool { return false }

// PodReady reports the pod's Ready condition.
func PodReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
