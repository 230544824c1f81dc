package difftest

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
)

// Cases on custom resource schemas: OpenAPI validation, CEL rules
// (transition rules included), defaulting, pruning, metadata validation,
// generation, status subresource isolation and multiple versions. Each case
// compares every answer (code, reason, message, causes) and the stored
// object read back.

const (
	sprocketsV1      = "/apis/" + testGroup + "/v1/namespaces/{ns}/sprockets"
	sprocketsV1beta1 = "/apis/" + testGroup + "/v1beta1/namespaces/{ns}/sprockets"
	gizmosV1         = "/apis/" + testGroup + "/v1/gizmos"
)

func sprocket(version, name string, spec map[string]any) map[string]any {
	return map[string]any{
		"apiVersion": testGroup + "/" + version, "kind": "Sprocket",
		"metadata": map[string]any{"name": name}, "spec": spec,
	}
}

func baseSpec() map[string]any {
	return map[string]any{"size": 3, "class": "gold", "immutableID": "id-1", "counter": 5, "tags": []any{"a"},
		"window": map[string]any{"start": 1, "end": 2}}
}

func withSpec(extra map[string]any) map[string]any {
	s := baseSpec()
	for k, v := range extra {
		if v == nil {
			delete(s, k)
			continue
		}
		s[k] = v
	}
	return s
}

func versionPath(version string) string {
	if version == "v1beta1" {
		return sprocketsV1beta1
	}
	return sprocketsV1
}

