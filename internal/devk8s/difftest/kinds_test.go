package difftest

import "testing"

// kind describes one resource for the per-kind CRUD cases.
type kind struct {
	name       string
	apiVersion string
	kind       string
	collection string // path with {ns} for namespaced kinds
	cluster    bool
	body       func(c *tc, name string) map[string]any
	// mutate changes the spec-like part for updates.
	mutate func(obj map[string]any)
}

func (k kind) obj(c *tc, name string) map[string]any {
	o := k.body(c, name)
	o["apiVersion"] = k.apiVersion
	o["kind"] = k.kind
	md := map[string]any{"name": name, "labels": map[string]any{"app": "demo"}}
	if name == "" {
		delete(md, "name")
		md["generateName"] = k.prefix(c) + "gen-"
	}
	o["metadata"] = md
	return o
}

// prefix keeps cluster-scoped names unique per case.
func (k kind) prefix(c *tc) string {
	if k.cluster {
		return c.ns + "-"
	}
	return ""
}

func (k kind) item(c *tc, name string) string { return k.collection + "/" + k.prefix(c) + name }

func (k kind) create(c *tc, name string) resp {
	return c.post(k.collection, k.obj(c, k.prefix(c)+name))
}

var kinds = []kind{
	{name: "configmap", apiVersion: "v1", kind: "ConfigMap", collection: "/api/v1/namespaces/{ns}/configmaps",
		body:   func(c *tc, _ string) map[string]any { return map[string]any{"data": map[string]any{"a": "1"}} },
		mutate: func(o map[string]any) { o["data"] = map[string]any{"a": "2", "b": "3"} }},
	{name: "secret", apiVersion: "v1", kind: "Secret", collection: "/api/v1/namespaces/{ns}/secrets",
		body:   func(c *tc, _ string) map[string]any { return map[string]any{"data": map[string]any{"k": "dmFsdWU="}} },
		mutate: func(o map[string]any) { o["data"] = map[string]any{"k": "b3RoZXI="} }},
	{name: "serviceaccount", apiVersion: "v1", kind: "ServiceAccount", collection: "/api/v1/namespaces/{ns}/serviceaccounts",
		body:   func(c *tc, _ string) map[string]any { return map[string]any{} },
		mutate: func(o map[string]any) { o["automountServiceAccountToken"] = false }},
	{name: "lease", apiVersion: "coordination.k8s.io/v1", kind: "Lease", collection: "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
		body: func(c *tc, _ string) map[string]any {
			return map[string]any{"spec": map[string]any{"holderIdentity": "a", "leaseDurationSeconds": 15}}
		},
		mutate: func(o map[string]any) { o["spec"] = map[string]any{"holderIdentity": "b", "leaseDurationSeconds": 30} }},
	{name: "widget", apiVersion: testGroup + "/v1", kind: "Widget", collection: "/apis/" + testGroup + "/v1/namespaces/{ns}/widgets",
		body: func(c *tc, _ string) map[string]any {
			return map[string]any{"spec": map[string]any{"color": "red", "size": 1}}
		},
		mutate: func(o map[string]any) { o["spec"] = map[string]any{"color": "blue", "size": 2} }},
	{name: "gadget", apiVersion: testGroup + "/v1", kind: "Gadget", collection: "/apis/" + testGroup + "/v1/gadgets", cluster: true,
		body: func(c *tc, _ string) map[string]any {
			return map[string]any{"spec": map[string]any{"color": "green", "size": 3}}
		},
		mutate: func(o map[string]any) { o["spec"] = map[string]any{"color": "green", "size": 4} }},
	{name: "node", apiVersion: "v1", kind: "Node", collection: "/api/v1/nodes", cluster: true,
		body: func(c *tc, _ string) map[string]any {
			return map[string]any{"spec": map[string]any{"podCIDR": "10.0.0.0/24"}}
		},
		mutate: func(o map[string]any) { o["spec"] = map[string]any{"podCIDR": "10.0.0.0/24", "unschedulable": true} }},
	{name: "pdb", apiVersion: "policy/v1", kind: "PodDisruptionBudget", collection: "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
		body: func(c *tc, _ string) map[string]any {
			return map[string]any{"spec": map[string]any{"minAvailable": 1, "selector": map[string]any{"matchLabels": map[string]any{"app": "x"}}}}
		},
		mutate: func(o map[string]any) {
			o["spec"] = map[string]any{"minAvailable": 2, "selector": map[string]any{"matchLabels": map[string]any{"app": "x"}}}
		}},
	{name: "event", apiVersion: "v1", kind: "Event", collection: "/api/v1/namespaces/{ns}/events",
		body: func(c *tc, _ string) map[string]any {
			return map[string]any{"involvedObject": map[string]any{"kind": "Pod", "name": "p", "namespace": c.ns}, "reason": "Test", "message": "hello", "type": "Normal"}
		},
		mutate: func(o map[string]any) { o["message"] = "changed" }},
	{name: "pod", apiVersion: "v1", kind: "Pod", collection: "/api/v1/namespaces/{ns}/pods",
		body: func(c *tc, _ string) map[string]any {
			return map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "c", "image": "busybox:1.36"}}}}
		},
		mutate: func(o map[string]any) {
			spec := o["spec"].(map[string]any)
			cs := spec["containers"].([]any)
			cs[0].(map[string]any)["image"] = "busybox:1.37"
		}},
}

