package difftest

import (
	"fmt"
	"sort"
	"testing"
)

func managers(r resp) []string {
	md, _ := r.Obj["metadata"].(map[string]any)
	mf, _ := md["managedFields"].([]any)
	var out []string
	for _, e := range mf {
		m, _ := e.(map[string]any)
		out = append(out, fmt.Sprintf("%v:%v:%v", m["manager"], m["operation"], m["subresource"]))
	}
	sort.Strings(out)
	return out
}

func applyCM(c *tc, manager string, force bool, yaml string) resp {
	p := cmPath + "/ap?fieldManager=" + manager
	if force {
		p += "&force=true"
	}
	return c.patch(p, "application/apply-patch+yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ap\n"+yaml)
}

func applyCases() []diffCase {
	var cases []diffCase
	add := func(name string, run func(c *tc) any) { cases = append(cases, diffCase{name: name, run: run}) }
	add("apply/managed-fields-on-create", func(c *tc) any {
		r := c.must(c.post(cmPath, cm("a", nil, map[string]any{"k": "v"})))
		return managers(r)
	})
	add("apply/managed-fields-after-apply", func(c *tc) any {
		r := applyCM(c, "one", false, "data:\n  k: v\n")
		return []any{summary(r), managers(r)}
	})
	add("apply/removes-own-field", func(c *tc) any {
		c.must(applyCM(c, "one", false, "data:\n  k: v\n  j: x\n"))
		return summary(applyCM(c, "one", false, "data:\n  k: v\n"))
	})
	add("apply/two-managers-merge", func(c *tc) any {
		c.must(applyCM(c, "one", false, "data:\n  k: v\n"))
		r := applyCM(c, "two", false, "data:\n  j: x\n")
		return []any{summary(r), managers(r)}
	})
	add("apply/conflict", func(c *tc) any {
		c.must(applyCM(c, "one", false, "data:\n  k: v\n"))
		return summary(applyCM(c, "two", false, "data:\n  k: w\n"))
	})
	add("apply/force", func(c *tc) any {
		c.must(applyCM(c, "one", false, "data:\n  k: v\n"))
		r := applyCM(c, "two", true, "data:\n  k: w\n")
		return []any{summary(r), managers(r)}
	})
	add("apply/conflict-with-update-manager", func(c *tc) any {
		c.must(c.post(cmPath+"?fieldManager=creator", cm("ap", nil, map[string]any{"k": "v"})))
		return summary(applyCM(c, "one", false, "data:\n  k: changed\n"))
	})
	add("apply/same-value-no-conflict", func(c *tc) any {
		c.must(c.post(cmPath+"?fieldManager=creator", cm("ap", nil, map[string]any{"k": "v"})))
		r := applyCM(c, "one", false, "data:\n  k: v\n")
		return []any{summary(r), managers(r)}
	})
	add("apply/crd", func(c *tc) any {
		y := "apiVersion: " + testGroup + "/v1\nkind: Widget\nmetadata:\n  name: w\nspec:\n  size: 1\n  color: red\n"
		c.must(c.patch(widgetPath+"/w?fieldManager=one", "application/apply-patch+yaml", y))
		y2 := "apiVersion: " + testGroup + "/v1\nkind: Widget\nmetadata:\n  name: w\nspec:\n  size: 2\n"
		r := c.patch(widgetPath+"/w?fieldManager=one", "application/apply-patch+yaml", y2)
		return []any{summary(r), managers(r)}
	})
	add("apply/update-then-managers", func(c *tc) any {
		c.must(applyCM(c, "one", false, "data:\n  k: v\n"))
		r := c.patch(cmPath+"/ap?fieldManager=patcher", "application/merge-patch+json", `{"data":{"p":"1"}}`)
		return []any{summary(r), managers(r)}
	})
	return cases
}

func TestApply(t *testing.T) {
	runTable(t, applyCases())
}
