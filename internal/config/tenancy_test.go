package config

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// tenanted is minimal with two templates and static groups of two tenants.
func tenanted(templates, groups string) string {
	doc := strings.Replace(minimal, `"templates": {"t": {"kind": "worker"}}`, `"templates": {`+templates+`}`, 1)
	return strings.Replace(doc, `"groups": {"default": {"g": {"template": "t", "size": 2}}}`, `"groups": {`+groups+`}`, 1)
}

func TestSingleTenantTemplatesAreOpen(t *testing.T) {
	cfg, err := Parse([]byte(minimal))
	require.NoError(t, err, "one tenant: a template without tenants is valid")
	require.Equal(t, []string{"default"}, cfg.NamedTenants())
	require.True(t, cfg.TemplateAllows("t", "default"))
	require.True(t, cfg.TemplateAllows("t", "other"), "open to every tenant in a single-tenant config")
	require.False(t, cfg.TemplateAllows("nope", "default"), "an unknown template allows nobody")

	cfg, err = Parse([]byte(tenanted(`"t": {"kind": "worker"}`, ``)))
	require.NoError(t, err, "no tenant named at all")
	require.Empty(t, cfg.NamedTenants())
	require.True(t, cfg.TemplateAllows("t", "anyone"))
}

func TestTemplateTenants(t *testing.T) {
	doc := tenanted(`"a": {"kind": "worker", "tenants": ["acme"]}, "b": {"kind": "worker", "tenants": ["globex", "acme"]}`,
		`"acme": {"g": {"template": "a"}}, "globex": {"g": {"template": "b"}}`)
	cfg, err := Parse([]byte(doc))
	require.NoError(t, err)
	require.Equal(t, []string{"acme", "globex"}, cfg.NamedTenants())
	require.True(t, cfg.TemplateAllows("a", "acme"))
	require.False(t, cfg.TemplateAllows("a", "globex"))
	require.True(t, cfg.TemplateAllows("b", "globex"))
	require.False(t, cfg.TemplateAllows("b", "initech"), "a tenant the config does not name may use no listed template")
	require.Empty(t, cfg.CheckTemplateTenant("a", "acme"))
	reason := cfg.CheckTemplateTenant("a", "globex")
	require.Contains(t, reason, `template "a"`)
	require.Contains(t, reason, `tenant "globex"`)
	require.NotContains(t, reason, "acme", "the refusal does not name the template's tenants")
}

func TestTemplateTenantsErrors(t *testing.T) {
	tests := []struct {
		name, templates, groups, key, want string
	}{
		{"two tenants, template without tenants", `"t": {"kind": "worker"}`, `"acme": {"g": {"template": "t"}}, "globex": {"h": {"template": "t"}}`,
			"templates.t.tenants", "required: the config names 2 tenants (acme, globex)"},
		{"a template's list makes a second tenant", `"t": {"kind": "worker"}, "u": {"kind": "worker", "tenants": ["globex"]}`, `"acme": {"g": {"template": "t"}}`,
			"templates.t.tenants", "required"},
		{"empty list", `"t": {"kind": "worker", "tenants": []}`, ``, "templates.t.tenants", "at least one tenant"},
		{"bad tenant", `"t": {"kind": "worker", "tenants": ["a/b"]}`, ``, "templates.t.tenants[0]", "invalid tenant"},
		{"duplicate tenant", `"t": {"kind": "worker", "tenants": ["acme", "acme"]}`, ``, "templates.t.tenants[1]", "listed twice"},
		{"declared tenants: an open template among two", `"t": {"kind": "worker"}`, `"acme": {"g": {"template": "t"}}`,
			"templates.t.tenants", "required: the config names 2 tenants (acme, globex)"},
		{"undeclared template tenant", `"t": {"kind": "worker", "tenants": ["initech"]}`, ``, "templates.t.tenants[0]", `tenant "initech" is not declared`},
		{"undeclared group tenant", `"t": {"kind": "worker", "tenants": ["acme"]}`, `"acme": {"g": {"template": "t"}}, "initech": {}`, "groups.initech", `tenant "initech" is not declared`},
		{"static group of another tenant", `"t": {"kind": "worker", "tenants": ["acme"]}`, `"globex": {"g": {"template": "t"}}`,
			"groups.globex.g.template", `template "t" is not available to tenant "globex"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := tenanted(tt.templates, tt.groups)
			if strings.HasPrefix(tt.name, "declared") || strings.HasPrefix(tt.name, "undeclared") {
				doc = strings.Replace(doc, `"templates": {`, `"tenants": ["acme", "globex"], "templates": {`, 1)
			}
			_, err := Parse([]byte(doc))
			require.Error(t, err)
			var es Errors
			require.ErrorAs(t, err, &es)
			for _, e := range es {
				if e.Key == tt.key && strings.Contains(e.Reason, tt.want) {
					return
				}
			}
			t.Fatalf("no error %s: %q in %v", tt.key, tt.want, err)
		})
	}
}

func TestDeclaredTenants(t *testing.T) {
	doc := strings.Replace(minimal, `"templates": {`, `"tenants": ["default"], "templates": {`, 1)
	cfg, err := Parse([]byte(doc))
	require.NoError(t, err)
	require.True(t, cfg.TemplateAllows("t", "default"))
	require.False(t, cfg.TemplateAllows("t", "other"), "an open template is open to the declared tenants only")
	require.Contains(t, cfg.CheckTemplateTenant("t", "other"), `template "t" is not available to tenant "other"`)

	_, err = Parse([]byte(strings.Replace(minimal, `"templates": {`, `"tenants": [], "templates": {`, 1)))
	require.ErrorContains(t, err, "tenants: must name at least one tenant")
	_, err = Parse([]byte(strings.Replace(minimal, `"templates": {`, `"tenants": ["default", "default"], "templates": {`, 1)))
	require.ErrorContains(t, err, `tenants[1]: tenant "default" is listed twice`)
}
