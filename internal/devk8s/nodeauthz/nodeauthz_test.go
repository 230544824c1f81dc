package nodeauthz

import (
	"testing"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apiserver/pkg/authentication/user"
)

// fakeObjects: pods by namespace/name with their node and their spec.
type fakeObjects map[string]map[string]any

func (f fakeObjects) PodNode(namespace, name string) (string, bool) {
	pod, ok := f[namespace+"/"+name]
	if !ok {
		return "", false
	}
	spec, _ := pod["spec"].(map[string]any)
	node, _ := spec["nodeName"].(string)
	return node, true
}

func (f fakeObjects) BoundPodUses(node, namespace, kind, name string) bool {
	for key, pod := range f {
		if n, _ := f.PodNode(splitKey(key)); n == node && key[:len(namespace)+1] == namespace+"/" && PodUses(pod, kind, name) {
			return true
		}
	}
	return false
}

func splitKey(k string) (string, string) {
	for i := range k {
		if k[i] == '/' {
			return k[:i], k[i+1:]
		}
	}
	return "", k
}

func res(verb, group, resource, sub, ns, name string) Attributes {
	return Attributes{ResourceRequest: true, Verb: verb, APIGroup: group, Resource: resource, Subresource: sub, Namespace: ns, Name: name}
}

func withSelector(a Attributes, sel string) Attributes {
	a.FieldSelector = fields.ParseSelectorOrDie(sel)
	return a
}