// createCases posts one object per row in both versions and reads it back.
func schemaCreateCases() []diffCase {
	rows := []struct {
		name string
		body func(version string) map[string]any
	}{
		{"valid-defaults", func(v string) map[string]any { return sprocket(v, "s", map[string]any{"size": 1}) }},
		{"valid-full", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"color": "blue", "name": "abc", "ratio": 0.5, "enabled": true, "note": "n",
				"ports":  []any{map[string]any{"name": "http"}, map[string]any{"name": "https", "port": 443}},
				"labels": map[string]any{"a": "b"}, "settings": map[string]any{"timeout": 5}}))
		}},
		{"type-integer", func(v string) map[string]any { return sprocket(v, "s", map[string]any{"size": "three"}) }},
		{"type-integer-float", func(v string) map[string]any { return sprocket(v, "s", map[string]any{"size": 1.5}) }},
		{"type-string", func(v string) map[string]any { return sprocket(v, "s", withSpec(map[string]any{"color": 5})) }},
		{"type-boolean", func(v string) map[string]any { return sprocket(v, "s", withSpec(map[string]any{"enabled": "yes"})) }},
		{"type-number", func(v string) map[string]any { return sprocket(v, "s", withSpec(map[string]any{"ratio": "half"})) }},
		{"type-array", func(v string) map[string]any { return sprocket(v, "s", withSpec(map[string]any{"tags": "a"})) }},
		{"type-object", func(v string) map[string]any { return sprocket(v, "s", withSpec(map[string]any{"settings": "x"})) }},
		{"type-spec", func(v string) map[string]any { return sprocket(v, "s", nil) }},
		{"type-map-value", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"labels": map[string]any{"a": 1}}))
		}},
		{"required-missing", func(v string) map[string]any { return sprocket(v, "s", map[string]any{"color": "red"}) }},
		{"required-null", func(v string) map[string]any { return sprocket(v, "s", map[string]any{"size": nil}) }},
		{"required-in-list", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"ports": []any{map[string]any{"port": 1}}}))
		}},
		{"no-spec", func(v string) map[string]any {
			o := sprocket(v, "s", nil)
			delete(o, "spec")
			return o
		}},
		{"enum", func(v string) map[string]any { return sprocket(v, "s", withSpec(map[string]any{"color": "pink"})) }},
		{"pattern", func(v string) map[string]any { return sprocket(v, "s", withSpec(map[string]any{"name": "ABC"})) }},
		{"max-length", func(v string) map[string]any { return sprocket(v, "s", withSpec(map[string]any{"name": "abcdefghij"})) }},
		{"minimum", func(v string) map[string]any { return sprocket(v, "s", withSpec(map[string]any{"size": 0})) }},
		{"maximum", func(v string) map[string]any { return sprocket(v, "s", withSpec(map[string]any{"size": 11})) }},
		{"exclusive-maximum", func(v string) map[string]any { return sprocket(v, "s", withSpec(map[string]any{"ratio": 1})) }},
		{"nested-maximum", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"ports": []any{map[string]any{"name": "x", "port": 70000}}}))
		}},
		{"max-items", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"tags": []any{"a", "b", "c", "d"}}))
		}},
		{"items-min-length", func(v string) map[string]any { return sprocket(v, "s", withSpec(map[string]any{"tags": []any{""}})) }},
		{"max-properties", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"labels": map[string]any{"a": "1", "b": "2", "c": "3"}}))
		}},
		{"list-set-duplicate", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"tags": []any{"a", "a"}}))
		}},
		{"list-map-duplicate", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"ports": []any{map[string]any{"name": "x"}, map[string]any{"name": "x", "port": 2}}}))
		}},
		{"cel-object-rule", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"minReplicas": 5, "maxReplicas": 2}))
		}},
		{"cel-default-satisfies-rule", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"minReplicas": 4}))
		}},
		{"cel-message-expression-field-path", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"window": map[string]any{"start": 5, "end": 1}}))
		}},
		{"cel-skipped-on-schema-error", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"size": "x", "minReplicas": 5, "maxReplicas": 2}))
		}},
		{"many-errors", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"size": 0, "color": "pink", "name": "A1", "tags": []any{"a", "a"}}))
		}},
		{"prune-unknown-spec", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"bogus": 1, "settings": map[string]any{"other": true}}))
		}},
		{"prune-unknown-root", func(v string) map[string]any {
			o := sprocket(v, "s", baseSpec())
			o["bogus"] = map[string]any{"x": 1}
			return o
		}},
		{"prune-in-list-items", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"ports": []any{map[string]any{"name": "a", "zzz": 1}}}))
		}},
		{"preserve-unknown", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"extra": map[string]any{"any": map[string]any{"deep": []any{1, "two"}}}}))
		}},
		{"prune-unknown-metadata", func(v string) map[string]any {
			o := sprocket(v, "s", baseSpec())
			o["metadata"].(map[string]any)["bogus"] = "x"
			return o
		}},
		{"nullable-null", func(v string) map[string]any { return sprocket(v, "s", withSpec(map[string]any{"note": nil, "x": 1})) }},
		{"null-defaulted", func(v string) map[string]any {
			s := baseSpec()
			s["color"] = nil
			return sprocket(v, "s", s)
		}},
		{"null-non-nullable", func(v string) map[string]any {
			s := baseSpec()
			s["class"] = nil
			return sprocket(v, "s", s)
		}},
		{"default-nested-object", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"settings": map[string]any{"mode": "manual"}}))
		}},
		{"status-dropped-on-create", func(v string) map[string]any {
			o := sprocket(v, "s", baseSpec())
			o["status"] = map[string]any{"phase": "Ready", "observed": 200}
			return o
		}},
		{"embedded-valid", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"embedded": map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": map[string]any{"name": "cm", "bogus": 1}, "data": map[string]any{"a": "b"}}}))
		}},
		{"embedded-missing-kind", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"embedded": map[string]any{"apiVersion": "v1", "metadata": map[string]any{"name": "cm"}}}))
		}},
		{"embedded-bad-name", func(v string) map[string]any {
			return sprocket(v, "s", withSpec(map[string]any{"embedded": map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": map[string]any{"name": "Bad_Name"}}}))
		}},
		{"meta-bad-name", func(v string) map[string]any { return sprocket(v, "Bad_Name", baseSpec()) }},
		{"meta-bad-name-and-spec", func(v string) map[string]any { return sprocket(v, "Bad_Name", map[string]any{"size": 0}) }},
		{"meta-bad-label-value", func(v string) map[string]any {
			o := sprocket(v, "s", baseSpec())
			o["metadata"].(map[string]any)["labels"] = map[string]any{"a": strings.Repeat("x", 64)}
			return o
		}},
		{"meta-bad-label-key", func(v string) map[string]any {
			o := sprocket(v, "s", baseSpec())
			o["metadata"].(map[string]any)["labels"] = map[string]any{"a/b/c": "x"}
			return o
		}},
		{"meta-annotations-too-large", func(v string) map[string]any {
			o := sprocket(v, "s", baseSpec())
			o["metadata"].(map[string]any)["annotations"] = map[string]any{"big": strings.Repeat("x", 256*1024)}
			return o
		}},
		{"meta-bad-annotation-key", func(v string) map[string]any {
			o := sprocket(v, "s", baseSpec())
			o["metadata"].(map[string]any)["annotations"] = map[string]any{"-bad": "x"}
			return o
		}},
		{"v1beta1-only-field", func(v string) map[string]any { return sprocket(v, "s", withSpec(map[string]any{"legacy": "old"})) }},
	}
	var out []diffCase
	for _, row := range rows {
		for _, version := range []string{"v1", "v1beta1"} {
			row, version := row, version
			out = append(out, diffCase{name: "cr-create-" + row.name + "-" + version, run: func(c *tc) any {
				r := c.post(versionPath(version), row.body(version))
				return []any{crSummary(r), crSummary(c.get(versionPath(version) + "/s")), crSummary(c.get(versionPath(otherVersion(version)) + "/s"))}
			}})
		}
	}
	return out
}

func otherVersion(v string) string {
	if v == "v1" {
		return "v1beta1"
	}
	return "v1"
}

// updateCases change a stored sprocket through every write verb.
func schemaUpdateCases() []diffCase {
	type mod struct {
		name string
		spec map[string]any // merged into the base spec (nil values remove)
		meta map[string]any // merged into metadata
		top  map[string]any // other top-level fields
	}
	mods := []mod{
		{name: "noop"},
		{name: "spec-change", spec: map[string]any{"size": 4}},
		{name: "label-only", meta: map[string]any{"labels": map[string]any{"x": "y"}}},
		{name: "invalid-minimum", spec: map[string]any{"size": 0}},
		{name: "invalid-enum", spec: map[string]any{"color": "pink"}},
		{name: "invalid-type", spec: map[string]any{"size": "big"}},
		{name: "immutable-cel", spec: map[string]any{"immutableID": "id-2"}},
		{name: "transition-decrease", spec: map[string]any{"counter": 4}},
		{name: "transition-increase", spec: map[string]any{"counter": 6}},
		{name: "transition-removed-field", spec: map[string]any{"class": nil}},
		{name: "transition-changed-field", spec: map[string]any{"class": "silver"}},
		{name: "unknown-field-pruned", spec: map[string]any{"bogus": true}},
		{name: "remove-defaulted", spec: map[string]any{"color": nil, "settings": nil}},
		{name: "status-ignored", top: map[string]any{"status": map[string]any{"phase": "Ready"}}},
		{name: "bad-label", meta: map[string]any{"labels": map[string]any{"bad key": "v"}}},
		{name: "cel-rule-and-transition", spec: map[string]any{"minReplicas": 9, "immutableID": "id-3"}},
	}
	verbs := []string{"put", "merge", "json", "apply"}
	var out []diffCase
	for _, m := range mods {
		for _, verb := range verbs {
			m, verb := m, verb
			out = append(out, diffCase{name: "cr-update-" + m.name + "-" + verb, run: func(c *tc) any {
				path := sprocketsV1 + "/s"
				var created resp
				if verb == "apply" {
					created = c.reqCT(http.MethodPatch, path+"?fieldManager=difftest", "application/apply-patch+yaml", sprocket("v1", "s", baseSpec()))
				} else {
					created = c.post(sprocketsV1, sprocket("v1", "s", baseSpec()))
				}
				c.must(created)
				var r resp
				switch verb {
				case "put":
					obj := c.must(c.get(path)).Obj
					applyMod(obj, m.spec, m.meta, m.top)
					r = c.put(path, obj)
				case "merge":
					p := map[string]any{}
					if m.spec != nil {
						p["spec"] = m.spec
					}
					if m.meta != nil {
						p["metadata"] = m.meta
					}
					for k, v := range m.top {
						p[k] = v
					}
					r = c.patch(path, "application/merge-patch+json", p)
				case "json":
					ops := []any{map[string]any{"op": "test", "path": "/metadata/name", "value": "s"}}
					for k, v := range m.spec {
						if v == nil {
							ops = append(ops, map[string]any{"op": "remove", "path": "/spec/" + k})
						} else {
							ops = append(ops, map[string]any{"op": "add", "path": "/spec/" + k, "value": v})
						}
					}
					for k, v := range m.meta {
						ops = append(ops, map[string]any{"op": "add", "path": "/metadata/" + k, "value": v})
					}
					for k, v := range m.top {
						ops = append(ops, map[string]any{"op": "add", "path": "/" + k, "value": v})
					}
					r = c.patch(path, "application/json-patch+json", ops)
				case "apply":
					obj := sprocket("v1", "s", baseSpec())
					applyMod(obj, m.spec, m.meta, m.top)
					r = c.reqCT(http.MethodPatch, path+"?fieldManager=difftest", "application/apply-patch+yaml", obj)
				}
				return []any{crSummary(r), crSummary(c.get(path))}
			}})
		}
	}
	return out
}

func applyMod(obj, spec, meta, top map[string]any) {
	s, _ := obj["spec"].(map[string]any)
	for k, v := range spec {
		if v == nil {
			delete(s, k)
		} else {
			s[k] = v
		}
	}
	md := obj["metadata"].(map[string]any)
	for k, v := range meta {
		md[k] = v
	}
	for k, v := range top {
		obj[k] = v
	}
}

// statusCases cover the status subresource, generation and the kind
// without a status subresource.
func schemaStatusCases() []diffCase {
	path := sprocketsV1 + "/s"
	setup := func(c *tc) map[string]any {
		c.must(c.post(sprocketsV1, sprocket("v1", "s", baseSpec())))
		return c.must(c.get(path)).Obj
	}
	gizmo := func(c *tc, spec map[string]any) map[string]any {
		return map[string]any{"apiVersion": testGroup + "/v1", "kind": "Gizmo", "metadata": map[string]any{"name": c.ns + "-g"}, "spec": spec}
	}
	cases := []diffCase{
		{name: "cr-status-put-valid", run: func(c *tc) any {
			obj := setup(c)
			obj["status"] = map[string]any{"phase": "Ready", "observed": 1}
			obj["spec"].(map[string]any)["size"] = 9
			return []any{crSummary(c.put(path+"/status", obj)), crSummary(c.get(path))}
		}},
		{name: "cr-status-put-invalid-enum", run: func(c *tc) any {
			obj := setup(c)
			obj["status"] = map[string]any{"phase": "Bogus"}
			return []any{crSummary(c.put(path+"/status", obj)), crSummary(c.get(path))}
		}},
		{name: "cr-status-put-invalid-minimum", run: func(c *tc) any {
			obj := setup(c)
			obj["status"] = map[string]any{"observed": -1, "message": "0123456789abc"}
			return crSummary(c.put(path+"/status", obj))
		}},
		{name: "cr-status-cel-rule", run: func(c *tc) any {
			setup(c)
			return crSummary(c.patch(path+"/status", "application/merge-patch+json", map[string]any{"status": map[string]any{"observed": 150}}))
		}},
		{name: "cr-status-ignores-invalid-spec", run: func(c *tc) any {
			setup(c)
			r := c.patch(path+"/status", "application/merge-patch+json", map[string]any{"spec": map[string]any{"size": 0}, "status": map[string]any{"phase": "Ready"}})
			return []any{crSummary(r), crSummary(c.get(path))}
		}},
		{name: "cr-status-ignores-metadata", run: func(c *tc) any {
			setup(c)
			r := c.patch(path+"/status", "application/merge-patch+json", map[string]any{"metadata": map[string]any{"labels": map[string]any{"a": "b"}}, "status": map[string]any{"phase": "Ready"}})
			return []any{crSummary(r), crSummary(c.get(path))}
		}},
		{name: "cr-status-json-patch", run: func(c *tc) any {
			setup(c)
			r := c.patch(path+"/status", "application/json-patch+json", []any{map[string]any{"op": "add", "path": "/status", "value": map[string]any{"phase": "Failed", "bogus": 1}}})
			return []any{crSummary(r), crSummary(c.get(path))}
		}},
		{name: "cr-status-apply", run: func(c *tc) any {
			setup(c)
			r := c.reqCT(http.MethodPatch, path+"/status?fieldManager=st&force=true", "application/apply-patch+yaml",
				map[string]any{"apiVersion": testGroup + "/v1", "kind": "Sprocket", "metadata": map[string]any{"name": "s"}, "status": map[string]any{"phase": "Pending"}})
			return []any{crSummary(r), crSummary(c.get(path))}
		}},
		{name: "cr-status-remove", run: func(c *tc) any {
			setup(c)
			c.must(c.patch(path+"/status", "application/merge-patch+json", map[string]any{"status": map[string]any{"phase": "Ready"}}))
			obj := c.must(c.get(path)).Obj
			delete(obj, "status")
			return []any{crSummary(c.put(path+"/status", obj)), crSummary(c.get(path))}
		}},
		{name: "cr-generation-spec-then-status", run: func(c *tc) any {
			setup(c)
			a := c.patch(path, "application/merge-patch+json", map[string]any{"spec": map[string]any{"size": 5}})
			b := c.patch(path+"/status", "application/merge-patch+json", map[string]any{"status": map[string]any{"phase": "Ready"}})
			d := c.patch(path, "application/merge-patch+json", map[string]any{"metadata": map[string]any{"annotations": map[string]any{"x": "y"}}})
			return []any{pick(a, "metadata.generation"), pick(b, "metadata.generation"), pick(d, "metadata.generation")}
		}},
		{name: "cr-generation-default-only-change", run: func(c *tc) any {
			setup(c)
			// Sending the defaulted value explicitly changes nothing.
			return pick(c.patch(path, "application/merge-patch+json", map[string]any{"spec": map[string]any{"color": "red"}}), "metadata.generation", "spec")
		}},
		{name: "cr-generation-pruned-only-change", run: func(c *tc) any {
			setup(c)
			return pick(c.patch(path, "application/merge-patch+json", map[string]any{"spec": map[string]any{"nope": 1}}), "metadata.generation", "spec")
		}},
		{name: "cr-no-status-subresource-generation", run: func(c *tc) any {
			c.must(c.post(gizmosV1, gizmo(c, map[string]any{"size": 1})))
			p := gizmosV1 + "/" + c.ns + "-g"
			a := c.patch(p, "application/merge-patch+json", map[string]any{"status": map[string]any{"count": 2}})
			b := c.patch(p, "application/merge-patch+json", map[string]any{"other": "x"})
			return []any{crSummary(a), crSummary(b), crSummary(c.get(p))}
		}},
		{name: "cr-no-status-subresource-invalid-status", run: func(c *tc) any {
			c.must(c.post(gizmosV1, gizmo(c, map[string]any{"size": 1})))
			p := gizmosV1 + "/" + c.ns + "-g"
			return []any{crSummary(c.patch(p, "application/merge-patch+json", map[string]any{"status": map[string]any{"count": -2}})),
				crSummary(c.put(p+"/status", map[string]any{})), crSummary(c.del(p, nil))}
		}},
		{name: "cr-gizmo-create-status-kept", run: func(c *tc) any {
			o := gizmo(c, map[string]any{"size": 1, "strict": map[string]any{"x": "a", "y": "pruned"}})
			o["status"] = map[string]any{"count": 1}
			o["free"] = map[string]any{"kept": true}
			r := c.post(gizmosV1, o)
			return []any{crSummary(r), crSummary(c.del(gizmosV1+"/"+c.ns+"-g", nil))}
		}},
		{name: "cr-gizmo-invalid", run: func(c *tc) any {
			return crSummary(c.post(gizmosV1, gizmo(c, map[string]any{"size": 0, "mode": "c"})))
		}},
		{name: "cr-gizmo-defaults", run: func(c *tc) any {
			r := c.post(gizmosV1, gizmo(c, map[string]any{}))
			return []any{crSummary(r), crSummary(c.del(gizmosV1+"/"+c.ns+"-g", nil))}
		}},
		{name: "cr-strict-unknown-create", run: func(c *tc) any {
			o := sprocket("v1", "s", withSpec(map[string]any{"bogus": 1, "settings": map[string]any{"zz": 1}}))
			o["top"] = 1
			return crSummary(c.post(sprocketsV1+"?fieldValidation=Strict", o))
		}},
		{name: "cr-strict-unknown-update", run: func(c *tc) any {
			obj := setup(c)
			obj["spec"].(map[string]any)["bogus"] = 1
			return []any{crSummary(c.put(path+"?fieldValidation=Strict", obj)), crSummary(c.put(path+"?fieldValidation=Ignore", obj))}
		}},
		{name: "cr-strict-known-create", run: func(c *tc) any {
			return crSummary(c.post(sprocketsV1+"?fieldValidation=Strict", sprocket("v1", "s", baseSpec())))
		}},
		{name: "cr-multiversion-update-via-other-version", run: func(c *tc) any {
			setup(c)
			obj := c.must(c.get(sprocketsV1beta1 + "/s")).Obj
			obj["spec"].(map[string]any)["legacy"] = "kept?"
			obj["spec"].(map[string]any)["size"] = 2
			r := c.put(sprocketsV1beta1+"/s", obj)
			return []any{crSummary(r), crSummary(c.get(path)), crSummary(c.get(sprocketsV1beta1 + "/s"))}
		}},
		{name: "cr-multiversion-list", run: func(c *tc) any {
			c.must(c.post(sprocketsV1beta1, sprocket("v1beta1", "a", map[string]any{"size": 1})))
			c.must(c.post(sprocketsV1, sprocket("v1", "b", map[string]any{"size": 1})))
			var out []any
			for _, p := range []string{sprocketsV1, sprocketsV1beta1} {
				r := c.must(c.get(p))
				items, _ := r.Obj["items"].([]any)
				for _, it := range items {
					out = append(out, norm(it))
				}
			}
			return out
		}},
		{name: "cr-multiversion-transition-across-versions", run: func(c *tc) any {
			setup(c)
			return crSummary(c.patch(sprocketsV1beta1+"/s", "application/merge-patch+json", map[string]any{"spec": map[string]any{"immutableID": "other"}}))
		}},
		{name: "cr-watch-shows-defaults", run: func(c *tc) any {
			c.must(c.post(sprocketsV1, sprocket("v1", "s", map[string]any{"size": 1})))
			r := c.must(c.get(sprocketsV1 + "?labelSelector="))
			items, _ := r.Obj["items"].([]any)
			return norm(items)
		}},
	}
	return cases
}

// projectCRDCases run the same checks on the project's own CRDs.
func projectCRDCases() []diffCase {
	const machines = "/apis/infrastructure.cluster.x-k8s.io/v1beta1/namespaces/{ns}/nstancemachines"
	const templates = "/apis/infrastructure.cluster.x-k8s.io/v1beta1/namespaces/{ns}/nstancemachinetemplates"
	machine := func(spec map[string]any) map[string]any {
		return map[string]any{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "NstanceMachine",
			"metadata": map[string]any{"name": "m"}, "spec": spec}
	}
	template := func(spec map[string]any) map[string]any {
		return map[string]any{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "NstanceMachineTemplate",
			"metadata": map[string]any{"name": "t"}, "spec": map[string]any{"template": map[string]any{"spec": spec}}}
	}
	cases := []diffCase{
		{name: "project-machine-valid", run: func(c *tc) any {
			return []any{crSummary(c.post(machines, machine(map[string]any{"group": "workers", "shard": "dev-1", "bogus": 1}))), crSummary(c.get(machines + "/m"))}
		}},
		{name: "project-machine-missing-group", run: func(c *tc) any { return crSummary(c.post(machines, machine(map[string]any{"shard": "dev-1"}))) }},
		{name: "project-machine-bad-group", run: func(c *tc) any { return crSummary(c.post(machines, machine(map[string]any{"group": "Bad_Group"}))) }},
		{name: "project-machine-bad-shard", run: func(c *tc) any {
			return crSummary(c.post(machines, machine(map[string]any{"group": "g", "shard": "-x-", "instanceID": ""})))
		}},
		{name: "project-machine-long-group", run: func(c *tc) any {
			return crSummary(c.post(machines, machine(map[string]any{"group": strings.Repeat("a", 64)})))
		}},
	}
	for _, field := range []string{"shard", "instanceID"} {
		for _, verb := range []string{"merge", "put", "json"} {
			for _, change := range []string{"change", "remove", "set"} {
				field, verb, change := field, verb, change
				cases = append(cases, diffCase{name: fmt.Sprintf("project-machine-%s-%s-%s", field, change, verb), run: func(c *tc) any {
					spec := map[string]any{"group": "g"}
					if change != "set" {
						spec[field] = "dev-1"
					}
					c.must(c.post(machines, machine(spec)))
					var val any = "dev-2"
					if change == "remove" {
						val = nil
					}
					var r resp
					switch verb {
					case "merge":
						r = c.patch(machines+"/m", "application/merge-patch+json", map[string]any{"spec": map[string]any{field: val}})
					case "json":
						op := map[string]any{"op": "add", "path": "/spec/" + field, "value": val}
						if val == nil {
							op = map[string]any{"op": "remove", "path": "/spec/" + field}
						}
						r = c.patch(machines+"/m", "application/json-patch+json", []any{op})
					case "put":
						obj := c.must(c.get(machines + "/m")).Obj
						if val == nil {
							delete(obj["spec"].(map[string]any), field)
						} else {
							obj["spec"].(map[string]any)[field] = val
						}
						r = c.put(machines+"/m", obj)
					}
					return []any{crSummary(r), crSummary(c.get(machines + "/m"))}
				}})
			}
		}
	}
	cases = append(cases,
		diffCase{name: "project-template-names-instance", run: func(c *tc) any {
			return crSummary(c.post(templates, template(map[string]any{"group": "g", "instanceID": "i-1"})))
		}},
		diffCase{name: "project-template-immutable", run: func(c *tc) any {
			c.must(c.post(templates, template(map[string]any{"group": "g"})))
			r := c.patch(templates+"/t", "application/merge-patch+json", map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"group": "h"}}}})
			return []any{crSummary(r), crSummary(c.get(templates + "/t"))}
		}},
		diffCase{name: "project-template-label-change-allowed", run: func(c *tc) any {
			c.must(c.post(templates, template(map[string]any{"group": "g"})))
			return crSummary(c.patch(templates+"/t", "application/merge-patch+json", map[string]any{"metadata": map[string]any{"labels": map[string]any{"a": "b"}}}))
		}},
	)
	return cases
}

