package difftest

import (
	"testing"
	"time"
)

// apps/v1 workloads: the per-kind CRUD cases (appsKinds, run by TestKinds)
// and the defaulting, validation, generation and status cases of TestApps.

const (
	deployPath = "/apis/apps/v1/namespaces/{ns}/deployments"
	rsPath     = "/apis/apps/v1/namespaces/{ns}/replicasets"
	stsPath    = "/apis/apps/v1/namespaces/{ns}/statefulsets"
	dsPath     = "/apis/apps/v1/namespaces/{ns}/daemonsets"
)

// workloadSpec is a minimal valid spec: selector app=web, a matching
// template with one container.
func workloadSpec() map[string]any {
	return map[string]any{
		"selector": map[string]any{"matchLabels": map[string]any{"app": "web"}},
		"template": map[string]any{
			"metadata": map[string]any{"labels": map[string]any{"app": "web"}},
			"spec":     map[string]any{"containers": []any{map[string]any{"name": "c", "image": "busybox:1.36"}}},
		},
	}
}

func setImage(o map[string]any, image string) {
	spec := o["spec"].(map[string]any)
	tmpl := spec["template"].(map[string]any)
	cs := tmpl["spec"].(map[string]any)["containers"].([]any)
	cs[0].(map[string]any)["image"] = image
}

func appsKind(name, kindName, collection string) kind {
	return kind{name: name, apiVersion: "apps/v1", kind: kindName, collection: collection,
		body:   func(c *tc, _ string) map[string]any { return map[string]any{"spec": workloadSpec()} },
		mutate: func(o map[string]any) { setImage(o, "busybox:1.37") }}
}

var appsKinds = []kind{
	appsKind("deployment", "Deployment", deployPath),
	appsKind("replicaset", "ReplicaSet", rsPath),
	appsKind("statefulset", "StatefulSet", stsPath),
	appsKind("daemonset", "DaemonSet", dsPath),
}

var appsKindOf = map[string]string{deployPath: "Deployment", rsPath: "ReplicaSet", stsPath: "StatefulSet", dsPath: "DaemonSet"}

// workload builds an apps object for path with edit applied to its spec.
func workload(path, name string, edit func(spec map[string]any)) map[string]any {
	spec := workloadSpec()
	if edit != nil {
		edit(spec)
	}
	return map[string]any{"apiVersion": "apps/v1", "kind": appsKindOf[path], "metadata": map[string]any{"name": name}, "spec": spec}
}

func tmplSpec(spec map[string]any) map[string]any {
	return spec["template"].(map[string]any)["spec"].(map[string]any)
}