func TestAuthorize(t *testing.T) {
	nodeA := &user.DefaultInfo{Name: "system:node:a", Groups: []string{NodesGroup, user.AllAuthenticated}}
	objs := fakeObjects{
		"ns/on-a": {"spec": map[string]any{"nodeName": "a", "serviceAccountName": "robot",
			"volumes":    []any{map[string]any{"secret": map[string]any{"secretName": "vol-secret"}}, map[string]any{"projected": map[string]any{"sources": []any{map[string]any{"configMap": map[string]any{"name": "proj-cm"}}}}}},
			"containers": []any{map[string]any{"env": []any{map[string]any{"valueFrom": map[string]any{"secretKeyRef": map[string]any{"name": "env-secret"}}}}, "envFrom": []any{map[string]any{"configMapRef": map[string]any{"name": "envfrom-cm"}}}}}}},
		"ns/on-b":      {"spec": map[string]any{"nodeName": "b", "volumes": []any{map[string]any{"secret": map[string]any{"secretName": "b-secret"}}}}},
		"ns/unbound":   {"spec": map[string]any{}},
		"other/on-a-2": {"spec": map[string]any{"nodeName": "a", "imagePullSecrets": []any{map[string]any{"name": "pull"}}}},
	}
	cases := []struct {
		name  string
		a     Attributes
		allow bool
	}{
		{"get own node", res("get", "", "nodes", "", "", "a"), true},
		{"watch own node by name", res("watch", "", "nodes", "", "", "a"), true},
		{"get other node", res("get", "", "nodes", "", "", "b"), false},
		{"list all nodes", res("list", "", "nodes", "", "", ""), false},
		{"create node (name checked on the object)", res("create", "", "nodes", "", "", ""), true},
		{"patch own node", res("patch", "", "nodes", "", "", "a"), true},
		{"patch other node", res("patch", "", "nodes", "", "", "b"), false},
		{"update own node status", res("update", "", "nodes", "status", "", "a"), true},
		{"patch other node status", res("patch", "", "nodes", "status", "", "b"), false},
		{"delete own node", res("delete", "", "nodes", "", "", "a"), false},
		{"get own lease", res("get", "coordination.k8s.io", "leases", "", LeaseNamespace, "a"), true},
		{"create lease", res("create", "coordination.k8s.io", "leases", "", LeaseNamespace, ""), true},
		{"update own lease", res("update", "coordination.k8s.io", "leases", "", LeaseNamespace, "a"), true},
		{"update other lease", res("update", "coordination.k8s.io", "leases", "", LeaseNamespace, "b"), false},
		{"own-named lease elsewhere", res("get", "coordination.k8s.io", "leases", "", "default", "a"), false},
		{"list leases", res("list", "coordination.k8s.io", "leases", "", LeaseNamespace, ""), false},
		{"create core event", res("create", "", "events", "", "default", ""), true},
		{"patch events.k8s.io event", res("patch", "events.k8s.io", "events", "", "default", "x"), true},
		{"delete event", res("delete", "", "events", "", "default", "x"), false},
		{"watch own pods", withSelector(res("watch", "", "pods", "", "", ""), "spec.nodeName=a"), true},
		{"list other node's pods", withSelector(res("list", "", "pods", "", "", ""), "spec.nodeName=b"), false},
		{"list all pods", res("list", "", "pods", "", "", ""), false},
		{"get bound pod", res("get", "", "pods", "", "ns", "on-a"), true},
		{"get other node's pod", res("get", "", "pods", "", "ns", "on-b"), false},
		{"update bound pod status", res("update", "", "pods", "status", "ns", "on-a"), true},
		{"patch other pod status", res("patch", "", "pods", "status", "ns", "on-b"), false},
		{"patch unbound pod status", res("patch", "", "pods", "status", "ns", "unbound"), false},
		{"patch bound pod spec", res("patch", "", "pods", "", "ns", "on-a"), false},
		{"delete bound pod", res("delete", "", "pods", "", "ns", "on-a"), true},
		{"delete other pod", res("delete", "", "pods", "", "ns", "on-b"), false},
		{"evict bound pod", res("create", "", "pods", "eviction", "ns", "on-a"), true},
		{"create pod (mirror only, checked on the object)", res("create", "", "pods", "", "ns", ""), true},
		{"get volume secret", res("get", "", "secrets", "", "ns", "vol-secret"), true},
		{"watch env secret by name", res("watch", "", "secrets", "", "ns", "env-secret"), true},
		{"get pull secret", res("get", "", "secrets", "", "other", "pull"), true},
		{"get other node's secret", res("get", "", "secrets", "", "ns", "b-secret"), false},
		{"list secrets", res("list", "", "secrets", "", "ns", ""), false},
		{"list all secrets", res("list", "", "secrets", "", "", ""), false},
		{"get projected configmap", res("get", "", "configmaps", "", "ns", "proj-cm"), true},
		{"get envFrom configmap", res("get", "", "configmaps", "", "ns", "envfrom-cm"), true},
		{"get unrelated configmap", res("get", "", "configmaps", "", "ns", "x"), false},
		{"update referenced secret", res("update", "", "secrets", "", "ns", "vol-secret"), false},
		{"token of bound pod's service account", res("create", "", "serviceaccounts", "token", "ns", "robot"), true},
		{"token of default service account of a bound pod", res("create", "", "serviceaccounts", "token", "other", "default"), true},
		{"token of other service account", res("create", "", "serviceaccounts", "token", "ns", "default"), false},
		{"list services", res("list", "", "services", "", "", ""), true},
		{"create service", res("create", "", "services", "", "ns", ""), false},
		{"get endpoints", res("get", "", "endpoints", "", "ns", "x"), true},
		{"get own csinode", res("get", "storage.k8s.io", "csinodes", "", "", "a"), true},
		{"patch other csinode", res("patch", "storage.k8s.io", "csinodes", "", "", "b"), false},
		{"watch csidrivers", res("watch", "storage.k8s.io", "csidrivers", "", "", ""), true},
		{"list runtimeclasses", res("list", "node.k8s.io", "runtimeclasses", "", "", ""), true},
		{"whoami", res("create", "authentication.k8s.io", "selfsubjectreviews", "", "", ""), true},
		{"create csr", res("create", "certificates.k8s.io", "certificatesigningrequests", "", "", ""), true},
		{"approve csr", res("update", "certificates.k8s.io", "certificatesigningrequests", "approval", "", "x"), false},
		{"list namespaces", res("list", "", "namespaces", "", "", ""), false},
		{"create deployment", res("create", "apps", "deployments", "", "ns", ""), false},
		{"list crds", res("list", "apiextensions.k8s.io", "customresourcedefinitions", "", "", ""), false},
		{"discovery", Attributes{Verb: "get", Path: "/apis"}, true},
		{"group discovery", Attributes{Verb: "get", Path: "/apis/apps/v1"}, true},
		{"version", Attributes{Verb: "get", Path: "/version"}, true},
		{"openapi", Attributes{Verb: "get", Path: "/openapi/v3/api/v1"}, true},
		{"metrics", Attributes{Verb: "get", Path: "/metrics"}, false},
		{"post to a path", Attributes{Verb: "post", Path: "/version"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Authorize(nodeA, tc.a, objs)
			require.Equal(t, tc.allow, d.Allowed, "reason %q", d.Reason)
			if !d.Allowed {
				require.True(t, apierrors.IsForbidden(d.Error(nodeA, tc.a)))
			}
		})
	}
}