func getObj(c *tc, path string) map[string]any {
	c.t.Helper()
	return c.must(c.get(path)).Obj
}

func setLabel(o map[string]any, k, v string) {
	md := o["metadata"].(map[string]any)
	l, _ := md["labels"].(map[string]any)
	if l == nil {
		l = map[string]any{}
		md["labels"] = l
	}
	l[k] = v
}

func kindCases() []diffCase {
	var cases []diffCase
	for _, k := range append(kinds, appsKinds...) {
		k := k
		add := func(op string, run func(c *tc) any) {
			cases = append(cases, diffCase{name: k.name + "/" + op, run: run})
		}
		add("create", func(c *tc) any { return summary(k.create(c, "a")) })
		add("get", func(c *tc) any {
			c.must(k.create(c, "a"))
			return summary(c.get(k.item(c, "a")))
		})
		add("get-missing", func(c *tc) any { return summary(c.get(k.item(c, "missing"))) })
		add("create-duplicate", func(c *tc) any {
			c.must(k.create(c, "a"))
			return summary(k.create(c, "a"))
		})
		add("list", func(c *tc) any {
			c.must(k.create(c, "a"))
			c.must(k.create(c, "b"))
			r := c.get(k.collection + "?labelSelector=app%3Ddemo")
			if k.cluster {
				// Only this case's objects: select by name prefix.
				return summary(c.get(k.collection + "?fieldSelector=metadata.name%3D" + k.prefix(c) + "b"))
			}
			return summary(r)
		})
		add("update", func(c *tc) any {
			c.must(k.create(c, "a"))
			o := getObj(c, k.item(c, "a"))
			k.mutate(o)
			setLabel(o, "updated", "yes")
			return summary(c.put(k.item(c, "a"), o))
		})
		add("update-stale", func(c *tc) any {
			c.must(k.create(c, "a"))
			o := getObj(c, k.item(c, "a"))
			o2 := getObj(c, k.item(c, "a"))
			setLabel(o, "first", "yes")
			c.must(c.put(k.item(c, "a"), o))
			setLabel(o2, "second", "yes")
			return summary(c.put(k.item(c, "a"), o2))
		})
		add("patch-merge", func(c *tc) any {
			c.must(k.create(c, "a"))
			return summary(c.patch(k.item(c, "a"), "application/merge-patch+json", `{"metadata":{"labels":{"patched":"merge"},"annotations":{"a":"b"}}}`))
		})
		add("patch-json", func(c *tc) any {
			c.must(k.create(c, "a"))
			return summary(c.patch(k.item(c, "a"), "application/json-patch+json", `[{"op":"add","path":"/metadata/labels/patched","value":"json"},{"op":"remove","path":"/metadata/labels/app"}]`))
		})
		add("patch-missing", func(c *tc) any {
			return summary(c.patch(k.item(c, "missing"), "application/merge-patch+json", `{"metadata":{"labels":{"x":"y"}}}`))
		})
		add("delete", func(c *tc) any {
			c.must(k.create(c, "a"))
			r := c.del(k.item(c, "a"), nil)
			return []any{summary(r), summary(c.get(k.item(c, "a")))}
		})
		add("delete-missing", func(c *tc) any { return summary(c.del(k.item(c, "missing"), nil)) })
		add("generate-name", func(c *tc) any { return summary(c.post(k.collection, k.obj(c, ""))) })
	}
	return cases
}

func TestKinds(t *testing.T) {
	runTable(t, kindCases())
}
