package apiserver

import (
	"reflect"
	"strings"

	"k8s.io/apimachinery/pkg/util/uuid"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
)

// defaultCreate applies the defaults kube-apiserver gives new built-in
// objects that clients commonly rely on.
func (s *Server) defaultCreate(res *registry.Resource, obj map[string]any) {
	if !res.BuiltIn {
		return
	}
	appsPrepareCreate(res, obj)
	switch res.Resource {
	case "namespaces":
		md := metaOf(obj)
		lbls, _ := md["labels"].(map[string]any)
		if lbls == nil {
			lbls = map[string]any{}
			md["labels"] = lbls
		}
		lbls["kubernetes.io/metadata.name"] = str(md, "name")
		obj["spec"] = map[string]any{"finalizers": []any{"kubernetes"}}
		obj["status"] = map[string]any{"phase": "Active"}
	case "pods":
		obj["status"] = map[string]any{"phase": "Pending", "qosClass": "BestEffort"}
	case "customresourcedefinitions":
		defaultCRD(obj)
	case "poddisruptionbudgets":
		obj["status"] = map[string]any{"disruptionsAllowed": int64(0), "currentHealthy": int64(0), "desiredHealthy": int64(0), "expectedPods": int64(0)}
	case "nodes":
		spec, _ := obj["spec"].(map[string]any)
		if spec == nil {
			spec = map[string]any{}
			obj["spec"] = spec
		}
		// The TaintNodesByCondition admission plugin marks new nodes not ready.
		taints := asList(spec["taints"])
		found := false
		for _, t := range taints {
			if m, _ := t.(map[string]any); str(m, "key") == "node.kubernetes.io/not-ready" {
				found = true
			}
		}
		if !found {
			spec["taints"] = append(taints, map[string]any{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
		}
	}
}

func setDefault(m map[string]any, k string, v any) {
	if _, ok := m[k]; !ok {
		m[k] = v
	}
}

func defaultPod(obj map[string]any) {
	spec, _ := obj["spec"].(map[string]any)
	if spec == nil {
		spec = map[string]any{}
		obj["spec"] = spec
	}
	setDefault(spec, "restartPolicy", "Always")
	setDefault(spec, "terminationGracePeriodSeconds", int64(30))
	setDefault(spec, "dnsPolicy", "ClusterFirst")
	setDefault(spec, "securityContext", map[string]any{})
	setDefault(spec, "schedulerName", "default-scheduler")
	setDefault(spec, "enableServiceLinks", true)
	setDefault(spec, "priority", int64(0))
	setDefault(spec, "preemptionPolicy", "PreemptLowerPriority")
	for _, c := range asList(spec["containers"]) {
		m, _ := c.(map[string]any)
		if m == nil {
			continue
		}
		setDefault(m, "terminationMessagePath", "/dev/termination-log")
		setDefault(m, "terminationMessagePolicy", "File")
		setDefault(m, "resources", map[string]any{})
		image := str(m, "image")
		policy := "IfNotPresent"
		if !strings.Contains(image[strings.LastIndex(image, "/")+1:], ":") || strings.HasSuffix(image, ":latest") {
			policy = "Always"
		}
		setDefault(m, "imagePullPolicy", policy)
	}
}

// decodeDefaults are the defaults kube-apiserver applies whenever it decodes
// a built-in object (create, update and patch alike).
func decodeDefaults(res *registry.Resource, obj map[string]any) {
	appsDefaults(res, obj)
	switch res.Resource {
	case "pods":
		defaultPod(obj)
	case "secrets":
		if str(obj, "type") == "" {
			obj["type"] = "Opaque"
		}
	case "nodes":
		if spec, _ := obj["spec"].(map[string]any); spec != nil {
			if cidr := str(spec, "podCIDR"); cidr != "" {
				if _, ok := spec["podCIDRs"]; !ok {
					spec["podCIDRs"] = []any{cidr}
				}
			}
		}
	}
}

// roundTrip passes a built-in object through its Go type, as
// kube-apiserver's decoding and encoding do: unknown fields go, and fields
// the type always writes appear.
func (s *Server) roundTrip(res *registry.Resource, obj map[string]any) (map[string]any, error) {
	if !res.BuiltIn {
		return obj, nil
	}
	typed, err := s.scheme.New(res.GVK())
	if err != nil {
		return obj, nil
	}
	decodeDefaults(res, obj)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, typed); err != nil {
		return nil, decodeError(res, obj, err)
	}
	out, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	out["apiVersion"], out["kind"] = res.APIVersion(), res.Kind
	return out, nil
}

// validate applies the few validation rules clients run into.
func (s *Server) validate(res *registry.Resource, old, obj map[string]any) error {
	if !res.BuiltIn {
		return nil
	}
	name := str(metaOf(obj), "name")
	gk := res.GVK().GroupKind()
	if isApps(res) {
		return s.validateApps(res, old, obj)
	}
	switch res.Resource {
	case "customresourcedefinitions":
		return validateCRD(obj)
	case "pods":
		containers := asList(nestedMap(obj, "spec")["containers"])
		if len(containers) == 0 {
			return apierrors.NewInvalid(gk, name, field.ErrorList{field.Required(field.NewPath("spec", "containers"), "")})
		}
		var errs field.ErrorList
		for i, c := range containers {
			m, _ := c.(map[string]any)
			if str(m, "name") == "" {
				errs = append(errs, field.Required(field.NewPath("spec", "containers").Index(i).Child("name"), ""))
			}
			if str(m, "image") == "" && old == nil {
				errs = append(errs, field.Required(field.NewPath("spec", "containers").Index(i).Child("image"), ""))
			}
		}
		if len(errs) > 0 {
			return apierrors.NewInvalid(gk, name, errs)
		}
	case "configmaps", "secrets":
		if old != nil && old["immutable"] == true && !mapsEqual(old, obj, "data", "binaryData") {
			return apierrors.NewInvalid(gk, name, field.ErrorList{field.Forbidden(field.NewPath("data"), "field is immutable when `immutable` is set")})
		}
	}
	return nil
}

func mapsEqual(a, b map[string]any, keys ...string) bool {
	for _, k := range keys {
		if !jsonEqual(a[k], b[k]) {
			return false
		}
	}
	return true
}

// normalizeFileObject fills server-managed fields of a hand-edited file.
func (s *Server) normalizeFileObject(storage string, old, obj map[string]any) {
	res, ok := s.reg.ByStorageName(storage)
	if !ok {
		return
	}
	if str(obj, "apiVersion") == "" {
		obj["apiVersion"] = res.APIVersion()
	}
	if str(obj, "kind") == "" {
		obj["kind"] = res.Kind
	}
	md := metaOf(obj)
	if old != nil {
		omd := metaOf(old)
		for _, k := range []string{"uid", "creationTimestamp"} {
			if str(md, k) == "" {
				md[k] = omd[k]
			}
		}
		if res.Generation {
			g := generationOf(omd)
			if specChanged(old, obj) {
				g++
			}
			md["generation"] = g
		}
		return
	}
	if str(md, "uid") == "" || str(md, "creationTimestamp") == "" {
		if str(md, "uid") == "" {
			md["uid"] = string(uuid.NewUUID())
		}
		if str(md, "creationTimestamp") == "" {
			md["creationTimestamp"] = timestamp(timeNow())
		}
	}
	if res.Generation {
		if _, ok := int64Of(md["generation"]); !ok {
			md["generation"] = int64(1)
		}
	}
	if res.Resource == "customresourcedefinitions" && res.Group == "apiextensions.k8s.io" {
		if _, ok := obj["status"]; !ok {
			defaultCRD(obj)
		}
	}
}

func jsonEqual(a, b any) bool { return reflect.DeepEqual(a, b) }