func TestWhoTheRulesApplyTo(t *testing.T) {
	require.True(t, Applies(&user.DefaultInfo{Name: "system:node:a", Groups: []string{NodesGroup}}))
	require.False(t, Applies(&user.DefaultInfo{Name: "system:node:a", Groups: []string{NodesGroup, user.SystemPrivilegedGroup}}), "system:masters may do everything")
	require.False(t, Applies(&user.DefaultInfo{Name: "system:node:a"}), "a name alone is not a node")
	require.False(t, Applies(&user.DefaultInfo{Name: "alice", Groups: []string{"dev"}}))

	// In system:nodes without a node name: only discovery.
	odd := &user.DefaultInfo{Name: "kubelet", Groups: []string{NodesGroup}}
	require.True(t, Applies(odd))
	require.False(t, Authorize(odd, res("get", "", "nodes", "", "", "kubelet"), fakeObjects{}).Allowed)
	require.True(t, Authorize(odd, Attributes{Verb: "get", Path: "/api"}, fakeObjects{}).Allowed)
}

func TestForbiddenMessages(t *testing.T) {
	u := &user.DefaultInfo{Name: "system:node:a", Groups: []string{NodesGroup}}
	a := res("patch", "", "nodes", "", "", "b")
	err := Authorize(u, a, fakeObjects{}).Error(u, a)
	require.Equal(t, `nodes "b" is forbidden: node "a" is not allowed to modify node "b"`, err.Error())
	a = res("list", "", "secrets", "", "ns", "")
	err = Authorize(u, a, fakeObjects{}).Error(u, a)
	require.Equal(t, `secrets is forbidden: User "system:node:a" cannot list resource "secrets" in API group "" in the namespace "ns": No Object name found`, err.Error())
	a = res("list", "", "nodes", "", "", "")
	err = Authorize(u, a, fakeObjects{}).Error(u, a)
	require.Equal(t, `nodes is forbidden: User "system:node:a" cannot list resource "nodes" in API group "" at the cluster scope: node 'a' cannot read all nodes, only its own Node object`, err.Error())
	a = Attributes{Verb: "get", Path: "/metrics"}
	err = Authorize(u, a, fakeObjects{}).Error(u, a)
	require.Equal(t, `forbidden: User "system:node:a" cannot get path "/metrics"`, err.Error())
}