func TestCustomResourceSchemas(t *testing.T) {
	var cases []diffCase
	cases = append(cases, schemaCreateCases()...)
	cases = append(cases, schemaUpdateCases()...)
	cases = append(cases, schemaStatusCases()...)
	cases = append(cases, projectCRDCases()...)
	cases = append(cases, readDefaultCase())
	cases = append(cases, strictPatchCases()...)
	runTable(t, cases)
}

// crSummary is summary with the causes of an Invalid error (and the list
// in its message) sorted: kube-apiserver reports OpenAPI schema errors in
// map order, which varies from one call to the next on either server.
func crSummary(r resp) any {
	out := summary(r)
	m, ok := out.(map[string]any)
	if !ok || r.Obj["kind"] != "Status" {
		return out
	}
	if d, ok := m["details"].(map[string]any); ok {
		if causes, ok := d["causes"].([]any); ok {
			sort.Slice(causes, func(i, j int) bool { return fmt.Sprint(causes[i]) < fmt.Sprint(causes[j]) })
		}
	}
	if msg, ok := m["status.message"].(string); ok {
		if i, j := strings.Index(msg, ": ["), strings.LastIndex(msg, "]"); i > 0 && j > i {
			parts := strings.Split(msg[i+3:j], ", ")
			sort.Strings(parts)
			m["status.message"] = msg[:i+3] + strings.Join(parts, ", ") + msg[j:]
		}
	}
	return m
}

