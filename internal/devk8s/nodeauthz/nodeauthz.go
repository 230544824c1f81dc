package nodeauthz

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apiserver/pkg/authentication/user"
)

const (
	// NodesGroup and NodeUserPrefix identify a kubelet, as kube-apiserver's
	// node identifier does.
	NodesGroup     = user.NodesGroup
	NodeUserPrefix = "system:node:"
	// LeaseNamespace holds the nodes' heartbeat Leases.
	LeaseNamespace = "kube-node-lease"
	// MirrorPodAnnotation marks a pod a kubelet creates for a static pod.
	MirrorPodAnnotation = "kubernetes.io/config.mirror"
)

// Kinds of objects a pod references (Objects.BoundPodUses).
const (
	KindSecret         = "secret"
	KindConfigMap      = "configmap"
	KindServiceAccount = "serviceaccount"
)

// Applies reports whether these rules decide for u: members of
// system:nodes that are not also in system:masters.
func Applies(u user.Info) bool {
	groups := u.GetGroups()
	return slices.Contains(groups, NodesGroup) && !slices.Contains(groups, user.SystemPrivilegedGroup)
}

// NodeName is the node u stands for ("" when its name lacks the
// system:node: prefix).
func NodeName(u user.Info) string {
	name, ok := strings.CutPrefix(u.GetName(), NodeUserPrefix)
	if !ok {
		return ""
	}
	return name
}

// Attributes describe a request as kube-apiserver's RequestInfo does.
type Attributes struct {
	// ResourceRequest is false for paths such as /version or /apis.
	ResourceRequest bool
	// Verb is get, list, watch, create, update, patch, delete or
	// deletecollection for resources; the lower-case HTTP method otherwise.
	Verb        string
	Path        string
	APIGroup    string
	Resource    string
	Subresource string
	Namespace   string
	// Name is the object's name; for list and watch, the value of a
	// metadata.name field selector.
	Name string
	// FieldSelector is the request's fieldSelector (nil when none).
	FieldSelector fields.Selector
}

// Objects answers the questions about stored objects the rules ask.
type Objects interface {
	// PodNode is a stored pod's spec.nodeName; ok is false when the pod
	// does not exist.
	PodNode(namespace, name string) (node string, ok bool)
	// BoundPodUses reports whether a pod bound to node, in namespace,
	// references the object of kind (KindSecret, KindConfigMap or
	// KindServiceAccount) with that name.
	BoundPodUses(node, namespace, kind, name string) bool
}

// Decision is an answer to a request.
type Decision struct {
	Allowed bool
	// Reason says why a request is refused (may be empty).
	Reason string
	// Admission marks a refusal by NodeRestriction's rules (the request
	// was authorized, the object is not the node's), whose message names
	// the node rather than the user.
	Admission bool
}

func allow() Decision                   { return Decision{Allowed: true} }
func deny(reason string) Decision       { return Decision{Reason: reason} }
func refuse(msg string) Decision        { return Decision{Reason: msg, Admission: true} }
func denyf(f string, a ...any) Decision { return deny(fmt.Sprintf(f, a...)) }

// Authorize decides a request of the user u (for whom Applies is true).
// Creates are decided again with the object by AdmitCreate.
func Authorize(u user.Info, a Attributes, objs Objects) Decision {
	if !a.ResourceRequest {
		return nonResource(a)
	}
	if d, ok := everyUser(a); ok {
		return d
	}
	node := NodeName(u)
	if node == "" {
		return deny("")
	}
	gr := schema.GroupResource{Group: a.APIGroup, Resource: a.Resource}
	switch gr {
	case schema.GroupResource{Resource: "nodes"}:
		return nodeRule(node, a)
	case schema.GroupResource{Resource: "pods"}:
		return podRule(node, a, objs)
	case schema.GroupResource{Resource: "secrets"}:
		return referenced(node, a, objs, KindSecret)
	case schema.GroupResource{Resource: "configmaps"}:
		return referenced(node, a, objs, KindConfigMap)
	case schema.GroupResource{Resource: "serviceaccounts"}:
		switch {
		case a.Verb != "create" || a.Name == "":
			return deny("can only create tokens for individual service accounts")
		case a.Subresource != "token":
			return deny("can only create token subresource of serviceaccount")
		}
		return related(node, a.Name, func() bool { return objs.BoundPodUses(node, a.Namespace, KindServiceAccount, a.Name) })
	case schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}:
		return namedAfterNode(node, a, a.Namespace == LeaseNamespace, "can only access leases in the \""+LeaseNamespace+"\" system namespace", "node lease")
	case schema.GroupResource{Group: "storage.k8s.io", Resource: "csinodes"}:
		return namedAfterNode(node, a, true, "", "CSINode")
	}
	if a.Subresource == "" && slices.Contains(staticVerbs(gr), a.Verb) {
		return allow()
	}
	return deny("")
}

