package difftest

import (
	"net/http"
	"testing"
	"time"
)

func moreCases() []diffCase {
	var cases []diffCase
	add := func(name string, run func(c *tc) any) { cases = append(cases, diffCase{name: name, run: run}) }
	secret := func(name, typ string) map[string]any {
		return map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": name}, "type": typ}
	}
	event := func(c *tc, name, about string) map[string]any {
		return map[string]any{"apiVersion": "v1", "kind": "Event", "metadata": map[string]any{"name": name},
			"involvedObject": map[string]any{"kind": "Pod", "name": about, "namespace": c.ns}, "reason": "R", "message": "m", "type": "Normal"}
	}

	add("list/all-namespaces", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", map[string]any{"case": c.ns}, nil)))
		return summary(c.get("/api/v1/configmaps?labelSelector=case%3D" + c.ns))
	})
	// resourceVersion=0 asks for any version: kube-apiserver answers from its
	// watch cache, which may not hold an object created a moment ago (on a
	// loaded machine it often does not). Both cases wait until the object is
	// visible that way and compare the answer then.
	add("list/resource-version-0", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		var names []string
		c.eventually(func() bool {
			names = listNames(c.get(cmPath + "?resourceVersion=0"))
			return len(names) > 0
		})
		return names
	})
	add("list/limit-zero", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		c.must(c.post(cmPath, cm("b", nil, nil)))
		return summary(c.get(cmPath + "?limit=0"))
	})
	add("list/cluster-kind-under-namespace", func(c *tc) any { return c.get("/api/v1/namespaces/{ns}/nodes").Code })
	add("list/namespaced-item-without-namespace", func(c *tc) any { return c.get("/api/v1/configmaps/x").Code })
	add("list/namespaces-by-label", func(c *tc) any {
		return listNames(c.get("/api/v1/namespaces?labelSelector=" + q("kubernetes.io/metadata.name="+c.ns)))
	})
	add("get/resource-version-param", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, map[string]any{"k": "v"})))
		var r resp
		c.eventually(func() bool {
			r = c.get(cmPath + "/a?resourceVersion=0")
			return r.Code != http.StatusNotFound
		})
		return summary(r)
	})
	add("fields/events-involved-object", func(c *tc) any {
		c.must(c.post("/api/v1/namespaces/{ns}/events", event(c, "e1", "p1")))
		c.must(c.post("/api/v1/namespaces/{ns}/events", event(c, "e2", "p2")))
		return listNames(c.get("/api/v1/namespaces/{ns}/events?fieldSelector=" + q("involvedObject.name=p1,involvedObject.kind=Pod")))
	})
	add("fields/secrets-type", func(c *tc) any {
		c.must(c.post("/api/v1/namespaces/{ns}/secrets", secret("s1", "Opaque")))
		c.must(c.post("/api/v1/namespaces/{ns}/secrets", secret("s2", "example.com/custom")))
		return listNames(c.get("/api/v1/namespaces/{ns}/secrets?fieldSelector=" + q("type=example.com/custom")))
	})
	add("delete/collection-crd", func(c *tc) any {
		c.must(c.post(widgetPath, widget("w1", map[string]any{})))
		c.must(c.post(widgetPath, widget("w2", map[string]any{})))
		r := c.del(widgetPath, nil)
		return []any{r.Code, listNames(c.get(widgetPath))}
	})
	add("delete/pending-pod-with-grace", func(c *tc) any {
		c.must(c.post(podPath, pod("p", nil, "")))
		r := c.del(podPath+"/p?gracePeriodSeconds=30", nil)
		return []any{pick(r, "metadata.deletionGracePeriodSeconds"), c.get(podPath + "/p").Code}
	})
	add("finalizer/foreground-then-clear", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		c.must(c.del(cmPath+"/a?propagationPolicy=Foreground", nil))
		r := c.patch(cmPath+"/a", "application/json-patch+json", `[{"op":"remove","path":"/metadata/finalizers"}]`)
		return []any{summary(r), c.get(cmPath + "/a").Code}
	})
	add("status/pod-main-update-ignores-status", func(c *tc) any {
		c.must(c.post(podPath, pod("p", nil, "")))
		o := getObj(c, podPath+"/p")
		o["status"] = map[string]any{"phase": "Running"}
		setLabel(o, "x", "y")
		return summary(c.put(podPath+"/p", o))
	})
	add("status/stale-rv", func(c *tc) any {
		c.must(c.post(widgetPath, widget("w", map[string]any{})))
		o := getObj(c, widgetPath+"/w")
		c.must(c.patch(widgetPath+"/w", "application/merge-patch+json", `{"spec":{"size":1}}`))
		o["status"] = map[string]any{"ok": true}
		return summary(c.put(widgetPath+"/w/status", o))
	})
	add("generation/pod-image-change", func(c *tc) any {
		c.must(c.post(podPath, pod("p", nil, "")))
		return pick(c.patch(podPath+"/p", "application/strategic-merge-patch+json", `{"spec":{"containers":[{"name":"c","image":"busybox:1.37"}]}}`), "metadata.generation")
	})
	add("patch/json-missing-path", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		return c.patch(cmPath+"/a", "application/json-patch+json", `[{"op":"replace","path":"/data/nothing","value":"x"}]`).Code
	})
	add("patch/merge-node-labels", func(c *tc) any {
		name := c.ns + "-n"
		c.must(c.post(nodePath, map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": name}}))
		return summary(c.patch(nodePath+"/"+name, "application/merge-patch+json", `{"metadata":{"labels":{"role":"worker"}},"spec":{"unschedulable":true}}`))
	})
	add("patch/strategic-pdb-selector", func(c *tc) any {
		c.must(c.post(pdbPath, pdb("b", 1, "x")))
		return summary(c.patch(pdbPath+"/b", "application/strategic-merge-patch+json", `{"spec":{"selector":{"matchLabels":{"tier":"web"}}}}`))
	})
	add("create/post-namespaced-kind-cluster-path", func(c *tc) any {
		return c.post("/apis/"+testGroup+"/v1/widgets", widget("w", map[string]any{})).Code
	})
	add("create/lease-defaults", func(c *tc) any {
		return summary(c.post(leasePath, map[string]any{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": map[string]any{"name": "l"}}))
	})
	add("token/audiences", func(c *tc) any {
		c.must(c.post(saPath, map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": "sa"}}))
		return pick(c.post(saPath+"/sa/token", map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
			"spec": map[string]any{"audiences": []any{"nstance"}}}), "spec.audiences", "status.token")
	})
	add("eviction/dry-run", func(c *tc) any {
		c.must(c.post(podPath, pod("p", map[string]any{"app": "x"}, "")))
		r := c.post(podPath+"/p/eviction?dryRun=All", map[string]any{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": map[string]any{"name": "p"}})
		return []any{summary(r), c.get(podPath + "/p").Code}
	})
	add("eviction/name-mismatch", func(c *tc) any {
		c.must(c.post(podPath, pod("p", nil, "")))
		return c.post(podPath+"/p/eviction", map[string]any{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": map[string]any{"name": "q"}}).Code
	})
	add("watch/namespace-scoped", func(c *tc) any {
		other := c.ns + "-o"
		c.must(c.post("/api/v1/namespaces", map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": other}}))
		l := c.must(c.get(cmPath)).Obj
		w := c.watch(cmPath + "?watch=1&resourceVersion=" + rvOf(l))
		c.must(c.post("/api/v1/namespaces/"+other+"/configmaps", cm("elsewhere", nil, nil)))
		c.must(c.post(cmPath, cm("here", nil, nil)))
		return w.collect(1, 5*time.Second)
	})
	add("watch/all-namespaces-selector", func(c *tc) any {
		l := c.must(c.get(cmPath)).Obj
		w := c.watch("/api/v1/configmaps?watch=1&labelSelector=case%3D" + c.ns + "&resourceVersion=" + rvOf(l))
		c.must(c.post(cmPath, cm("a", map[string]any{"case": c.ns}, nil)))
		c.must(c.post(cmPath, cm("b", nil, nil)))
		c.must(c.del(cmPath+"/a", nil))
		return w.collect(2, 5*time.Second)
	})
	add("watch/status-update-event", func(c *tc) any {
		c.must(c.post(widgetPath, widget("w", map[string]any{})))
		l := c.must(c.get(widgetPath)).Obj
		w := c.watch(widgetPath + "?watch=1&resourceVersion=" + rvOf(l))
		c.must(c.patch(widgetPath+"/w/status", "application/merge-patch+json", `{"status":{"ok":true}}`))
		return w.collect(1, 5*time.Second)
	})
	return cases
}

func TestMore(t *testing.T) {
	runTable(t, moreCases())
}
