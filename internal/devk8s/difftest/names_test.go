package difftest

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// nameCases send invalid object and namespace names, in URLs and bodies,
// and compare how each server refuses them (and that nothing is created).
func nameCases() []diffCase {
	var cases []diffCase
	add := func(name string, run func(c *tc) any) { cases = append(cases, diffCase{name: name, run: run}) }
	ns := func(name string) map[string]any {
		return map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": name}}
	}
	lease := func(name string) map[string]any {
		return map[string]any{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": map[string]any{"name": name}}
	}
	node := func(name string) map[string]any {
		return map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": name}}
	}
	withGenerateName := func(o map[string]any, prefix string) map[string]any {
		md := o["metadata"].(map[string]any)
		delete(md, "name")
		md["generateName"] = prefix
		return o
	}
	long := strings.Repeat("a", 254)

	// Namespaces in the URL that are not path segments or not labels.
	for _, bad := range []struct{ label, seg string }{
		{"dotdot", ".."}, {"dot", "."}, {"encoded-dotdot", "%2E%2E"}, {"encoded-slash", "a%2Fb"},
		{"percent", "a%25b"}, {"upper", "Bad"}, {"dots", "a.b"}, {"too-long", strings.Repeat("n", 64)},
	} {
		base := "/api/v1/namespaces/" + bad.seg
		add("names/url-namespace-"+bad.label+"-create", func(c *tc) any {
			return summary(c.post(base+"/configmaps", cm("a", nil, nil)))
		})
		add("names/url-namespace-"+bad.label+"-list", func(c *tc) any { return summary(c.get(base + "/configmaps")) })
		add("names/url-namespace-"+bad.label+"-get", func(c *tc) any { return summary(c.get(base + "/configmaps/a")) })
		add("names/url-namespace-"+bad.label+"-put", func(c *tc) any {
			return summary(c.put("/apis/coordination.k8s.io/v1/namespaces/"+bad.seg+"/leases/a", lease("a")))
		})
		add("names/url-namespace-"+bad.label+"-crd-get", func(c *tc) any {
			return summary(c.get("/apis/" + testGroup + "/v1/namespaces/" + bad.seg + "/widgets/w"))
		})
		add("names/url-namespace-"+bad.label+"-crd-list", func(c *tc) any {
			return summary(c.get("/apis/" + testGroup + "/v1/namespaces/" + bad.seg + "/widgets"))
		})
		add("names/url-namespace-"+bad.label+"-watch", func(c *tc) any {
			return summary(c.get(base + "/configmaps?watch=true&timeoutSeconds=1"))
		})
		add("names/url-namespace-"+bad.label+"-token", func(c *tc) any {
			return summary(c.post(base+"/serviceaccounts/default/token", map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": map[string]any{}}))
		})
		add("names/url-namespace-"+bad.label+"-delete", func(c *tc) any { return summary(c.del(base+"/configmaps/a", nil)) })
		add("names/url-namespace-"+bad.label+"-crd", func(c *tc) any {
			return summary(c.post("/apis/"+testGroup+"/v1/namespaces/"+bad.seg+"/widgets", widget("w", map[string]any{})))
		})
		add("names/url-namespace-"+bad.label+"-itself", func(c *tc) any { return summary(c.get(base)) })
	}

	// Namespace objects with names that are not DNS-1123 labels.
	for _, bad := range []struct{ label, name string }{
		{"dotdot", ".."}, {"dot", "."}, {"slash", "a/b"}, {"percent", "a%b"}, {"upper", "Bad"},
		{"dots", "a.b"}, {"too-long", strings.Repeat("n", 64)}, {"leading-dash", "-a"}, {"empty", ""},
	} {
		add("names/namespace-object-"+bad.label, func(c *tc) any {
			r := c.post("/api/v1/namespaces", ns(bad.name))
			return summary(r)
		})
	}
	add("names/namespace-generate-name-bad", func(c *tc) any {
		return generated(summary(c.post("/api/v1/namespaces", withGenerateName(ns(""), "Bad."))))
	})

	// Object names: DNS-1123 subdomains, and always path segments.
	for _, bad := range []struct{ label, name string }{
		{"dotdot", ".."}, {"dot", "."}, {"slash", "a/b"}, {"percent", "a%b"}, {"upper", "Upper"},
		{"too-long", long}, {"leading-dot", ".a"}, {"underscore", "a_b"},
	} {
		add("names/configmap-"+bad.label, func(c *tc) any { return summary(c.post(cmPath, cm(bad.name, nil, nil))) })
		add("names/widget-"+bad.label, func(c *tc) any {
			return summary(c.post(widgetPath, widget(bad.name, map[string]any{})))
		})
		add("names/node-"+bad.label, func(c *tc) any { return summary(c.post(nodePath, node(bad.name))) })
		add("names/lease-put-"+bad.label, func(c *tc) any {
			seg := strings.ReplaceAll(strings.ReplaceAll(bad.name, "%", "%25"), "/", "%2F")
			return summary(c.put(leasePath+"/"+seg, lease(bad.name)))
		})
	}
	add("names/configmap-subdomain-ok", func(c *tc) any { return summary(c.post(cmPath, cm("a.b-c.d", nil, nil))) })
	add("names/configmap-generate-name-bad", func(c *tc) any {
		return generated(summary(c.post(cmPath, withGenerateName(cm("", nil, nil), "Bad_"))))
	})
	for _, bad := range []struct{ label, name string }{{"dotdot", ".."}, {"slash", "a/b"}, {"upper", "Upper"}, {"percent", "a%b"}} {
		add("names/event-"+bad.label, func(c *tc) any {
			return summary(c.post("/api/v1/namespaces/{ns}/events", map[string]any{"apiVersion": "v1", "kind": "Event",
				"metadata": map[string]any{"name": bad.name}, "involvedObject": map[string]any{"kind": "Pod", "name": "p", "namespace": c.ns},
				"reason": "R", "message": "m", "type": "Normal"}))
		})
	}
	add("names/create-in-missing-namespace-with-bad-name", func(c *tc) any {
		return summary(c.post("/api/v1/namespaces/nope-"+c.ns+"/configmaps", cm("Bad", nil, nil)))
	})
	add("names/labels-validated", func(c *tc) any {
		return summary(c.post(cmPath, cm("a", map[string]any{"bad key!": "v"}, nil)))
	})

	// Names in the URL that are not path segments.
	for _, bad := range []struct{ label, seg string }{
		{"dotdot", ".."}, {"dot", "."}, {"encoded-dotdot", "%2E%2E"}, {"encoded-slash", "a%2Fb"}, {"percent", "a%25b"}, {"upper", "Upper"},
	} {
		add("names/url-name-"+bad.label+"-get", func(c *tc) any { return summary(c.get(cmPath + "/" + bad.seg)) })
		add("names/url-name-"+bad.label+"-delete", func(c *tc) any { return summary(c.del(cmPath+"/"+bad.seg, nil)) })
		add("names/url-name-"+bad.label+"-patch", func(c *tc) any {
			return summary(c.patch(cmPath+"/"+bad.seg, "application/merge-patch+json", `{"data":{"a":"b"}}`))
		})
		add("names/url-name-"+bad.label+"-apply", func(c *tc) any {
			return summary(c.patch(cmPath+"/"+bad.seg+"?fieldManager=t", "application/apply-patch+yaml", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}`))
		})
		add("names/url-name-"+bad.label+"-node", func(c *tc) any { return summary(c.get(nodePath + "/" + bad.seg)) })
		add("names/url-name-"+bad.label+"-token", func(c *tc) any {
			return summary(c.post(saPath+"/"+bad.seg+"/token", map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": map[string]any{}}))
		})
	}
	add("names/field-selector-dotdot", func(c *tc) any {
		c.must(c.post(cmPath, cm("a", nil, nil)))
		return summary(c.get(cmPath + "?fieldSelector=" + q("metadata.name=..")))
	})
	add("names/nothing-created", func(c *tc) any {
		c.post("/api/v1/namespaces/../configmaps", cm("escape", nil, nil))
		c.put("/apis/coordination.k8s.io/v1/namespaces/../leases/escape", lease("escape"))
		c.put(leasePath+"/..", lease(".."))
		return []any{listNames(c.get(cmPath)), c.get("/api/v1/configmaps?fieldSelector=" + q("metadata.name=escape")).Code,
			len(listNames(c.get("/apis/coordination.k8s.io/v1/leases?fieldSelector=" + q("metadata.name=escape"))))}
	})
	return cases
}

// generated hides the random suffix of a generated name in an answer.
func generated(v any) any {
	data, _ := json.Marshal(v)
	return regexp.MustCompile(`(Bad[._])[a-z0-9]{5}`).ReplaceAllString(string(data), "${1}<random>")
}

func TestNames(t *testing.T) { runTable(t, nameCases()) }