// staticVerbs are the kubelet's permissions that do not depend on the
// object: the verbs allowed on a resource.
func staticVerbs(gr schema.GroupResource) []string {
	read := []string{"get", "list", "watch"}
	switch gr {
	case schema.GroupResource{Resource: "services"},
		schema.GroupResource{Group: "storage.k8s.io", Resource: "csidrivers"},
		schema.GroupResource{Group: "node.k8s.io", Resource: "runtimeclasses"}:
		return read
	case schema.GroupResource{Resource: "endpoints"},
		schema.GroupResource{Group: "storage.k8s.io", Resource: "volumeattachments"}:
		return []string{"get"}
	case schema.GroupResource{Resource: "events"},
		schema.GroupResource{Group: "events.k8s.io", Resource: "events"}:
		return []string{"create", "update", "patch"}
	case schema.GroupResource{Group: "authentication.k8s.io", Resource: "tokenreviews"},
		schema.GroupResource{Group: "authorization.k8s.io", Resource: "subjectaccessreviews"},
		schema.GroupResource{Group: "authorization.k8s.io", Resource: "localsubjectaccessreviews"}:
		return []string{"create"}
	case schema.GroupResource{Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}:
		return append(read, "create")
	}
	return nil
}

// everyUser are the permissions every authenticated user has in
// kube-apiserver's default RBAC (system:basic-user).
func everyUser(a Attributes) (Decision, bool) {
	if a.Verb != "create" || a.Subresource != "" {
		return Decision{}, false
	}
	switch {
	case a.APIGroup == "authentication.k8s.io" && a.Resource == "selfsubjectreviews",
		a.APIGroup == "authorization.k8s.io" && (a.Resource == "selfsubjectaccessreviews" || a.Resource == "selfsubjectrulesreviews"):
		return allow(), true
	}
	return Decision{}, false
}

// nonResource allows what system:discovery, system:public-info-viewer
// and the ServiceAccount issuer discovery role allow everyone.
func nonResource(a Attributes) Decision {
	if a.Verb != "get" && a.Verb != "head" {
		return deny("")
	}
	p := a.Path
	switch p {
	case "/api", "/apis", "/version", "/healthz", "/livez", "/readyz", "/openapi/v2",
		"/.well-known/openid-configuration", "/openid/v1/jwks":
		return allow()
	}
	for _, prefix := range []string{"/api/", "/apis/", "/openapi/v3", "/healthz/", "/livez/", "/readyz/"} {
		if strings.HasPrefix(p, prefix) {
			return allow()
		}
	}
	return deny("")
}

func nodeRule(node string, a Attributes) Decision {
	switch a.Subresource {
	case "":
		switch a.Verb {
		case "get", "list", "watch":
			switch a.Name {
			case node:
				return allow()
			case "":
				return denyf("node '%s' cannot read all nodes, only its own Node object", node)
			default:
				return denyf("node '%s' cannot read '%s', only its own Node object", node, a.Name)
			}
		case "create":
			return allow() // the object's name is checked by AdmitCreate
		case "update", "patch":
			return ownNode(node, a.Name)
		}
	case "status":
		if a.Verb == "update" || a.Verb == "patch" {
			return ownNode(node, a.Name)
		}
	}
	return deny("")
}

func ownNode(node, name string) Decision {
	if name == node {
		return allow()
	}
	return refuse(fmt.Sprintf("node %q is not allowed to modify node %q", node, name))
}

func podRule(node string, a Attributes, objs Objects) Decision {
	bound := func() bool {
		n, ok := objs.PodNode(a.Namespace, a.Name)
		return ok && n == node
	}
	switch a.Subresource {
	case "":
		switch a.Verb {
		case "get":
			return related(node, a.Name, bound)
		case "list", "watch":
			if a.FieldSelector != nil {
				for _, r := range a.FieldSelector.Requirements() {
					if r.Field == "spec.nodeName" && (r.Operator == selection.Equals || r.Operator == selection.DoubleEquals) && r.Value == node {
						return allow()
					}
				}
			}
			if a.Name != "" {
				return related(node, a.Name, bound)
			}
			return deny("can only list/watch pods with spec.nodeName field selector")
		case "create":
			return allow() // mirror pods only: AdmitCreate
		case "delete":
			if bound() {
				return allow()
			}
			return refuse(fmt.Sprintf("node %q can only delete pods with spec.nodeName set to itself", node))
		}
	case "status":
		if a.Verb == "update" || a.Verb == "patch" {
			if bound() {
				return allow()
			}
			return refuse(fmt.Sprintf("node %q can only update pod status for pods with spec.nodeName set to itself", node))
		}
	case "eviction":
		if a.Verb == "create" {
			if bound() {
				return allow()
			}
			return refuse(fmt.Sprintf("node %q can only evict pods with spec.nodeName set to itself", node))
		}
	}
	return deny("")
}

