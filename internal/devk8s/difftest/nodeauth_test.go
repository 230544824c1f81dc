package difftest

import (
	"net/http"
	"testing"
)

// nodeName is the kubelet whose client certificate both servers see.
const nodeName = "difftest-a"

// asNode sends a request with the kubelet's certificate and no token.
func (c *tc) asNode(method, path, ct string, body any) resp {
	c.t.Helper()
	r, err := c.tg.node.do(c.ctx, method, c.path(path), ct, body, "")
	if err != nil {
		c.t.Fatalf("%s %s %s: %v", c.tg.node.name, method, path, err)
	}
	return r
}

// nodeStep summarises an answer to a kubelet: the code, and for a
// refusal its reason, details and message.
func nodeStep(step string, r resp) any {
	if r.Code < 300 {
		out := map[string]any{"step": step, "code": r.Code}
		if items, ok := r.Obj["items"].([]any); ok {
			out["items"] = len(items)
		}
		return out
	}
	return map[string]any{"step": step, "status": summary(r)}
}

func nodeCases() []diffCase {
	var cases []diffCase
	add := func(name string, run func(c *tc) any) { cases = append(cases, diffCase{name: name, run: run}) }
	node := func(name string) map[string]any {
		return map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": name}}
	}
	pod := func(name, bound, secret string) map[string]any {
		return map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": name},
			"spec": map[string]any{"nodeName": bound, "containers": []any{map[string]any{"name": "c", "image": "busybox"}},
				"volumes": []any{map[string]any{"name": "s", "secret": map[string]any{"secretName": secret}}}}}
	}
	secret := func(name string) map[string]any {
		return map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": name}}
	}
	lease := func(name string) map[string]any {
		return map[string]any{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": map[string]any{"name": name}, "spec": map[string]any{"holderIdentity": name}}
	}
	const smp, merge = "application/strategic-merge-patch+json", "application/merge-patch+json"

	// One sequence, as a kubelet goes: register, heartbeat, report, read
	// what its pods need; and the refusals around each step.
	add("node/kubelet", func(c *tc) any {
		other := "other-" + c.ns
		var out []any
		step := func(name string, r resp) { out = append(out, nodeStep(name, r)) }
		c.must(c.post("/api/v1/nodes", node(other)))
		step("create own node", c.asNode(http.MethodPost, "/api/v1/nodes", "", node(nodeName)))
		step("create another node", c.asNode(http.MethodPost, "/api/v1/nodes", "", node("third-"+c.ns)))
		step("get own node", c.asNode(http.MethodGet, "/api/v1/nodes/"+nodeName, "", nil))
		step("get another node", c.asNode(http.MethodGet, "/api/v1/nodes/"+other, "", nil))
		step("list nodes", c.asNode(http.MethodGet, "/api/v1/nodes", "", nil))
		step("list own node by name", c.asNode(http.MethodGet, "/api/v1/nodes?fieldSelector=metadata.name%3D"+nodeName, "", nil))
		step("patch own node status", c.asNode(http.MethodPatch, "/api/v1/nodes/"+nodeName+"/status", smp,
			`{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"ok"}]}}`))
		step("label own node as a kubelet", c.asNode(http.MethodPatch, "/api/v1/nodes/"+nodeName, merge, `{"metadata":{"labels":{"kubernetes.io/hostname":"h","team":"x"}}}`))
		step("label own node with a role", c.asNode(http.MethodPatch, "/api/v1/nodes/"+nodeName, merge, `{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`))
		step("taint own node", c.asNode(http.MethodPatch, "/api/v1/nodes/"+nodeName, merge, `{"spec":{"taints":[{"key":"k","effect":"NoSchedule"}]}}`))
		step("create node with a restricted label", c.asNode(http.MethodPost, "/api/v1/nodes", "", map[string]any{"apiVersion": "v1", "kind": "Node",
			"metadata": map[string]any{"name": nodeName, "labels": map[string]any{"node-restriction.kubernetes.io/pool": "gold"}}}))
		step("patch another node", c.asNode(http.MethodPatch, "/api/v1/nodes/"+other, merge, `{"metadata":{"labels":{"x":"y"}}}`))
		step("patch another node's status", c.asNode(http.MethodPatch, "/api/v1/nodes/"+other+"/status", smp, `{"status":{"phase":"Running"}}`))
		step("delete own node", c.asNode(http.MethodDelete, "/api/v1/nodes/"+nodeName, "", nil))

		step("create own lease", c.asNode(http.MethodPost, "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", "", lease(nodeName)))
		step("create another lease", c.asNode(http.MethodPost, "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", "", lease(other)))
		step("get own lease", c.asNode(http.MethodGet, "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/"+nodeName, "", nil))
		step("list leases", c.asNode(http.MethodGet, "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", "", nil))
		step("lease elsewhere", c.asNode(http.MethodPost, "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", "", lease(nodeName)))

		step("create event", c.asNode(http.MethodPost, "/api/v1/namespaces/{ns}/events", "", map[string]any{
			"apiVersion": "v1", "kind": "Event", "metadata": map[string]any{"name": "e1"}, "reason": "Started", "type": "Normal", "message": "x",
			"involvedObject": map[string]any{"kind": "Pod", "namespace": c.ns, "name": "mine"}}))

		c.must(c.post("/api/v1/namespaces/{ns}/secrets", secret("s-mine")))
		c.must(c.post("/api/v1/namespaces/{ns}/secrets", secret("s-theirs")))
		c.must(c.post("/api/v1/namespaces/{ns}/pods", pod("mine", nodeName, "s-mine")))
		c.must(c.post("/api/v1/namespaces/{ns}/pods", pod("theirs", other, "s-theirs")))
		step("list own pods", c.asNode(http.MethodGet, "/api/v1/pods?fieldSelector=spec.nodeName%3D"+nodeName, "", nil))
		step("list all pods", c.asNode(http.MethodGet, "/api/v1/pods", "", nil))
		step("patch own pod status", c.asNode(http.MethodPatch, "/api/v1/namespaces/{ns}/pods/mine/status", smp, `{"status":{"message":"hi"}}`))
		step("patch another pod's status", c.asNode(http.MethodPatch, "/api/v1/namespaces/{ns}/pods/theirs/status", smp, `{"status":{"message":"hi"}}`))
		step("create a pod", c.asNode(http.MethodPost, "/api/v1/namespaces/{ns}/pods", "", pod("made", nodeName, "s-mine")))
		// kube-apiserver's node graph follows pods asynchronously.
		var mine resp
		c.eventually(func() bool {
			mine = c.asNode(http.MethodGet, "/api/v1/namespaces/{ns}/secrets/s-mine", "", nil)
			return mine.Code == http.StatusOK
		})
		step("get own pod's secret", mine)
		step("get another pod's secret", c.asNode(http.MethodGet, "/api/v1/namespaces/{ns}/secrets/s-theirs", "", nil))
		step("list secrets", c.asNode(http.MethodGet, "/api/v1/namespaces/{ns}/secrets", "", nil))
		step("list namespaces", c.asNode(http.MethodGet, "/api/v1/namespaces", "", nil))
		step("create configmap", c.asNode(http.MethodPost, "/api/v1/namespaces/{ns}/configmaps", "", cm("a", nil, nil)))
		for _, svc := range []struct{ name, clusterIP string }{{"plain", ""}, {"headless", "None"}} {
			spec := map[string]any{"ports": []any{map[string]any{"port": 80}}}
			if svc.clusterIP != "" {
				spec["clusterIP"] = svc.clusterIP
			}
			c.must(c.post("/api/v1/namespaces/{ns}/services", map[string]any{"apiVersion": "v1", "kind": "Service", "metadata": map[string]any{"name": svc.name}, "spec": spec}))
		}
		step("list services", c.asNode(http.MethodGet, "/api/v1/namespaces/{ns}/services", "", nil))
		// As the kubelet's Service informer does (in this namespace: envtest also has default/kubernetes).
		step("list services with a cluster IP", c.asNode(http.MethodGet, "/api/v1/namespaces/{ns}/services?fieldSelector=spec.clusterIP%21%3DNone", "", nil))
		step("whoami", c.asNode(http.MethodPost, "/apis/authentication.k8s.io/v1/selfsubjectreviews", "", selfSubjectReview))
		return out
	})
	return cases
}

func TestNodeIdentity(t *testing.T) { runTable(t, nodeCases()) }
