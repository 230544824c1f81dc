package config

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLoadBalancers(t *testing.T) {
	withLB := func(lbs, tmplLB, groupLB string) string {
		doc := strings.Replace(minimal, `"templates": {"t": {"kind": "worker"}}`,
			`"load_balancers": `+lbs+`, "templates": {"t": {"kind": "worker"`+tmplLB+`}}`, 1)
		return strings.Replace(doc, `"size": 2}`, `"size": 2`+groupLB+`}`, 1)
	}
	cfg, err := Parse([]byte(withLB(`{"www": {"provider": "haproxy", "backend": "www", "port": 8080}, "api": {"provider": "aws"}}`,
		`, "load_balancers": ["www"]`, ``)))
	require.NoError(t, err)
	require.Equal(t, []string{"api", "www"}, cfg.LoadBalancerNames())
	require.Equal(t, "haproxy", cfg.LoadBalancers["www"].Provider())
	require.Equal(t, map[string]any{"backend": "www", "port": float64(8080)}, cfg.LoadBalancers["www"].Settings())
	g := cfg.Groups["default"]["g"]
	require.Equal(t, []string{"www"}, cfg.GroupLoadBalancers("t", &g), "a group without its own list takes its template's")
	require.Equal(t, []string{"www"}, cfg.GroupLoadBalancers("t", nil), "a dynamic group takes its template's")

	cfg, err = Parse([]byte(withLB(`{"www": {"provider": "haproxy"}, "api": {"provider": "aws"}}`,
		`, "load_balancers": ["www"]`, `, "load_balancers": []`)))
	require.NoError(t, err)
	g = cfg.Groups["default"]["g"]
	require.Empty(t, cfg.GroupLoadBalancers("t", &g), "a group's empty list opts out")

	for _, c := range []struct{ lbs, tmpl, group, want string }{
		{`{"www": {}}`, ``, ``, `load_balancers.www.provider: required`},
		{`{"www": {"provider": 3}}`, ``, ``, `load_balancers.www.provider: want a string, got float64`},
		{`{"www": {"provider": "Bad Kind"}}`, ``, ``, `load_balancers.www.provider`},
		{`{"bad/name": {"provider": "haproxy"}}`, ``, ``, `load_balancers.bad/name`},
		{`{"www": {"provider": "haproxy"}}`, `, "load_balancers": ["nope"]`, ``, `templates.t.load_balancers[0]: unknown load balancer "nope"`},
		{`{"www": {"provider": "haproxy"}}`, ``, `, "load_balancers": ["www", "www"]`, `groups.default.g.load_balancers[1]: "www" is listed twice`},
		{`{"www": {"provider": "haproxy"}}`, ``, `, "load_balancers": "www"`, `groups.default.g.load_balancers: want array`},
		{`["www"]`, ``, ``, `load_balancers: want object`},
	} {
		_, err := Parse([]byte(withLB(c.lbs, c.tmpl, c.group)))
		require.ErrorContains(t, err, c.want, "%s %s %s", c.lbs, c.tmpl, c.group)
	}
}