// referenced allows reading, by name, an object a pod bound to the node
// uses.
func referenced(node string, a Attributes, objs Objects, kind string) Decision {
	switch {
	case a.Verb != "get" && a.Verb != "list" && a.Verb != "watch":
		return deny("can only read resources of this type")
	case a.Subresource != "":
		return deny("cannot read subresource")
	case a.Namespace == "":
		return deny("can only read namespaced object of this type")
	}
	return related(node, a.Name, func() bool { return objs.BoundPodUses(node, a.Namespace, kind, a.Name) })
}

// related allows a request for a named object that is related to the
// node, with the Node authorizer's reasons otherwise.
func related(node, name string, ok func() bool) Decision {
	if name == "" {
		return deny("No Object name found")
	}
	if ok() {
		return allow()
	}
	return deny("no relationship found between node '" + node + "' and this object")
}

// namedAfterNode is the Lease and CSINode rule: get, create, update, patch
// and delete of the object named after the node.
func namedAfterNode(node string, a Attributes, place bool, placeReason, what string) Decision {
	if a.Subresource != "" {
		return denyf("cannot authorize %s subresources", what)
	}
	switch a.Verb {
	case "get", "create", "update", "patch", "delete":
	default:
		return denyf("can only get, create, update, patch, or delete a %s", what)
	}
	if !place {
		return deny(placeReason)
	}
	if a.Verb != "create" && a.Name != node {
		return denyf("can only access %s with the same name as the requesting node", what)
	}
	return allow()
}

// AdmitCreate checks a create's object as NodeRestriction does: a node
// creates only its own Node, Lease and CSINode, and only mirror pods bound
// to itself. It returns a 403 error, or nil.
func AdmitCreate(u user.Info, a Attributes, obj map[string]any) error {
	node := NodeName(u)
	meta, _ := obj["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	gr := schema.GroupResource{Group: a.APIGroup, Resource: a.Resource}
	var msg string
	switch gr {
	case schema.GroupResource{Resource: "nodes"}:
		if name != node {
			msg = fmt.Sprintf("node %q is not allowed to modify node %q", node, name)
			break
		}
		return AdmitNodeWrite(u, nil, obj)
	case schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}:
		if name != node {
			msg = "can only access node lease with the same name as the requesting node"
		}
	case schema.GroupResource{Group: "storage.k8s.io", Resource: "csinodes"}:
		if name != node {
			msg = "can only access CSINode with the same name as the requesting node"
		}
	case schema.GroupResource{Resource: "pods"}:
		ann, _ := meta["annotations"].(map[string]any)
		spec, _ := obj["spec"].(map[string]any)
		bound, _ := spec["nodeName"].(string)
		if _, mirror := ann[MirrorPodAnnotation]; !mirror {
			msg = fmt.Sprintf("pod does not have %q annotation, node %q can only create mirror pods", MirrorPodAnnotation, node)
		} else if bound != node {
			msg = fmt.Sprintf("node %q can only create pods with spec.nodeName set to itself", node)
		}
	}
	if msg == "" {
		return nil
	}
	return apierrors.NewForbidden(gr, name, errors.New(msg))
}

// Error is the 403 answer to a refused request, shaped like
// kube-apiserver's.
func (d Decision) Error(u user.Info, a Attributes) error {
	if !a.ResourceRequest {
		return apierrors.NewForbidden(schema.GroupResource{}, "", fmt.Errorf("User %q cannot %s path %q", u.GetName(), a.Verb, a.Path))
	}
	gr := schema.GroupResource{Group: a.APIGroup, Resource: a.Resource}
	if d.Admission {
		return apierrors.NewForbidden(gr, a.Name, errors.New(d.Reason))
	}
	res := a.Resource
	if a.Subresource != "" {
		res = path.Join(res, a.Subresource)
	}
	msg := fmt.Sprintf("User %q cannot %s resource %q in API group %q", u.GetName(), a.Verb, res, a.APIGroup)
	if a.Namespace != "" {
		msg += fmt.Sprintf(" in the namespace %q", a.Namespace)
	} else {
		msg += " at the cluster scope"
	}
	if d.Reason != "" {
		msg += ": " + d.Reason
	}
	return apierrors.NewForbidden(gr, a.Name, errors.New(msg))
}
