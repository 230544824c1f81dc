package config

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// NamedTenants are the tenants the config names: its tenants declaration,
// the keys of groups (static groups) and every tenant a template's tenants
// list names, sorted. Tenants are otherwise implicit (an operator's tenant
// is the one its nonce names), so a config that names at most one tenant is
// a single-tenant config: its templates without a tenants list are open to
// every tenant (to the declared tenants only, when there is a declaration).
// A config that names more than one must say, on every template, which
// tenants may use it.
func (c *Config) NamedTenants() []string {
	seen := map[string]bool{}
	for _, t := range c.Tenants {
		seen[t] = true
	}
	for t := range c.Groups {
		seen[t] = true
	}
	for _, tmpl := range c.Templates {
		for _, t := range tmpl.Tenants {
			seen[t] = true
		}
	}
	out := make([]string, 0, len(seen))
	for t := range seen {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// TemplateAllows reports whether tenant may use template name: the
// template lists tenant, or lists no tenant at all (open; validation allows
// that only in a config that names at most one tenant) and tenant is
// declared (or nothing is). An unknown template allows nobody.
func (c *Config) TemplateAllows(name, tenant string) bool {
	t, ok := c.Templates[name]
	if !ok {
		return false
	}
	if len(t.Tenants) == 0 {
		return len(c.Tenants) == 0 || slices.Contains(c.Tenants, tenant)
	}
	return slices.Contains(t.Tenants, tenant)
}

// CheckTemplateTenant returns the refusal for tenant using template name
// ("" when it may): it names the template and the tenant, never the tenants
// the template is for (they belong to other tenants).
func (c *Config) CheckTemplateTenant(name, tenant string) string {
	if _, ok := c.Templates[name]; !ok || c.TemplateAllows(name, tenant) {
		return ""
	}
	if len(c.Templates[name].Tenants) == 0 {
		return fmt.Sprintf("template %q is not available to tenant %q: the config's tenants do not name the tenant", name, tenant)
	}
	return fmt.Sprintf("template %q is not available to tenant %q: its tenants list (templates.%s.tenants) does not name the tenant", name, tenant, name)
}

// checkTenancy: every template names valid, distinct tenants; with more
// than one tenant in the config every template says which; a static group
// uses only a template of its tenant.
func (c *Config) checkTenancy(ch *checker) {
	if c.Tenants != nil && len(c.Tenants) == 0 {
		ch.add("tenants", "must name at least one tenant when set")
	}
	declared := map[string]bool{}
	for i, tenant := range c.Tenants {
		ch.id(fmt.Sprintf("tenants[%d]", i), "tenant", tenant, true)
		if declared[tenant] {
			ch.add(fmt.Sprintf("tenants[%d]", i), "tenant %q is listed twice", tenant)
		}
		declared[tenant] = true
	}
	tenants := c.NamedTenants()
	for name, t := range c.Templates {
		key := "templates." + name + ".tenants"
		if t.Tenants != nil && len(t.Tenants) == 0 {
			ch.add(key, "must name at least one tenant when set (leave it out for a single-tenant config)")
		}
		seen := map[string]bool{}
		for i, tenant := range t.Tenants {
			ch.id(fmt.Sprintf("%s[%d]", key, i), "tenant", tenant, true)
			if seen[tenant] {
				ch.add(fmt.Sprintf("%s[%d]", key, i), "tenant %q is listed twice", tenant)
			}
			seen[tenant] = true
			if len(declared) > 0 && !declared[tenant] {
				ch.add(fmt.Sprintf("%s[%d]", key, i), "tenant %q is not declared in tenants", tenant)
			}
		}
		if len(t.Tenants) == 0 && len(tenants) > 1 {
			ch.add(key, "required: the config names %d tenants (%s), so every template must list the tenants that may use it",
				len(tenants), strings.Join(tenants, ", "))
		}
	}
	for tenant, groups := range c.Groups {
		if len(declared) > 0 && !declared[tenant] {
			ch.add("groups."+tenant, "tenant %q is not declared in tenants", tenant)
		}
		for gname, g := range groups {
			if reason := c.CheckTemplateTenant(g.Template, tenant); reason != "" {
				ch.add("groups."+tenant+"."+gname+".template", "%s", reason)
			}
		}
	}
}
