package apiserver

import (
	"net/http"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/authentication/user"
	genericrequest "k8s.io/apiserver/pkg/endpoints/request"

	"github.com/nstance-dev/nstance/internal/devk8s/auth"
	"github.com/nstance-dev/nstance/internal/devk8s/nodeauthz"
)

// newRequestInfoFactory reads a request's verb, resource and name as
// kube-apiserver does before authorization.
func newRequestInfoFactory() *genericrequest.RequestInfoFactory {
	return &genericrequest.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}
}

// nodeAttributes describes r for the node rules.
func (s *Server) nodeAttributes(r *http.Request) (nodeauthz.Attributes, error) {
	info, err := s.requestInfo.NewRequestInfo(r)
	if err != nil {
		return nodeauthz.Attributes{}, err
	}
	a := nodeauthz.Attributes{
		ResourceRequest: info.IsResourceRequest, Verb: info.Verb, Path: info.Path,
		APIGroup: info.APIGroup, Resource: info.Resource, Subresource: info.Subresource,
		Namespace: info.Namespace, Name: info.Name,
	}
	if raw := r.URL.Query().Get("fieldSelector"); raw != "" {
		if sel, err := fields.ParseSelector(raw); err == nil {
			a.FieldSelector = sel
		}
	}
	return a, nil
}

// authorizeNode answers false (after writing a 403) when u is a kubelet's
// identity that may not make request r. Every other user may do everything.
func (s *Server) authorizeNode(w http.ResponseWriter, r *http.Request, u user.Info) bool {
	if !nodeauthz.Applies(u) {
		return true
	}
	a, err := s.nodeAttributes(r)
	if err != nil {
		writeError(w, err)
		return false
	}
	d := nodeauthz.Authorize(u, a, nodeObjects{s})
	if d.Allowed {
		return true
	}
	s.log.V(1).Info("forbidden node request", "user", u.GetName(), "verb", a.Verb, "resource", a.Resource, "subresource", a.Subresource, "namespace", a.Namespace, "name", a.Name, "path", a.Path, "reason", d.Reason)
	writeError(w, d.Error(u, a))
	return false
}

// admitNodeCreate runs NodeRestriction's checks of a new object when the
// request comes from a kubelet's identity.
func (s *Server) admitNodeCreate(r *http.Request, rq request, obj map[string]any) error {
	u, ok := auth.UserFrom(r.Context())
	if !ok || !nodeauthz.Applies(u) {
		return nil
	}
	return nodeauthz.AdmitCreate(u, nodeauthz.Attributes{ResourceRequest: true, Verb: "create", APIGroup: rq.res.Group, Resource: rq.res.Resource, Namespace: rq.namespace}, obj)
}

// admitNodeUpdate runs NodeRestriction's checks of a kubelet's update of
// its own Node (taints, ownerReferences, labels).
func admitNodeUpdate(rq request, cur, next map[string]any) error {
	if rq.user == nil || !nodeauthz.Applies(rq.user) || !rq.res.BuiltIn {
		return nil
	}
	return nodeauthz.AdmitUpdate(rq.user, nodeauthz.Attributes{ResourceRequest: true, Verb: "update", APIGroup: rq.res.Group, Resource: rq.res.Resource, Namespace: rq.namespace}, cur, next)
}

// nodeObjects answers the node rules' questions from the store.
type nodeObjects struct{ s *Server }

func (o nodeObjects) PodNode(namespace, name string) (string, bool) {
	e, ok := o.s.store.Get("pods", namespace, name)
	if !ok {
		return "", false
	}
	spec, _ := e.Object["spec"].(map[string]any)
	node, _ := spec["nodeName"].(string)
	return node, true
}

func (o nodeObjects) BoundPodUses(node, namespace, kind, name string) bool {
	pods, _ := o.s.store.List("pods", namespace)
	for _, e := range pods {
		spec, _ := e.Object["spec"].(map[string]any)
		if bound, _ := spec["nodeName"].(string); bound == node && nodeauthz.PodUses(e.Object, kind, name) {
			return true
		}
	}
	return false
}