// readDefaultCase changes a CRD's schema under a stored object: the next
// reads show the new default and prune the field the schema dropped,
// without a write (kube-apiserver defaults and prunes what it reads from
// etcd).
func readDefaultCase() diffCase {
	return diffCase{name: "cr-read-defaults-and-pruning-after-crd-change", run: func(c *tc) any {
		plural := "rd" + strings.ReplaceAll(c.ns, "-", "")
		crdPath := "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + plural + "." + testGroup
		schema := func(withDefault bool) map[string]any {
			props := map[string]any{"a": map[string]any{"type": "string"}, "b": map[string]any{"type": "string"}}
			if withDefault {
				props["b"] = map[string]any{"type": "string", "default": "dflt"}
				props["c"] = map[string]any{"type": "integer", "default": 7}
			} else {
				props["gone"] = map[string]any{"type": "string"}
			}
			return map[string]any{"type": "object", "properties": map[string]any{"spec": map[string]any{"type": "object", "properties": props}}}
		}
		crd := map[string]any{
			"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
			"metadata": map[string]any{"name": plural + "." + testGroup},
			"spec": map[string]any{"group": testGroup, "scope": "Namespaced",
				"names":    map[string]any{"plural": plural, "kind": "Rd", "listKind": "RdList", "singular": plural},
				"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true, "schema": map[string]any{"openAPIV3Schema": schema(false)}}}},
		}
		c.must(c.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd))
		defer c.del(crdPath, nil)
		objs := "/apis/" + testGroup + "/v1/namespaces/{ns}/" + plural
		c.eventually(func() bool { return c.get(objs).Code == http.StatusOK })
		created := c.post(objs, map[string]any{"apiVersion": testGroup + "/v1", "kind": "Rd", "metadata": map[string]any{"name": "r"},
			"spec": map[string]any{"a": "x", "gone": "soon"}})
		cur := c.must(c.get(crdPath)).Obj
		cur["spec"].(map[string]any)["versions"].([]any)[0].(map[string]any)["schema"] = map[string]any{"openAPIV3Schema": schema(true)}
		c.must(c.put(crdPath, cur))
		var got resp
		c.eventually(func() bool {
			got = c.get(objs + "/r")
			spec, _ := got.Obj["spec"].(map[string]any)
			return spec["b"] == "dflt" && spec["gone"] == nil
		})
		return []any{crSummary(created), crSummary(got)}
	}}
}

