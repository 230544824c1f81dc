package config

import (
	"fmt"
	"sort"
)

// LoadBalancer is one entry of the top-level load_balancers: a provider kind
// ("aws", "haproxy") and that kind's settings, side by side in one object as
// upstream Nstance writes them:
//
//	"load_balancers": {"www": {"provider": "haproxy", "socket": "/run/haproxy/admin.sock", "backend": "www", "port": 8080}}
//
// Only "provider" is read here; the rest belongs to the kind, which decodes
// it strictly (internal/server/loadbalancer.Registry.Check, where unknown keys
// and wrong types are named by their full path).
type LoadBalancer map[string]any

// Provider returns the entry's provider kind ("" when missing or not a string).
func (lb LoadBalancer) Provider() string {
	s, _ := lb["provider"].(string)
	return s
}

// Settings returns the entry's provider-specific keys: every key but
// "provider".
func (lb LoadBalancer) Settings() map[string]any {
	out := make(map[string]any, len(lb))
	for k, v := range lb {
		if k != "provider" {
			out[k] = v
		}
	}
	return out
}

// LoadBalancerNames returns the names of the load_balancers entries, sorted.
func (c *Config) LoadBalancerNames() []string {
	names := make([]string, 0, len(c.LoadBalancers))
	for n := range c.LoadBalancers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// GroupLoadBalancers returns the load balancers the members of a group of
// template tmpl register with: the static group's own list when it sets one
// (an empty list opts out), else the template's. A dynamic group (UpsertGroup)
// has only its template's.
func (c *Config) GroupLoadBalancers(tmpl string, g *Group) []string {
	if g != nil && g.LoadBalancers != nil {
		return g.LoadBalancers
	}
	return c.Templates[tmpl].LoadBalancers
}

// checkLoadBalancers validates the entries' names and provider kinds and
// every template's and static group's references to them.
func (c *Config) checkLoadBalancers(ch *checker) {
	for _, name := range c.LoadBalancerNames() {
		lb := c.LoadBalancers[name]
		key := "load_balancers." + name
		ch.id(key, "load balancer name", name, true)
		switch p := lb["provider"].(type) {
		case nil:
			ch.add(key+".provider", "required")
		case string:
			ch.id(key+".provider", "load balancer provider", p, true)
		default:
			ch.add(key+".provider", "want a string, got %T", p)
		}
	}
	refs := func(key string, names []string) {
		seen := map[string]bool{}
		for i, n := range names {
			k := fmt.Sprintf("%s.load_balancers[%d]", key, i)
			if _, ok := c.LoadBalancers[n]; !ok {
				ch.add(k, "unknown load balancer %q", n)
			}
			if seen[n] {
				ch.add(k, "%q is listed twice", n)
			}
			seen[n] = true
		}
	}
	for name, t := range c.Templates {
		refs("templates."+name, t.LoadBalancers)
	}
	for tenant, groups := range c.Groups {
		for gname, g := range groups {
			refs("groups."+tenant+"."+gname, g.LoadBalancers)
		}
	}
}