func TestAdmitCreate(t *testing.T) {
	u := &user.DefaultInfo{Name: "system:node:a", Groups: []string{NodesGroup}}
	obj := func(name string, ann map[string]any, nodeName string) map[string]any {
		md := map[string]any{"name": name}
		if ann != nil {
			md["annotations"] = ann
		}
		return map[string]any{"metadata": md, "spec": map[string]any{"nodeName": nodeName}}
	}
	mirror := map[string]any{MirrorPodAnnotation: "x"}
	for _, tc := range []struct {
		name string
		a    Attributes
		obj  map[string]any
		ok   bool
	}{
		{"own node", res("create", "", "nodes", "", "", ""), obj("a", nil, ""), true},
		{"other node", res("create", "", "nodes", "", "", ""), obj("b", nil, ""), false},
		{"own lease", res("create", "coordination.k8s.io", "leases", "", LeaseNamespace, ""), obj("a", nil, ""), true},
		{"other lease", res("create", "coordination.k8s.io", "leases", "", LeaseNamespace, ""), obj("b", nil, ""), false},
		{"own csinode", res("create", "storage.k8s.io", "csinodes", "", "", ""), obj("a", nil, ""), true},
		{"other csinode", res("create", "storage.k8s.io", "csinodes", "", "", ""), obj("b", nil, ""), false},
		{"mirror pod bound to itself", res("create", "", "pods", "", "ns", ""), obj("p", mirror, "a"), true},
		{"mirror pod bound elsewhere", res("create", "", "pods", "", "ns", ""), obj("p", mirror, "b"), false},
		{"ordinary pod", res("create", "", "pods", "", "ns", ""), obj("p", nil, "a"), false},
		{"event", res("create", "", "events", "", "ns", ""), obj("e", nil, ""), true},
	} {
		err := AdmitCreate(u, tc.a, tc.obj)
		if tc.ok {
			require.NoError(t, err, tc.name)
		} else {
			require.True(t, apierrors.IsForbidden(err), "%s: %v", tc.name, err)
		}
	}
}

func TestAdmitNodeWrite(t *testing.T) {
	u := &user.DefaultInfo{Name: "system:node:a", Groups: []string{NodesGroup}}
	nodeObj := func(labels map[string]any, taints []any, owners []any) map[string]any {
		md := map[string]any{"name": "a"}
		if labels != nil {
			md["labels"] = labels
		}
		if owners != nil {
			md["ownerReferences"] = owners
		}
		spec := map[string]any{}
		if taints != nil {
			spec["taints"] = taints
		}
		return map[string]any{"metadata": md, "spec": spec}
	}
	taint := []any{map[string]any{"key": "dedicated", "effect": "NoSchedule"}}
	kubelet := map[string]any{"kubernetes.io/hostname": "a", "kubernetes.io/os": "linux", "node.kubernetes.io/exclude-from-external-load-balancers": "", "team": "x"}
	require.NoError(t, AdmitNodeWrite(u, nil, nodeObj(kubelet, nil, nil)))
	err := AdmitNodeWrite(u, nil, nodeObj(map[string]any{"node-role.kubernetes.io/control-plane": ""}, nil, nil))
	require.True(t, apierrors.IsForbidden(err))
	require.Contains(t, err.Error(), `node "a" is not allowed to set the following labels: node-role.kubernetes.io/control-plane`)

	base := nodeObj(kubelet, taint, nil)
	require.NoError(t, AdmitNodeWrite(u, base, nodeObj(kubelet, taint, []any{})), "an empty list equals a missing one")
	require.NoError(t, AdmitNodeWrite(u, base, nodeObj(map[string]any{"kubernetes.io/hostname": "a2", "team": "y"}, taint, nil)), "kubelet and user labels may change")
	for name, next := range map[string]map[string]any{
		"taints removed":      nodeObj(kubelet, nil, nil),
		"owner added":         nodeObj(kubelet, taint, []any{map[string]any{"name": "x"}}),
		"restricted label":    nodeObj(map[string]any{"node-restriction.kubernetes.io/pool": "gold"}, taint, nil),
		"kubernetes.io label": nodeObj(map[string]any{"node-role.kubernetes.io/worker": ""}, taint, nil),
	} {
		require.True(t, apierrors.IsForbidden(AdmitNodeWrite(u, base, next)), name)
	}
}
