package difftest

import (
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	cmPath     = "/api/v1/namespaces/{ns}/configmaps"
	podPath    = "/api/v1/namespaces/{ns}/pods"
	pdbPath    = "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
	saPath     = "/api/v1/namespaces/{ns}/serviceaccounts"
	widgetPath = "/apis/" + testGroup + "/v1/namespaces/{ns}/widgets"
	gadgetPath = "/apis/" + testGroup + "/v1/gadgets"
	nodePath   = "/api/v1/nodes"
	leasePath  = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
)

func cm(name string, labels map[string]any, data map[string]any) map[string]any {
	md := map[string]any{"name": name}
	if labels != nil {
		md["labels"] = labels
	}
	o := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": md}
	if data != nil {
		o["data"] = data
	}
	return o
}

func withFinalizers(o map[string]any, fs ...string) map[string]any {
	md := o["metadata"].(map[string]any)
	var l []any
	for _, f := range fs {
		l = append(l, f)
	}
	md["finalizers"] = l
	return o
}

func pod(name string, labels map[string]any, node string) map[string]any {
	spec := map[string]any{"containers": []any{map[string]any{"name": "c", "image": "busybox:1.36"}}}
	if node != "" {
		spec["nodeName"] = node
	}
	md := map[string]any{"name": name}
	if labels != nil {
		md["labels"] = labels
	}
	return map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": spec}
}

func widget(name string, spec map[string]any) map[string]any {
	return map[string]any{"apiVersion": testGroup + "/v1", "kind": "Widget", "metadata": map[string]any{"name": name}, "spec": spec}
}

func listNames(r resp) []string {
	var out []string
	items, _ := r.Obj["items"].([]any)
	for _, it := range items {
		m, _ := it.(map[string]any)
		md, _ := m["metadata"].(map[string]any)
		out = append(out, fmt.Sprint(md["name"]))
	}
	return out
}

func rvOf(o map[string]any) string {
	md, _ := o["metadata"].(map[string]any)
	s, _ := md["resourceVersion"].(string)
	return s
}

func q(s string) string { return url.QueryEscape(s) }

// setPodStatus marks a pod Running and (optionally) Ready through /status.
func setPodStatus(c *tc, name string, ready bool) {
	c.t.Helper()
	o := getObj(c, podPath+"/"+name)
	st := "False"
	if ready {
		st = "True"
	}
	o["status"] = map[string]any{"phase": "Running", "conditions": []any{map[string]any{"type": "Ready", "status": st}}}
	c.must(c.put(podPath+"/"+name+"/status", o))
}

// setPDBStatus sets a budget's status as a disruption controller would.
func setPDBStatus(c *tc, name string, allowed, healthy, desired int, current bool) {
	c.t.Helper()
	o := getObj(c, pdbPath+"/"+name)
	md := o["metadata"].(map[string]any)
	gen := md["generation"]
	if !current {
		gen = 0
	}
	o["status"] = map[string]any{"observedGeneration": gen, "disruptionsAllowed": allowed, "currentHealthy": healthy, "desiredHealthy": desired, "expectedPods": healthy}
	c.must(c.put(pdbPath+"/"+name+"/status", o))
}

func pdb(name string, minAvailable int, app string) map[string]any {
	return map[string]any{"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": map[string]any{"name": name},
		"spec": map[string]any{"minAvailable": minAvailable, "selector": map[string]any{"matchLabels": map[string]any{"app": app}}}}
}