// strictPatchCases send patches with unknown fields and
// fieldValidation=Strict. The error's message quotes the whole patched
// object (uid, timestamps), so code, reason, cause fields and the strict
// decoding error are compared.
func strictPatchCases() []diffCase {
	var out []diffCase
	for _, pt := range []struct{ name, ct, body string }{
		{"merge", "application/merge-patch+json", `{"spec":{"bogus":1,"settings":{"zz":true}}}`},
		{"json", "application/json-patch+json", `[{"op":"add","path":"/spec/bogus","value":1}]`},
		{"merge-known", "application/merge-patch+json", `{"spec":{"size":4}}`},
	} {
		pt := pt
		out = append(out, diffCase{name: "cr-strict-patch-" + pt.name, run: func(c *tc) any {
			c.must(c.post(sprocketsV1, sprocket("v1", "s", baseSpec())))
			r := c.patch(sprocketsV1+"/s?fieldValidation=Strict", pt.ct, pt.body)
			view := map[string]any{"code": r.Code, "reason": r.Obj["reason"]}
			if d, ok := r.Obj["details"].(map[string]any); ok {
				var causes []any
				cs, _ := d["causes"].([]any)
				for _, cause := range cs {
					m, _ := cause.(map[string]any)
					msg, _ := m["message"].(string)
					causes = append(causes, []any{m["field"], m["reason"], msg[strings.LastIndex(msg, "strict decoding error"):]})
				}
				view["causes"] = causes
			}
			if r.Code == http.StatusOK {
				view["spec"] = norm(r.Obj["spec"])
			}
			return []any{view, crSummary(c.get(sprocketsV1 + "/s"))}
		}})
	}
	return out
}