func appsCases() []diffCase {
	var cases []diffCase
	add := func(name string, run func(c *tc) any) {
		cases = append(cases, diffCase{name: name, run: run})
	}
	all := []string{deployPath, rsPath, stsPath, dsPath}
	short := map[string]string{deployPath: "deploy", rsPath: "rs", stsPath: "sts", dsPath: "ds"}

	// Spec edits every kind refuses (or accepts) the same way.
	invalid := []struct {
		name string
		edit func(spec map[string]any)
	}{
		{"no-selector", func(s map[string]any) { delete(s, "selector") }},
		{"empty-selector", func(s map[string]any) { s["selector"] = map[string]any{} }},
		{"selector-mismatch", func(s map[string]any) { s["selector"] = map[string]any{"matchLabels": map[string]any{"app": "other"}} }},
		{"bad-selector-operator", func(s map[string]any) {
			s["selector"] = map[string]any{"matchExpressions": []any{map[string]any{"key": "app", "operator": "Near", "values": []any{"web"}}}}
		}},
		{"bad-selector-label", func(s map[string]any) {
			s["selector"] = map[string]any{"matchLabels": map[string]any{"app": "web", "bad key!": "x"}}
		}},
		{"selector-expression-match", func(s map[string]any) {
			s["selector"] = map[string]any{"matchExpressions": []any{map[string]any{"key": "app", "operator": "In", "values": []any{"web", "api"}}}}
		}},
		{"no-template-labels", func(s map[string]any) { delete(s["template"].(map[string]any), "metadata") }},
		{"bad-template-label", func(s map[string]any) {
			s["template"].(map[string]any)["metadata"] = map[string]any{"labels": map[string]any{"app": "web", "x": "not valid!"}}
		}},
		{"no-containers", func(s map[string]any) { tmplSpec(s)["containers"] = []any{} }},
		{"container-no-name", func(s map[string]any) {
			tmplSpec(s)["containers"] = []any{map[string]any{"image": "busybox"}}
		}},
		{"container-bad-name", func(s map[string]any) {
			tmplSpec(s)["containers"] = []any{map[string]any{"name": "Bad_Name", "image": "busybox"}}
		}},
		{"container-no-image", func(s map[string]any) { tmplSpec(s)["containers"] = []any{map[string]any{"name": "c"}} }},
		{"container-duplicate", func(s map[string]any) {
			tmplSpec(s)["containers"] = []any{map[string]any{"name": "c", "image": "a"}, map[string]any{"name": "c", "image": "b"}}
		}},
		{"restart-never", func(s map[string]any) { tmplSpec(s)["restartPolicy"] = "Never" }},
		{"active-deadline", func(s map[string]any) { tmplSpec(s)["activeDeadlineSeconds"] = 30 }},
		{"negative-min-ready", func(s map[string]any) { s["minReadySeconds"] = -1 }},
		{"negative-history", func(s map[string]any) { s["revisionHistoryLimit"] = -2 }},
		{"untagged-image", func(s map[string]any) {
			tmplSpec(s)["containers"] = []any{map[string]any{"name": "c", "image": "busybox", "ports": []any{map[string]any{"containerPort": 80}}}}
		}},
		{"latest-image", func(s map[string]any) {
			tmplSpec(s)["containers"] = []any{map[string]any{"name": "c", "image": "registry.example.com:5000/busybox:latest"}}
		}},
		{"digest-image", func(s map[string]any) {
			tmplSpec(s)["containers"] = []any{map[string]any{"name": "c", "image": "busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000"}}
		}},
		{"init-container", func(s map[string]any) {
			tmplSpec(s)["initContainers"] = []any{map[string]any{"name": "init", "image": "busybox:1"}}
		}},
		{"init-container-clash", func(s map[string]any) {
			tmplSpec(s)["initContainers"] = []any{map[string]any{"name": "c", "image": "busybox:1"}}
		}},
		{"wrong-type-replicas", func(s map[string]any) { s["minReadySeconds"] = "soon" }},
	}
	for _, p := range all {
		p := p
		for _, iv := range invalid {
			iv := iv
			add("create/"+short[p]+"/"+iv.name, func(c *tc) any { return summary(c.post(p, workload(p, "w", iv.edit))) })
		}
		add("create/"+short[p]+"/status-ignored", func(c *tc) any {
			o := workload(p, "w", nil)
			o["status"] = map[string]any{"replicas": 3, "observedGeneration": 7}
			return summary(c.post(p, o))
		})
		add("create/"+short[p]+"/bad-name", func(c *tc) any { return summary(c.post(p, workload(p, "web.v1", nil))) })
		add("update/"+short[p]+"/selector-immutable", func(c *tc) any {
			c.must(c.post(p, workload(p, "w", nil)))
			o := getObj(c, p+"/w")
			spec := o["spec"].(map[string]any)
			spec["selector"] = map[string]any{"matchLabels": map[string]any{"app": "web", "tier": "x"}}
			spec["template"].(map[string]any)["metadata"] = map[string]any{"labels": map[string]any{"app": "web", "tier": "x"}}
			return summary(c.put(p+"/w", o))
		})
		add("update/"+short[p]+"/template-generation", func(c *tc) any {
			c.must(c.post(p, workload(p, "w", nil)))
			o := getObj(c, p+"/w")
			setImage(o, "busybox:1.38")
			first := c.must(c.put(p+"/w", o)).Obj
			first["metadata"].(map[string]any)["labels"] = map[string]any{"only": "labels"}
			second := c.put(p+"/w", first)
			return []any{pick(resp{Code: 200, Obj: first}, "metadata.generation", "metadata.annotations"), pick(second, "metadata.generation", "metadata.annotations")}
		})
		add("update/"+short[p]+"/annotation-generation", func(c *tc) any {
			c.must(c.post(p, workload(p, "w", nil)))
			return pick(c.patch(p+"/w", "application/merge-patch+json", `{"metadata":{"annotations":{"note":"x"}}}`), "metadata.generation", "metadata.annotations")
		})
		add("update/"+short[p]+"/sparse-put", func(c *tc) any {
			c.must(c.post(p, workload(p, "w", nil)))
			o := getObj(c, p+"/w")
			o["spec"] = workloadSpec()
			return pick(c.put(p+"/w", o), "metadata.generation", "spec")
		})
		add("update/"+short[p]+"/invalid", func(c *tc) any {
			c.must(c.post(p, workload(p, "w", nil)))
			return summary(c.patch(p+"/w", "application/merge-patch+json", `{"spec":{"template":{"spec":{"containers":[{"name":"c","image":""}]}}}}`))
		})
		add("update/"+short[p]+"/status-through-main", func(c *tc) any {
			c.must(c.post(p, workload(p, "w", nil)))
			return summary(c.patch(p+"/w", "application/merge-patch+json", `{"status":{"observedGeneration":5}}`))
		})
		add("status/"+short[p]+"/ignores-spec", func(c *tc) any {
			c.must(c.post(p, workload(p, "w", nil)))
			return summary(c.patch(p+"/w/status", "application/merge-patch+json", `{"spec":{"minReadySeconds":9},"status":{"observedGeneration":1}}`))
		})
		add("status/"+short[p]+"/negative", func(c *tc) any {
			c.must(c.post(p, workload(p, "w", nil)))
			return summary(c.patch(p+"/w/status", "application/merge-patch+json", `{"status":{"observedGeneration":-1}}`))
		})
		add("list/"+short[p]+"/label-selector", func(c *tc) any {
			a := workload(p, "a", nil)
			a["metadata"].(map[string]any)["labels"] = map[string]any{"team": "x"}
			c.must(c.post(p, a))
			c.must(c.post(p, workload(p, "b", nil)))
			return []any{summary(c.get(p + "?labelSelector=team%3Dx")), summary(c.get(p + "?fieldSelector=metadata.name%3Db")), summary(c.get(p + "?fieldSelector=spec.replicas%3D1"))}
		})
		add("table/"+short[p], func(c *tc) any {
			c.must(c.post(p, workload(p, "w", nil)))
			return tableView(c.getTable(p), true)
		})
	}

	// Per-kind rules.
	add("create/deploy/recreate-with-rolling", func(c *tc) any {
		return summary(c.post(deployPath, workload(deployPath, "w", func(s map[string]any) {
			s["strategy"] = map[string]any{"type": "Recreate", "rollingUpdate": map[string]any{"maxSurge": 1}}
		})))
	})
	add("create/deploy/recreate", func(c *tc) any {
		return summary(c.post(deployPath, workload(deployPath, "w", func(s map[string]any) { s["strategy"] = map[string]any{"type": "Recreate"} })))
	})
	add("create/deploy/bad-strategy", func(c *tc) any {
		return summary(c.post(deployPath, workload(deployPath, "w", func(s map[string]any) { s["strategy"] = map[string]any{"type": "Blue"} })))
	})
	add("create/deploy/zero-surge-unavailable", func(c *tc) any {
		return summary(c.post(deployPath, workload(deployPath, "w", func(s map[string]any) {
			s["strategy"] = map[string]any{"rollingUpdate": map[string]any{"maxSurge": 0, "maxUnavailable": "0%"}}
		})))
	})
	add("create/deploy/over-100", func(c *tc) any {
		return summary(c.post(deployPath, workload(deployPath, "w", func(s map[string]any) {
			s["strategy"] = map[string]any{"rollingUpdate": map[string]any{"maxUnavailable": "150%"}}
		})))
	})
	add("create/deploy/bad-percent", func(c *tc) any {
		return summary(c.post(deployPath, workload(deployPath, "w", func(s map[string]any) {
			s["strategy"] = map[string]any{"rollingUpdate": map[string]any{"maxSurge": "ten"}}
		})))
	})
	add("create/deploy/negative-replicas", func(c *tc) any {
		return summary(c.post(deployPath, workload(deployPath, "w", func(s map[string]any) { s["replicas"] = -1 })))
	})
	add("create/deploy/deadline-not-above-min-ready", func(c *tc) any {
		return summary(c.post(deployPath, workload(deployPath, "w", func(s map[string]any) {
			s["minReadySeconds"] = 30
			s["progressDeadlineSeconds"] = 30
		})))
	})
	add("create/rs/negative-replicas", func(c *tc) any {
		return summary(c.post(rsPath, workload(rsPath, "w", func(s map[string]any) { s["replicas"] = -3 })))
	})
	add("create/sts/negative-replicas", func(c *tc) any {
		return summary(c.post(stsPath, workload(stsPath, "w", func(s map[string]any) { s["replicas"] = -1 })))
	})
	add("create/sts/bad-pod-management", func(c *tc) any {
		return summary(c.post(stsPath, workload(stsPath, "w", func(s map[string]any) { s["podManagementPolicy"] = "Random" })))
	})
	add("create/sts/parallel-ondelete", func(c *tc) any {
		return summary(c.post(stsPath, workload(stsPath, "w", func(s map[string]any) {
			s["podManagementPolicy"] = "Parallel"
			s["updateStrategy"] = map[string]any{"type": "OnDelete"}
		})))
	})
	add("create/sts/ondelete-with-rolling", func(c *tc) any {
		return summary(c.post(stsPath, workload(stsPath, "w", func(s map[string]any) {
			s["updateStrategy"] = map[string]any{"type": "OnDelete", "rollingUpdate": map[string]any{"partition": 1}}
		})))
	})
	add("create/sts/bad-update-strategy", func(c *tc) any {
		return summary(c.post(stsPath, workload(stsPath, "w", func(s map[string]any) { s["updateStrategy"] = map[string]any{"type": "Sometimes"} })))
	})
	add("create/sts/negative-partition", func(c *tc) any {
		return summary(c.post(stsPath, workload(stsPath, "w", func(s map[string]any) {
			s["updateStrategy"] = map[string]any{"type": "RollingUpdate", "rollingUpdate": map[string]any{"partition": -1}}
		})))
	})
	add("create/sts/rolling-explicit", func(c *tc) any {
		return summary(c.post(stsPath, workload(stsPath, "w", func(s map[string]any) {
			s["updateStrategy"] = map[string]any{"type": "RollingUpdate"}
		})))
	})
	add("create/sts/bad-service-name", func(c *tc) any {
		return summary(c.post(stsPath, workload(stsPath, "w", func(s map[string]any) { s["serviceName"] = "Not_A_Label" })))
	})
	add("create/sts/bad-retention", func(c *tc) any {
		return summary(c.post(stsPath, workload(stsPath, "w", func(s map[string]any) {
			s["persistentVolumeClaimRetentionPolicy"] = map[string]any{"whenDeleted": "Keep"}
		})))
	})
	add("update/sts/forbidden-field", func(c *tc) any {
		c.must(c.post(stsPath, workload(stsPath, "w", func(s map[string]any) { s["serviceName"] = "web" })))
		return summary(c.patch(stsPath+"/w", "application/merge-patch+json", `{"spec":{"serviceName":"other"}}`))
	})
	add("update/sts/replicas-allowed", func(c *tc) any {
		c.must(c.post(stsPath, workload(stsPath, "w", nil)))
		return pick(c.patch(stsPath+"/w", "application/merge-patch+json", `{"spec":{"replicas":3}}`), "metadata.generation", "spec.replicas")
	})
	add("create/ds/ondelete", func(c *tc) any {
		return summary(c.post(dsPath, workload(dsPath, "w", func(s map[string]any) { s["updateStrategy"] = map[string]any{"type": "OnDelete"} })))
	})
	add("create/ds/bad-strategy", func(c *tc) any {
		return summary(c.post(dsPath, workload(dsPath, "w", func(s map[string]any) { s["updateStrategy"] = map[string]any{"type": "Sideways"} })))
	})
	add("create/ds/surge-and-unavailable", func(c *tc) any {
		return summary(c.post(dsPath, workload(dsPath, "w", func(s map[string]any) {
			s["updateStrategy"] = map[string]any{"rollingUpdate": map[string]any{"maxSurge": 1, "maxUnavailable": 1}}
		})))
	})
	add("create/ds/zero-both", func(c *tc) any {
		return summary(c.post(dsPath, workload(dsPath, "w", func(s map[string]any) {
			s["updateStrategy"] = map[string]any{"rollingUpdate": map[string]any{"maxSurge": 0, "maxUnavailable": 0}}
		})))
	})
	add("create/ds/surge-only", func(c *tc) any {
		return summary(c.post(dsPath, workload(dsPath, "w", func(s map[string]any) {
			s["updateStrategy"] = map[string]any{"rollingUpdate": map[string]any{"maxSurge": "10%", "maxUnavailable": 0}}
		})))
	})
	add("create/ds/template-generation-given", func(c *tc) any {
		o := workload(dsPath, "w", nil)
		o["metadata"].(map[string]any)["annotations"] = map[string]any{"deprecated.daemonset.template.generation": "4"}
		return pick(c.post(dsPath, o), "metadata.annotations", "metadata.generation")
	})
	add("create/ds/node-selector-tolerations", func(c *tc) any {
		return summary(c.post(dsPath, workload(dsPath, "w", func(s map[string]any) {
			ts := tmplSpec(s)
			ts["nodeSelector"] = map[string]any{"role": "edge"}
			ts["tolerations"] = []any{map[string]any{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}}
		})))
	})
	add("status/ds/counts", func(c *tc) any {
		c.must(c.post(dsPath, workload(dsPath, "w", nil)))
		return summary(c.patch(dsPath+"/w/status", "application/merge-patch+json",
			`{"status":{"observedGeneration":1,"desiredNumberScheduled":2,"currentNumberScheduled":2,"numberReady":1,"numberAvailable":1,"numberUnavailable":1,"updatedNumberScheduled":2}}`))
	})
	add("status/ds/negative-ready", func(c *tc) any {
		c.must(c.post(dsPath, workload(dsPath, "w", nil)))
		return summary(c.patch(dsPath+"/w/status", "application/merge-patch+json", `{"status":{"numberReady":-1,"desiredNumberScheduled":-2}}`))
	})
	add("status/deploy/ready-above-replicas", func(c *tc) any {
		c.must(c.post(deployPath, workload(deployPath, "w", nil)))
		return summary(c.patch(deployPath+"/w/status", "application/merge-patch+json", `{"status":{"replicas":1,"readyReplicas":2,"availableReplicas":3}}`))
	})
	add("status/rs/available-above-ready", func(c *tc) any {
		c.must(c.post(rsPath, workload(rsPath, "w", nil)))
		return summary(c.patch(rsPath+"/w/status", "application/merge-patch+json", `{"status":{"replicas":3,"readyReplicas":1,"availableReplicas":2}}`))
	})
	add("status/sts/counts", func(c *tc) any {
		c.must(c.post(stsPath, workload(stsPath, "w", nil)))
		return summary(c.patch(stsPath+"/w/status", "application/merge-patch+json", `{"status":{"replicas":1,"readyReplicas":2,"currentReplicas":3,"availableReplicas":2}}`))
	})
	add("list/rs/no-status-field-selector", func(c *tc) any {
		c.must(c.post(rsPath, workload(rsPath, "a", nil)))
		c.must(c.patch(rsPath+"/a/status", "application/merge-patch+json", `{"status":{"replicas":2}}`))
		c.must(c.post(rsPath, workload(rsPath, "b", nil)))
		return summary(c.get(rsPath + "?fieldSelector=" + q("status.replicas=2")))
	})
	// Server-side apply (kubectl apply --server-side) and strategic merge
	// patches (kubectl apply, kubectl set image) on the apps kinds.
	dsYAML := func(image, selectorExtra string) string {
		return "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: ap\nspec:\n  selector:\n    matchLabels:\n      app: web\n" + selectorExtra +
			"  template:\n    metadata:\n      labels:\n        app: web\n        tier: x\n    spec:\n      containers:\n      - name: c\n        image: " + image + "\n"
	}
	applyDS := func(c *tc, yaml string) resp {
		return c.patch(dsPath+"/ap?fieldManager=kubectl", "application/apply-patch+yaml", yaml)
	}
	add("apply/ds-create", func(c *tc) any {
		r := applyDS(c, dsYAML("busybox:1.36", ""))
		return []any{summary(r), managers(r)}
	})
	add("apply/ds-change-image", func(c *tc) any {
		c.must(applyDS(c, dsYAML("busybox:1.36", "")))
		return pick(applyDS(c, dsYAML("busybox:1.37", "")), "metadata.generation", "metadata.annotations", "spec.template.spec.containers")
	})
	add("apply/ds-same-again", func(c *tc) any {
		c.must(applyDS(c, dsYAML("busybox:1.36", "")))
		return pick(applyDS(c, dsYAML("busybox:1.36", "")), "metadata.generation", "metadata.annotations")
	})
	add("apply/ds-selector-immutable", func(c *tc) any {
		c.must(applyDS(c, dsYAML("busybox:1.36", "")))
		return summary(applyDS(c, dsYAML("busybox:1.36", "      tier: x\n")))
	})
	add("apply/ds-invalid", func(c *tc) any {
		return summary(applyDS(c, dsYAML("\"\"", "")))
	})
	for _, p := range all {
		p := p
		add("patch/"+short[p]+"/strategic-container", func(c *tc) any {
			c.must(c.post(p, workload(p, "w", nil)))
			return pick(c.patch(p+"/w", "application/strategic-merge-patch+json",
				`{"spec":{"template":{"spec":{"containers":[{"name":"c","image":"busybox:1.38"},{"name":"side","image":"busybox"}]}}}}`),
				"metadata.generation", "metadata.annotations", "spec.template.spec.containers")
		})
		add("patch/"+short[p]+"/json-remove-selector", func(c *tc) any {
			c.must(c.post(p, workload(p, "w", nil)))
			return summary(c.patch(p+"/w", "application/json-patch+json", `[{"op":"remove","path":"/spec/selector"}]`))
		})
		add("patch/"+short[p]+"/dry-run", func(c *tc) any {
			c.must(c.post(p, workload(p, "w", nil)))
			r := c.patch(p+"/w?dryRun=All", "application/merge-patch+json", `{"spec":{"minReadySeconds":5}}`)
			return []any{pick(r, "metadata.generation", "spec.minReadySeconds"), pick(c.get(p+"/w"), "metadata.generation", "spec.minReadySeconds")}
		})
	}
	add("discovery/apps", func(c *tc) any {
		return discoveryEntry(c.get("/apis/apps/v1"), "deployments", "deployments/status", "replicasets", "replicasets/status",
			"statefulsets", "statefulsets/status", "daemonsets", "daemonsets/status")
	})
	add("discovery/apps-group", func(c *tc) any { return pick(c.get("/apis/apps"), "kind", "name", "preferredVersion") })
	add("delete/ds-orphan", func(c *tc) any {
		c.must(c.post(dsPath, workload(dsPath, "w", nil)))
		r := c.del(dsPath+"/w", map[string]any{"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Orphan"})
		return []any{pick(r, "kind", "metadata.finalizers", "metadata.deletionTimestamp"), summary(c.get(dsPath + "/w"))}
	})
	add("watch/ds", func(c *tc) any {
		ws := c.watch(dsPath + "?watch=true")
		c.must(c.post(dsPath, workload(dsPath, "w", nil)))
		c.must(c.patch(dsPath+"/w/status", "application/merge-patch+json", `{"status":{"desiredNumberScheduled":1}}`))
		c.must(c.del(dsPath+"/w", nil))
		return ws.collect(3, 10*time.Second)
	})
	return cases
}

func TestApps(t *testing.T) {
	runTable(t, appsCases())
}