func evict(c *tc, name string, body map[string]any) resp {
	if body == nil {
		body = map[string]any{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": map[string]any{"name": name}}
	}
	return c.post(podPath+"/"+name+"/eviction", body)
}

func discoveryEntry(r resp, names ...string) []string {
	var out []string
	res, _ := r.Obj["resources"].([]any)
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	for _, x := range res {
		m, _ := x.(map[string]any)
		if !want[fmt.Sprint(m["name"])] {
			continue
		}
		short, _ := m["shortNames"].([]any)
		out = append(out, fmt.Sprintf("%v namespaced=%v kind=%v group=%v version=%v short=%v", m["name"], m["namespaced"], m["kind"], m["group"], m["version"], short))
	}
	sort.Strings(out)
	return out
}

func tableView(r resp, skipAge bool) any {
	if r.Obj == nil {
		return summary(r)
	}
	var cols []string
	ageIdx := -1
	defs, _ := r.Obj["columnDefinitions"].([]any)
	for i, d := range defs {
		m, _ := d.(map[string]any)
		if m["name"] == "Age" {
			ageIdx = i
		}
		cols = append(cols, fmt.Sprintf("%v:%v", m["name"], m["type"]))
	}
	var rows [][]any
	rs, _ := r.Obj["rows"].([]any)
	for _, row := range rs {
		m, _ := row.(map[string]any)
		cells, _ := m["cells"].([]any)
		var keep []any
		for i, cell := range cells {
			if i != ageIdx || !skipAge {
				keep = append(keep, cell)
			}
		}
		rows = append(rows, keep)
	}
	return map[string]any{"code": r.Code, "kind": r.Obj["kind"], "columns": cols, "rows": rows}
}

func (c *tc) getTable(path string) resp {
	c.t.Helper()
	r, err := c.tg.do(c.ctx, http.MethodGet, c.path(path), "", nil, "application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
	if err != nil {
		c.t.Fatal(err)
	}
	return r
}

func semanticCases() []diffCase {
	var cases []diffCase
	add := func(name string, run func(c *tc) any) { cases = append(cases, diffCase{name: name, run: run}) }

	// Discovery and server endpoints.
	add("server/version", func(c *tc) any { return pick(c.get("/version"), "major", "minor") })
	for _, p := range []string{"/healthz", "/readyz", "/livez"} {
		p := p
		add("server"+p, func(c *tc) any { r := c.get(p); return []any{r.Code, string(r.Raw)} })
	}
	add("discovery/api", func(c *tc) any { return pick(c.get("/api"), "kind", "versions") })
	add("discovery/api-v1", func(c *tc) any {
		return discoveryEntry(c.get("/api/v1"), "configmaps", "pods", "pods/status", "pods/eviction", "nodes", "nodes/status", "namespaces", "secrets", "serviceaccounts", "serviceaccounts/token", "events")
	})
	add("discovery/apis-groups", func(c *tc) any {
		r := c.get("/apis")
		var out []string
		gs, _ := r.Obj["groups"].([]any)
		for _, g := range gs {
			m, _ := g.(map[string]any)
			switch m["name"] {
			case "policy", "coordination.k8s.io", "apiextensions.k8s.io", testGroup, "cluster.x-k8s.io", "infrastructure.cluster.x-k8s.io":
				pv, _ := m["preferredVersion"].(map[string]any)
				out = append(out, fmt.Sprintf("%v preferred=%v", m["name"], pv["groupVersion"]))
			}
		}
		sort.Strings(out)
		return out
	})
	for _, root := range []string{"/api", "/apis"} {
		root := root
		add("discovery/aggregated"+root, func(c *tc) any {
			r, err := c.tg.do(c.ctx, http.MethodGet, root, "", nil, "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json")
			if err != nil {
				c.t.Fatal(err)
			}
			var out []string
			items, _ := r.Obj["items"].([]any)
			for _, it := range items {
				g, _ := it.(map[string]any)
				md, _ := g["metadata"].(map[string]any)
				name, _ := md["name"].(string)
				switch name {
				case "", "policy", "coordination.k8s.io", testGroup:
				default:
					continue
				}
				vs, _ := g["versions"].([]any)
				for _, v := range vs {
					vm, _ := v.(map[string]any)
					rs, _ := vm["resources"].([]any)
					for _, x := range rs {
						rm, _ := x.(map[string]any)
						switch rm["resource"] {
						case "pods", "configmaps", "nodes", "leases", "poddisruptionbudgets", "widgets", "gadgets":
						default:
							continue
						}
						var subs []string
						sl, _ := rm["subresources"].([]any)
						for _, sub := range sl {
							sm, _ := sub.(map[string]any)
							switch sm["subresource"] {
							case "status", "eviction", "token": // the ones dev-k8s serves
								subs = append(subs, fmt.Sprintf("%v:%v", sm["subresource"], sm["responseKind"]))
							}
						}
						sort.Strings(subs)
						out = append(out, fmt.Sprintf("%s/%v %v scope=%v kind=%v singular=%v subs=%v", name, vm["version"], rm["resource"], rm["scope"], rm["responseKind"], rm["singularResource"], subs))
					}
				}
			}
			sort.Strings(out)
			return []any{r.Code, r.CT, out}
		})
	}
	add("discovery/group", func(c *tc) any { return pick(c.get("/apis/policy"), "kind", "name", "preferredVersion") })
	add("discovery/group-missing", func(c *tc) any { return c.get("/apis/nope.example.com").Code })
	add("discovery/crd-group-version", func(c *tc) any {
		return discoveryEntry(c.get("/apis/"+testGroup+"/v1"), "widgets", "widgets/status", "gadgets")
	})
	add("discovery/capi", func(c *tc) any {
		return discoveryEntry(c.get("/apis/cluster.x-k8s.io/v1beta2"), "clusters", "machines", "machines/status", "machinedeployments")
	})
	add("discovery/policy", func(c *tc) any {
		return discoveryEntry(c.get("/apis/policy/v1"), "poddisruptionbudgets", "poddisruptionbudgets/status")
	})
	add("discovery/unknown-resource", func(c *tc) any { return summary(c.get("/api/v1/namespaces/{ns}/nothings")) })

	// Label selectors.
	seed := func(c *tc) {
		c.must(c.post(cmPath, cm("a", map[string]any{"app": "a", "tier": "web"}, nil)))
		c.must(c.post(cmPath, cm("b", map[string]any{"app": "b"}, nil)))
		c.must(c.post(cmPath, cm("c", map[string]any{"tier": "db"}, nil)))
		c.must(c.post(cmPath, cm("d", nil, nil)))
	}
	for _, sel := range []string{"app=a", "app in (a,b)", "!app", "app!=a", "tier", "app=a,tier=web", "tier notin (web)", "app==b"} {
		sel := sel
		add("labels/"+sel, func(c *tc) any {
			seed(c)
			return listNames(c.get(cmPath + "?labelSelector=" + q(sel)))
		})
	}
	add("labels/invalid", func(c *tc) any { return summary(c.get(cmPath + "?labelSelector=" + q("app in (a"))) })

	// Field selectors.
	add("fields/metadata.name", func(c *tc) any { seed(c); return listNames(c.get(cmPath + "?fieldSelector=metadata.name%3Db")) })
	add("fields/metadata.name-not", func(c *tc) any {
		seed(c)
		return listNames(c.get(cmPath + "?fieldSelector=" + q("metadata.name!=b")))
	})
	add("fields/metadata.namespace", func(c *tc) any {
		seed(c)
		return listNames(c.get("/api/v1/configmaps?fieldSelector=" + q("metadata.namespace="+c.ns)))
	})
	add("fields/unsupported", func(c *tc) any { return summary(c.get(cmPath + "?fieldSelector=" + q("data.a=1"))) })
	add("fields/pods-nodeName", func(c *tc) any {
		c.must(c.post(podPath, pod("p1", nil, "n1")))
		c.must(c.post(podPath, pod("p2", nil, "n2")))
		c.must(c.post(podPath, pod("p3", nil, "")))
		return []any{listNames(c.get(podPath + "?fieldSelector=" + q("spec.nodeName=n1"))), listNames(c.get(podPath + "?fieldSelector=" + q("spec.nodeName=")))}
	})
	add("fields/pods-phase", func(c *tc) any {
		c.must(c.post(podPath, pod("p1", nil, "")))
		c.must(c.post(podPath, pod("p2", nil, "")))
		setPodStatus(c, "p2", true)
		return []any{listNames(c.get(podPath + "?fieldSelector=" + q("status.phase=Running"))), listNames(c.get(podPath + "?fieldSelector=" + q("status.phase!=Running")))}
	})
	add("fields/pods-combined", func(c *tc) any {
		c.must(c.post(podPath, pod("p1", map[string]any{"a": "1"}, "n1")))
		c.must(c.post(podPath, pod("p2", map[string]any{"a": "2"}, "n1")))
		return listNames(c.get(podPath + "?fieldSelector=" + q("spec.nodeName=n1,metadata.name=p2") + "&labelSelector=a%3D2"))
	})
	add("fields/nodes-unschedulable", func(c *tc) any {
		n := map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": c.ns + "-n"}, "spec": map[string]any{"unschedulable": true}}
		c.must(c.post(nodePath, n))
		return listNames(c.get(nodePath + "?fieldSelector=" + q("spec.unschedulable=true,metadata.name="+c.ns+"-n")))
	})
	add("fields/crd-name", func(c *tc) any {
		c.must(c.post(widgetPath, widget("w1", map[string]any{})))
		c.must(c.post(widgetPath, widget("w2", map[string]any{})))
		return listNames(c.get(widgetPath + "?fieldSelector=metadata.name%3Dw2"))
	})
	add("fields/crd-unsupported", func(c *tc) any { return summary(c.get(widgetPath + "?fieldSelector=spec.color%3Dred")) })

	// Pagination.
	five := func(c *tc) {
		for _, n := range []string{"e", "a", "d", "b", "c"} {
			c.must(c.post(cmPath, cm(n, nil, nil)))
		}
	}
	add("paging/limit", func(c *tc) any { five(c); return summary(c.get(cmPath + "?limit=2")) })
	add("paging/continue", func(c *tc) any {
		five(c)
		var pages []any
		next := ""
		for i := 0; i < 5; i++ {
			p := cmPath + "?limit=2"
			if next != "" {
				p += "&continue=" + q(next)
			}
			r := c.must(c.get(p))
			pages = append(pages, summary(r))
			md, _ := r.Obj["metadata"].(map[string]any)
			next, _ = md["continue"].(string)
			if next == "" {
				break
			}
		}
		return pages
	})
	add("paging/limit-larger", func(c *tc) any { five(c); return summary(c.get(cmPath + "?limit=50")) })
	add("paging/bad-continue", func(c *tc) any { return c.get(cmPath + "?limit=2&continue=garbage").Code })
	add("paging/cluster-scoped", func(c *tc) any {
		for _, n := range []string{"x", "y", "z"} {
			c.must(c.post(gadgetPath, map[string]any{"apiVersion": testGroup + "/v1", "kind": "Gadget", "metadata": map[string]any{"name": c.ns + "-" + n, "labels": map[string]any{"case": c.ns}}}))
		}
		r := c.get(gadgetPath + "?limit=2&labelSelector=case%3D" + c.ns)
		return listNames(r)
	})

	// Conflicts and updates.
	add("conflict/patch-stale-rv", func(c *tc) any {
		o := c.must(c.post(cmPath, cm("a", nil, map[string]any{"x": "1"}))).Obj
		rv := rvOf(o)
		c.must(c.patch(cmPath+"/a", "application/merge-patch+json", `{"data":{"x":"2"}}`))
		return summary(c.patch(cmPath+"/a", "application/merge-patch+json", `{"metadata":{"resourceVersion":"`+rv+`"},"data":{"x":"3"}}`))
	})
	add("conflict/patch-current-rv", func(c *tc) any {
		o := c.must(c.post(cmPath, cm("a", nil, map[string]any{"x": "1"}))).Obj
		return summary(c.patch(cmPath+"/a", "application/merge-patch+json", `{"metadata":{"resourceVersion":"`+rvOf(o)+`"},"data":{"x":"3"}}`))
	})
	add("conflict/update-unconditional-builtin", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		return summary(c.put(cmPath+"/a", cm("a", map[string]any{"u": "1"}, nil)))
	})
	add("conflict/update-unconditional-crd", func(c *tc) any {
		c.must(c.post(widgetPath, widget("w", map[string]any{"size": 1})))
		return summary(c.put(widgetPath+"/w", widget("w", map[string]any{"size": 2})))
	})
	add("conflict/rv-monotonic", func(c *tc) any {
		a := c.must(c.post(cmPath, cm("a", nil, nil))).Obj
		b := c.must(c.post(cmPath, cm("b", nil, nil))).Obj
		l := c.must(c.get(cmPath)).Obj
		ra, errA := strconv.Atoi(rvOf(a))
		rb, errB := strconv.Atoi(rvOf(b))
		rl, errL := strconv.Atoi(rvOf(l))
		return []bool{errA == nil && errB == nil && errL == nil, rb > ra, rl >= rb}
	})
	add("conflict/noop-update-keeps-rv", func(c *tc) any {
		o := c.must(c.post(cmPath, cm("a", nil, map[string]any{"x": "1"}))).Obj
		r := c.must(c.patch(cmPath+"/a", "application/merge-patch+json", `{"data":{"x":"1"}}`))
		return rvOf(o) == rvOf(r.Obj)
	})
	add("update/name-mismatch", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		return summary(c.put(cmPath+"/a", cm("b", nil, nil)))
	})
	add("update/missing-builtin", func(c *tc) any { return summary(c.put(cmPath+"/zz", cm("zz", nil, nil))) })
	add("update/create-on-update-lease", func(c *tc) any {
		l := map[string]any{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": map[string]any{"name": "l"}, "spec": map[string]any{"holderIdentity": "h"}}
		return summary(c.put(leasePath+"/l", l))
	})

	// Validation.
	add("validate/no-name", func(c *tc) any { return summary(c.post(cmPath, cm("", nil, nil))) })
	add("validate/bad-name", func(c *tc) any { return summary(c.post(cmPath, cm("Bad_Name", nil, nil))) })
	add("validate/namespace-mismatch", func(c *tc) any {
		o := cm("a", nil, nil)
		o["metadata"].(map[string]any)["namespace"] = "other"
		return summary(c.post(cmPath, o))
	})
	add("validate/missing-namespace", func(c *tc) any {
		return summary(c.post("/api/v1/namespaces/{ns}-absent/configmaps", cm("a", nil, nil)))
	})
	add("validate/wrong-kind", func(c *tc) any {
		o := cm("a", nil, nil)
		o["kind"] = "Secret"
		return c.post(cmPath, o).Code
	})
	add("validate/bad-json", func(c *tc) any { return c.post(cmPath, "{not json").Code })
	add("validate/pod-no-containers", func(c *tc) any {
		p := pod("p", nil, "")
		p["spec"] = map[string]any{"containers": []any{}}
		return c.post(podPath, p).Code
	})
	add("create/dry-run", func(c *tc) any {
		r := c.post(cmPath+"?dryRun=All", cm("a", nil, map[string]any{"x": "1"}))
		return []any{summary(r), c.get(cmPath + "/a").Code}
	})
	add("create/secret-default-type", func(c *tc) any {
		return pick(c.post("/api/v1/namespaces/{ns}/secrets", map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "s"}}), "type")
	})
	add("create/namespace-defaults", func(c *tc) any {
		return pick(c.get("/api/v1/namespaces/{ns}"), "metadata.labels", "spec", "status")
	})
	add("create/pod-status", func(c *tc) any {
		return pick(c.post(podPath, pod("p", nil, "")), "status.phase", "spec.restartPolicy", "spec.dnsPolicy", "spec.schedulerName", "spec.terminationGracePeriodSeconds")
	})
	add("create/crd-status-dropped", func(c *tc) any {
		w := widget("w", map[string]any{"size": 1})
		w["status"] = map[string]any{"ready": true}
		return summary(c.post(widgetPath, w))
	})
	add("create/crd-unknown-kind-path", func(c *tc) any {
		return summary(c.get("/apis/" + testGroup + "/v1/namespaces/{ns}/sprockets"))
	})

	// Patches.
	add("patch/strategic-pod-containers", func(c *tc) any {
		c.must(c.post(podPath, pod("p", nil, "")))
		return summary(c.patch(podPath+"/p", "application/strategic-merge-patch+json", `{"metadata":{"labels":{"s":"1"}},"spec":{"containers":[{"name":"c","image":"busybox:1.37"}]}}`))
	})
	add("patch/strategic-configmap", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", map[string]any{"k": "v"}, map[string]any{"x": "1"})))
		return summary(c.patch(cmPath+"/a", "application/strategic-merge-patch+json", `{"data":{"y":"2","x":null},"metadata":{"labels":{"k":null}}}`))
	})
	add("patch/strategic-crd-unsupported", func(c *tc) any {
		c.must(c.post(widgetPath, widget("w", map[string]any{"size": 1})))
		return summary(c.patch(widgetPath+"/w", "application/strategic-merge-patch+json", `{"spec":{"size":2}}`))
	})
	add("patch/merge-null-removes", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, map[string]any{"x": "1", "y": "2"})))
		return summary(c.patch(cmPath+"/a", "application/merge-patch+json", `{"data":{"x":null}}`))
	})
	add("patch/json-test-fails", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, map[string]any{"x": "1"})))
		return summary(c.patch(cmPath+"/a", "application/json-patch+json", `[{"op":"test","path":"/data/x","value":"2"}]`))
	})
	add("patch/json-test-passes", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, map[string]any{"x": "1"})))
		return summary(c.patch(cmPath+"/a", "application/json-patch+json", `[{"op":"test","path":"/data/x","value":"1"},{"op":"replace","path":"/data/x","value":"9"}]`))
	})
	// A replace of the whole document without a value makes json-patch v4
	// dereference nil: kube-apiserver resets the stream, dev-k8s answers
	// 422. Both must refuse it, keep the object and go on serving.
	add("patch/json-replace-root-without-value", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, map[string]any{"x": "1"})))
		r, err := c.tg.do(c.ctx, http.MethodPatch, c.path(cmPath+"/a"), "application/json-patch+json", `[{"op":"replace","path":""}]`, "")
		refused := err != nil || r.Code >= 400
		return []any{refused, summary(c.get(cmPath + "/a"))}
	})
	add("patch/json-invalid", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		return c.patch(cmPath+"/a", "application/json-patch+json", `{"op":"add"}`).Code
	})
	add("patch/merge-crd-spec", func(c *tc) any {
		c.must(c.post(widgetPath, widget("w", map[string]any{"size": 1, "color": "red"})))
		return summary(c.patch(widgetPath+"/w", "application/merge-patch+json", `{"spec":{"size":5,"color":null}}`))
	})
	add("patch/unsupported-type", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		return c.patch(cmPath+"/a", "text/plain", `x`).Code
	})
	add("patch/apply-create", func(c *tc) any {
		return summary(c.patch(cmPath+"/ap?fieldManager=test", "application/apply-patch+yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ap\ndata:\n  k: v\n"))
	})
	add("patch/apply-update", func(c *tc) any {
		c.must(c.patch(cmPath+"/ap?fieldManager=test", "application/apply-patch+yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ap\ndata:\n  k: v\n"))
		return summary(c.patch(cmPath+"/ap?fieldManager=test", "application/apply-patch+yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ap\n  labels:\n    l: x\ndata:\n  k: v2\n"))
	})
	add("patch/apply-no-manager", func(c *tc) any {
		return c.patch(cmPath+"/ap", "application/apply-patch+yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ap\n").Code
	})
	add("patch/status-subresource", func(c *tc) any {
		c.must(c.post(widgetPath, widget("w", map[string]any{"size": 1})))
		return summary(c.patch(widgetPath+"/w/status", "application/merge-patch+json", `{"status":{"ready":true},"spec":{"size":9}}`))
	})

	// Generation and status subresources.
	add("generation/crd-spec-change", func(c *tc) any {
		c.must(c.post(widgetPath, widget("w", map[string]any{"size": 1})))
		return pick(c.patch(widgetPath+"/w", "application/merge-patch+json", `{"spec":{"size":2}}`), "metadata.generation")
	})
	add("generation/crd-metadata-change", func(c *tc) any {
		c.must(c.post(widgetPath, widget("w", map[string]any{"size": 1})))
		return pick(c.patch(widgetPath+"/w", "application/merge-patch+json", `{"metadata":{"labels":{"a":"b"}}}`), "metadata.generation")
	})
	add("generation/crd-status-ignored-on-main", func(c *tc) any {
		c.must(c.post(widgetPath, widget("w", map[string]any{"size": 1})))
		return summary(c.patch(widgetPath+"/w", "application/merge-patch+json", `{"status":{"ready":true}}`))
	})
	add("generation/crd-status-update", func(c *tc) any {
		c.must(c.post(widgetPath, widget("w", map[string]any{"size": 1})))
		o := getObj(c, widgetPath+"/w")
		o["status"] = map[string]any{"phase": "Ready"}
		o["spec"] = map[string]any{"size": 100}
		r := c.put(widgetPath+"/w/status", o)
		return []any{summary(r), pick(c.get(widgetPath+"/w"), "spec", "status", "metadata.generation")}
	})
	add("generation/no-status-subresource", func(c *tc) any {
		name := c.ns + "-g"
		c.must(c.post(gadgetPath, map[string]any{"apiVersion": testGroup + "/v1", "kind": "Gadget", "metadata": map[string]any{"name": name}, "spec": map[string]any{"size": 1}}))
		a := pick(c.patch(gadgetPath+"/"+name, "application/merge-patch+json", `{"status":{"s":1}}`), "metadata.generation", "status")
		b := pick(c.patch(gadgetPath+"/"+name, "application/merge-patch+json", `{"metadata":{"labels":{"x":"y"}}}`), "metadata.generation")
		d := pick(c.patch(gadgetPath+"/"+name, "application/merge-patch+json", `{"spec":{"size":2}}`), "metadata.generation")
		return []any{a, b, d}
	})
	add("generation/pdb-spec-change", func(c *tc) any {
		c.must(c.post(pdbPath, pdb("b", 1, "x")))
		return pick(c.patch(pdbPath+"/b", "application/merge-patch+json", `{"spec":{"minAvailable":2}}`), "metadata.generation")
	})
	add("status/get-subresource", func(c *tc) any {
		c.must(c.post(widgetPath, widget("w", map[string]any{"size": 1})))
		return summary(c.get(widgetPath + "/w/status"))
	})
	add("status/configmap-has-none", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		return c.get(cmPath + "/a/status").Code
	})
	add("status/pod-status-update", func(c *tc) any {
		c.must(c.post(podPath, pod("p", nil, "")))
		setPodStatus(c, "p", true)
		return summary(c.get(podPath + "/p"))
	})
	add("status/node-status-update", func(c *tc) any {
		name := c.ns + "-n"
		c.must(c.post(nodePath, map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": name}}))
		o := getObj(c, nodePath+"/"+name)
		o["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "True", "reason": "KubeletReady"}}}
		return pick(c.put(nodePath+"/"+name+"/status", o), "status.conditions")
	})

	// Finalizers and deletion.
	add("finalizer/delete-marks", func(c *tc) any {
		c.must(c.post(cmPath, withFinalizers(cm("a", nil, nil), "test/f")))
		return []any{summary(c.del(cmPath+"/a", nil)), summary(c.get(cmPath + "/a"))}
	})
	add("finalizer/remove-by-update", func(c *tc) any {
		c.must(c.post(cmPath, withFinalizers(cm("a", nil, nil), "test/f")))
		c.must(c.del(cmPath+"/a", nil))
		o := getObj(c, cmPath+"/a")
		delete(o["metadata"].(map[string]any), "finalizers")
		return []any{summary(c.put(cmPath+"/a", o)), c.get(cmPath + "/a").Code}
	})
	add("finalizer/remove-by-merge-patch", func(c *tc) any {
		c.must(c.post(cmPath, withFinalizers(cm("a", nil, nil), "test/f")))
		c.must(c.del(cmPath+"/a", nil))
		return []any{summary(c.patch(cmPath+"/a", "application/merge-patch+json", `{"metadata":{"finalizers":null}}`)), c.get(cmPath + "/a").Code}
	})
	add("finalizer/remove-by-json-patch", func(c *tc) any {
		c.must(c.post(widgetPath, withFinalizers(widget("w", map[string]any{}), "test/f", "test/g")))
		c.must(c.del(widgetPath+"/w", nil))
		a := summary(c.patch(widgetPath+"/w", "application/json-patch+json", `[{"op":"remove","path":"/metadata/finalizers/0"}]`))
		b := summary(c.patch(widgetPath+"/w", "application/json-patch+json", `[{"op":"remove","path":"/metadata/finalizers/0"}]`))
		return []any{a, b, c.get(widgetPath + "/w").Code}
	})
	add("finalizer/remove-by-strategic-patch", func(c *tc) any {
		c.must(c.post(cmPath, withFinalizers(cm("a", nil, nil), "test/f")))
		c.must(c.del(cmPath+"/a", nil))
		return []any{summary(c.patch(cmPath+"/a", "application/strategic-merge-patch+json", `{"metadata":{"$deleteFromPrimitiveList/finalizers":["test/f"]}}`)), c.get(cmPath + "/a").Code}
	})
	add("finalizer/no-new-while-deleting", func(c *tc) any {
		c.must(c.post(cmPath, withFinalizers(cm("a", nil, nil), "test/f")))
		c.must(c.del(cmPath+"/a", nil))
		return c.patch(cmPath+"/a", "application/merge-patch+json", `{"metadata":{"finalizers":["test/f","test/new"]}}`).Code
	})
	add("finalizer/delete-twice", func(c *tc) any {
		c.must(c.post(cmPath, withFinalizers(cm("a", nil, nil), "test/f")))
		c.must(c.del(cmPath+"/a", nil))
		return summary(c.del(cmPath+"/a", nil))
	})
	add("finalizer/crd-generation-on-delete", func(c *tc) any {
		c.must(c.post(widgetPath, withFinalizers(widget("w", map[string]any{}), "test/f")))
		return pick(c.del(widgetPath+"/w", nil), "metadata.generation", "metadata.deletionTimestamp", "metadata.finalizers")
	})
	add("finalizer/cluster-scoped", func(c *tc) any {
		name := c.ns + "-g"
		c.must(c.post(gadgetPath, withFinalizers(map[string]any{"apiVersion": testGroup + "/v1", "kind": "Gadget", "metadata": map[string]any{"name": name}}, "test/f")))
		a := summary(c.del(gadgetPath+"/"+name, nil))
		b := summary(c.patch(gadgetPath+"/"+name, "application/merge-patch+json", `{"metadata":{"finalizers":[]}}`))
		return []any{a, b, c.get(gadgetPath + "/" + name).Code}
	})
	add("delete/precondition-uid", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		return summary(c.del(cmPath+"/a", map[string]any{"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": map[string]any{"uid": "00000000-0000-0000-0000-000000000000"}}))
	})
	add("delete/precondition-rv-stale", func(c *tc) any {
		o := c.must(c.post(cmPath, cm("a", nil, nil))).Obj
		c.must(c.patch(cmPath+"/a", "application/merge-patch+json", `{"data":{"x":"1"}}`))
		return summary(c.del(cmPath+"/a", map[string]any{"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": map[string]any{"resourceVersion": rvOf(o)}}))
	})
	add("delete/precondition-match", func(c *tc) any {
		o := c.must(c.post(cmPath, cm("a", nil, nil))).Obj
		md := o["metadata"].(map[string]any)
		return summary(c.del(cmPath+"/a", map[string]any{"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": map[string]any{"uid": md["uid"], "resourceVersion": md["resourceVersion"]}}))
	})
	add("delete/foreground", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		r := c.del(cmPath+"/a?propagationPolicy=Foreground", nil)
		return []any{summary(r), pick(c.get(cmPath+"/a"), "metadata.finalizers", "metadata.deletionTimestamp")}
	})
	add("delete/orphan", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		return summary(c.del(cmPath+"/a", map[string]any{"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Orphan"}))
	})
	add("delete/background", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		return []any{summary(c.del(cmPath+"/a?propagationPolicy=Background", nil)), c.get(cmPath + "/a").Code}
	})
	add("delete/invalid-policy", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		return c.del(cmPath+"/a?propagationPolicy=Sideways", nil).Code
	})
	add("delete/collection-selector", func(c *tc) any {
		seed(c)
		r := c.del(cmPath+"?labelSelector=app", nil)
		return []any{r.Code, listNames(c.get(cmPath))}
	})
	add("delete/pod-on-node-graceful", func(c *tc) any {
		c.must(c.post(podPath, pod("p", nil, "n1")))
		setPodStatus(c, "p", true)
		r := c.del(podPath+"/p", nil)
		return []any{pick(r, "metadata.deletionGracePeriodSeconds", "metadata.deletionTimestamp"), c.get(podPath + "/p").Code}
	})
	add("delete/pod-grace-zero", func(c *tc) any {
		c.must(c.post(podPath, pod("p", nil, "n1")))
		setPodStatus(c, "p", true)
		r := c.del(podPath+"/p?gracePeriodSeconds=0", nil)
		return []any{r.Code, c.get(podPath + "/p").Code}
	})
	add("delete/dry-run", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		r := c.del(cmPath+"/a?dryRun=All", nil)
		return []any{r.Code, c.get(cmPath + "/a").Code}
	})

	// Namespaces.
	add("namespace/delete-terminating", func(c *tc) any {
		name := c.ns + "-x"
		c.must(c.post("/api/v1/namespaces", map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": name}}))
		c.must(c.post("/api/v1/namespaces/"+name+"/configmaps", cm("a", nil, nil)))
		r := c.del("/api/v1/namespaces/"+name, nil)
		return []any{pick(r, "status.phase", "spec", "metadata.deletionTimestamp"), summary(c.post("/api/v1/namespaces/"+name+"/configmaps", cm("b", nil, nil)))}
	})
	add("namespace/get-missing", func(c *tc) any { return summary(c.get("/api/v1/namespaces/" + c.ns + "-none")) })

	// Eviction.
	add("eviction/pending-pod", func(c *tc) any {
		c.must(c.post(podPath, pod("p", map[string]any{"app": "x"}, "")))
		r := evict(c, "p", nil)
		return []any{summary(r), c.get(podPath + "/p").Code}
	})
	add("eviction/no-pdb", func(c *tc) any {
		c.must(c.post(podPath, pod("p", map[string]any{"app": "x"}, "")))
		setPodStatus(c, "p", true)
		return []any{summary(evict(c, "p", nil)), c.get(podPath + "/p").Code}
	})
	add("eviction/blocked", func(c *tc) any {
		c.must(c.post(podPath, pod("p", map[string]any{"app": "x"}, "")))
		setPodStatus(c, "p", true)
		c.must(c.post(pdbPath, pdb("b", 1, "x")))
		setPDBStatus(c, "b", 0, 1, 1, true)
		return []any{summary(evict(c, "p", nil)), c.get(podPath + "/p").Code}
	})
	add("eviction/pdb-not-observed", func(c *tc) any {
		c.must(c.post(podPath, pod("p", map[string]any{"app": "x"}, "")))
		setPodStatus(c, "p", true)
		c.must(c.post(pdbPath, pdb("b", 1, "x")))
		return summary(evict(c, "p", nil))
	})
	add("eviction/allowed-decrements", func(c *tc) any {
		c.must(c.post(podPath, pod("p", map[string]any{"app": "x"}, "")))
		c.must(c.post(podPath, pod("q", map[string]any{"app": "x"}, "")))
		setPodStatus(c, "p", true)
		setPodStatus(c, "q", true)
		c.must(c.post(pdbPath, pdb("b", 1, "x")))
		setPDBStatus(c, "b", 1, 2, 1, true)
		r := evict(c, "p", nil)
		return []any{summary(r), c.get(podPath + "/p").Code, pick(c.get(pdbPath+"/b"), "status.disruptionsAllowed", "status.disruptedPods"), summary(evict(c, "q", nil))}
	})
	add("eviction/two-pdbs", func(c *tc) any {
		c.must(c.post(podPath, pod("p", map[string]any{"app": "x"}, "")))
		setPodStatus(c, "p", true)
		c.must(c.post(pdbPath, pdb("b1", 1, "x")))
		c.must(c.post(pdbPath, pdb("b2", 1, "x")))
		return summary(evict(c, "p", nil))
	})
	add("eviction/unready-pod-healthy-budget", func(c *tc) any {
		c.must(c.post(podPath, pod("p", map[string]any{"app": "x"}, "")))
		setPodStatus(c, "p", false)
		c.must(c.post(pdbPath, pdb("b", 1, "x")))
		setPDBStatus(c, "b", 0, 2, 1, true)
		return []any{summary(evict(c, "p", nil)), c.get(podPath + "/p").Code}
	})
	add("eviction/missing-pod", func(c *tc) any { return summary(evict(c, "nope", nil)) })
	add("eviction/on-node-graceful", func(c *tc) any {
		c.must(c.post(podPath, pod("p", map[string]any{"app": "x"}, "n1")))
		setPodStatus(c, "p", true)
		r := evict(c, "p", nil)
		return []any{summary(r), summary(c.get(podPath + "/p"))}
	})

	// TokenRequest.
	tokenReq := func(exp int) map[string]any {
		spec := map[string]any{}
		if exp > 0 {
			spec["expirationSeconds"] = exp
		}
		return map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
	}
	add("token/default", func(c *tc) any {
		c.must(c.post(saPath, map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": "sa"}}))
		r := c.post(saPath+"/sa/token", tokenReq(0))
		tok, _ := r.Obj["status"].(map[string]any)["token"].(string)
		return []any{pick(r, "kind", "apiVersion", "spec.expirationSeconds", "status.token", "status.expirationTimestamp"), strings.Count(tok, ".")}
	})
	add("token/expiration", func(c *tc) any {
		c.must(c.post(saPath, map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": "sa"}}))
		return pick(c.post(saPath+"/sa/token", tokenReq(7200)), "spec.expirationSeconds")
	})
	add("token/too-short", func(c *tc) any {
		c.must(c.post(saPath, map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": "sa"}}))
		return c.post(saPath+"/sa/token", tokenReq(60)).Code
	})
	add("token/missing-sa", func(c *tc) any { return summary(c.post(saPath+"/nope/token", tokenReq(0))) })

	// Table output.
	add("table/configmaps", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, map[string]any{"x": "1", "y": "2"})))
		return tableView(c.getTable(cmPath), true)
	})
	add("table/configmap-single", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, map[string]any{"x": "1"})))
		return tableView(c.getTable(cmPath+"/a"), true)
	})
	add("table/crd-printer-columns", func(c *tc) any {
		c.must(c.post(widgetPath, widget("w", map[string]any{"color": "red", "size": 3})))
		return tableView(c.getTable(widgetPath), true)
	})
	add("table/namespace", func(c *tc) any { return tableView(c.getTable("/api/v1/namespaces/{ns}"), true) })
	add("table/secrets", func(c *tc) any {
		c.must(c.post("/api/v1/namespaces/{ns}/secrets", map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "s"}, "data": map[string]any{"a": "Yg=="}}))
		return tableView(c.getTable("/api/v1/namespaces/{ns}/secrets"), true)
	})

	// Watches.
	add("watch/crud-sequence", func(c *tc) any {
		w := c.watch(cmPath + "?watch=1")
		c.must(c.post(cmPath, cm("a", nil, nil)))
		c.must(c.patch(cmPath+"/a", "application/merge-patch+json", `{"data":{"x":"1"}}`))
		c.must(c.del(cmPath+"/a", nil))
		return w.collect(3, 5*time.Second)
	})
	add("watch/initial-state", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		c.must(c.post(cmPath, cm("b", nil, nil)))
		w := c.watch(cmPath + "?watch=1")
		return w.collect(2, 5*time.Second)
	})
	add("watch/from-resource-version", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		l := c.must(c.get(cmPath)).Obj
		c.must(c.post(cmPath, cm("b", nil, nil)))
		c.must(c.del(cmPath+"/a", nil))
		w := c.watch(cmPath + "?watch=1&resourceVersion=" + rvOf(l))
		return w.collect(2, 5*time.Second)
	})
	// A watch from before the resource existed must be refused with 410.
	// Widgets, not ConfigMaps: kube-apiserver's ConfigMap watch cache starts
	// from an empty etcd, so resourceVersion 1 becomes too old there only
	// once the cache has evicted events (a matter of time and load), and
	// dev-k8s's ConfigMaps only once its history wrapped. A CRD's resource
	// starts at the revision it was created at on both servers, so 1 is too
	// old from the start.
	add("watch/too-old", func(c *tc) any {
		w := c.watch(widgetPath + "?watch=1&resourceVersion=1")
		return []any{w.code, w.collect(2, 5*time.Second)}
	})
	add("watch/label-selector-transitions", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", map[string]any{"sel": "yes"}, nil)))
		l := c.must(c.get(cmPath)).Obj
		w := c.watch(cmPath + "?watch=1&labelSelector=sel%3Dyes&resourceVersion=" + rvOf(l))
		c.must(c.patch(cmPath+"/a", "application/merge-patch+json", `{"metadata":{"labels":{"sel":"no"}}}`))
		c.must(c.patch(cmPath+"/a", "application/merge-patch+json", `{"metadata":{"labels":{"sel":"yes"}}}`))
		c.must(c.post(cmPath, cm("b", map[string]any{"sel": "no"}, nil)))
		c.must(c.patch(cmPath+"/a", "application/merge-patch+json", `{"data":{"x":"1"}}`))
		return w.collect(3, 5*time.Second)
	})
	add("watch/field-selector-name", func(c *tc) any {
		l := c.must(c.get(cmPath)).Obj
		w := c.watch(cmPath + "?watch=1&fieldSelector=metadata.name%3Db&resourceVersion=" + rvOf(l))
		c.must(c.post(cmPath, cm("a", nil, nil)))
		c.must(c.post(cmPath, cm("b", nil, nil)))
		c.must(c.del(cmPath+"/b", nil))
		return w.collect(2, 5*time.Second)
	})
	add("watch/initial-events-bookmark", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		w := c.watch(cmPath + "?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan")
		return w.collect(2, 5*time.Second)
	})
	add("watch/cluster-scoped", func(c *tc) any {
		l := c.must(c.get(gadgetPath)).Obj
		w := c.watch(gadgetPath + "?watch=1&labelSelector=case%3D" + c.ns + "&resourceVersion=" + rvOf(l))
		g := map[string]any{"apiVersion": testGroup + "/v1", "kind": "Gadget", "metadata": map[string]any{"name": c.ns + "-w", "labels": map[string]any{"case": c.ns}}}
		c.must(c.post(gadgetPath, g))
		c.must(c.del(gadgetPath+"/"+c.ns+"-w", nil))
		return w.collect(2, 5*time.Second)
	})
	add("watch/finalizer-flow", func(c *tc) any {
		l := c.must(c.get(cmPath)).Obj
		w := c.watch(cmPath + "?watch=1&resourceVersion=" + rvOf(l))
		c.must(c.post(cmPath, withFinalizers(cm("a", nil, nil), "test/f")))
		c.must(c.del(cmPath+"/a", nil))
		c.must(c.patch(cmPath+"/a", "application/merge-patch+json", `{"metadata":{"finalizers":null}}`))
		return w.collect(3, 5*time.Second)
	})
	add("watch/pods-node", func(c *tc) any {
		l := c.must(c.get(podPath)).Obj
		w := c.watch(podPath + "?watch=1&fieldSelector=spec.nodeName%3Dn1&resourceVersion=" + rvOf(l))
		c.must(c.post(podPath, pod("p1", nil, "n1")))
		c.must(c.post(podPath, pod("p2", nil, "n2")))
		c.must(c.del(podPath+"/p1?gracePeriodSeconds=0", nil))
		return w.collect(3, 5*time.Second)
	})
	add("watch/noop-update-no-event", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, map[string]any{"x": "1"})))
		l := c.must(c.get(cmPath)).Obj
		w := c.watch(cmPath + "?watch=1&resourceVersion=" + rvOf(l))
		c.must(c.patch(cmPath+"/a", "application/merge-patch+json", `{"data":{"x":"1"}}`))
		c.must(c.patch(cmPath+"/a", "application/merge-patch+json", `{"data":{"x":"2"}}`))
		return w.collect(1, 5*time.Second)
	})

	// CRD lifecycle.
	add("crd/create-and-serve", func(c *tc) any {
		plural := "things" + strings.ReplaceAll(c.ns, "-", "")
		crd := testCRD(plural, "Thing"+strings.ReplaceAll(c.ns, "-", ""), true, true)
		r := c.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
		p := "/apis/" + testGroup + "/v1/namespaces/{ns}/" + plural
		c.eventually(func() bool { return c.get(p).Code == http.StatusOK })
		kind := "Thing" + strings.ReplaceAll(c.ns, "-", "")
		created := c.post(p, map[string]any{"apiVersion": testGroup + "/v1", "kind": kind, "metadata": map[string]any{"name": "t"}, "spec": map[string]any{"a": 1}})
		return []any{r.Code, pick(r, "spec.names", "spec.scope"), summary(created)}
	})
	add("crd/established", func(c *tc) any {
		plural := "bits" + strings.ReplaceAll(c.ns, "-", "")
		c.must(c.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", testCRD(plural, "Bit"+strings.ReplaceAll(c.ns, "-", ""), false, false)))
		name := "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + plural + "." + testGroup
		var conds []string
		c.eventually(func() bool {
			o := getObj(c, name)
			conds = nil
			st, _ := o["status"].(map[string]any)
			cl, _ := st["conditions"].([]any)
			for _, x := range cl {
				m, _ := x.(map[string]any)
				conds = append(conds, fmt.Sprintf("%v=%v", m["type"], m["status"]))
			}
			sort.Strings(conds)
			return len(conds) == 2 && conds[0] == "Established=True"
		})
		return []any{conds, pick(c.get(name), "status.acceptedNames.kind", "status.storedVersions")}
	})
	add("crd/delete-removes-objects", func(c *tc) any {
		plural := "bobs" + strings.ReplaceAll(c.ns, "-", "")
		kind := "Bob" + strings.ReplaceAll(c.ns, "-", "")
		c.must(c.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", testCRD(plural, kind, true, false)))
		p := "/apis/" + testGroup + "/v1/namespaces/{ns}/" + plural
		c.eventually(func() bool { return c.get(p).Code == http.StatusOK })
		c.must(c.post(p, map[string]any{"apiVersion": testGroup + "/v1", "kind": kind, "metadata": map[string]any{"name": "b"}}))
		c.must(c.del("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"+plural+"."+testGroup, nil))
		c.eventually(func() bool {
			return c.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"+plural+"."+testGroup).Code == http.StatusNotFound
		})
		c.eventually(func() bool { return c.get(p).Code == http.StatusNotFound })
		return c.get(p).Code
	})
	add("crd/bad-name", func(c *tc) any {
		crd := testCRD("parts", "Part", true, false)
		crd["metadata"] = map[string]any{"name": "wrong.name.example"}
		return c.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd).Code
	})
	return cases
}

func TestSemantics(t *testing.T) {
	runTable(t, semanticCases())
}
