package config

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"text/template"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
)

// WorkloadCA is the name templates use for the workload CA (also the
// default when a certificate names no CA).
const WorkloadCA = "workload"

// Imported reports whether the certificate is signed by a CA the admin
// imported rather than by the workload CA.
func (c *TemplateCertificate) Imported() bool { return c.CA != "" && c.CA != WorkloadCA }

// DeniedGroupsAll returns certificates.denied_groups with system:masters,
// which is always denied.
func (c *Certificates) DeniedGroupsAll() []string {
	out := append([]string{pki.GroupMasters}, c.DeniedGroups...)
	slices.Sort(out)
	return slices.Compact(out)
}

// RenderedSubject is the subject of a template certificate after rendering.
type RenderedSubject struct {
	CommonName          string
	Organization        []string
	OrganizationalUnits []string
}

// RenderSubject renders the subject fields of a template certificate.
func RenderSubject(key string, c *TemplateCertificate, data TemplateData) (RenderedSubject, error) {
	var rs RenderedSubject
	var err error
	if rs.CommonName, err = Render(key+".common_name", c.CommonName, data); err != nil {
		return rs, err
	}
	err = renderLists(key, data, []renderedList{{"organization", c.Organization, &rs.Organization},
		{"organizational_units", c.OrganizationalUnits, &rs.OrganizationalUnits}})
	return rs, err
}

// CertificateData is the data a certificate's subject and names are
// rendered with. For a certificate of an imported CA the vars are the
// config's own (trusted: defaults < template < static group) plus only the
// tenant vars the certificate lists in tenant_vars; a workload
// certificate sees every var.
func CertificateData(c *TemplateCertificate, data TemplateData, trusted map[string]string) TemplateData {
	if !c.Imported() {
		return data
	}
	vars := maps.Clone(trusted)
	if vars == nil {
		vars = map[string]string{}
	}
	for _, k := range c.TenantVars {
		if v, ok := data.Vars[k]; ok {
			vars[k] = v
		}
	}
	data.Vars = vars
	return data
}

// renderAll renders every subject and name field of c with data into one
// comparable string; ok is false when a field cannot be rendered.
func renderAll(key string, c *TemplateCertificate, data TemplateData) (string, bool) {
	rs, err := RenderSubject(key, c, data)
	if err != nil {
		return "", false
	}
	rc, err := RenderCertificate(key, c, data)
	if err != nil {
		return "", false
	}
	return fmt.Sprintf("%q", []any{rs, rc}), true
}

// CheckTenantVars refuses tenant vars (UpsertGroup, CreateInstance) that
// would change the subject or names of a certificate of an imported CA in
// template tmplName without being listed in its tenant_vars. trusted are
// the config's own vars, data the instance data with the tenant's vars
// merged. It returns one reason per refused var, each naming the var and
// the certificate.
func (c *Config) CheckTenantVars(tmplName string, trusted, tenant map[string]string, data TemplateData) []string {
	t, ok := c.Templates[tmplName]
	if !ok {
		return nil
	}
	var out []string
	for _, kname := range sortedNames(t.Keys) {
		cert := t.Keys[kname].Certificate
		if cert == nil || !cert.Imported() {
			continue
		}
		key := "templates." + tmplName + ".keys." + kname + ".certificate"
		base := data
		base.Vars = maps.Clone(trusted)
		want, _ := renderAll(key, cert, base)
		for _, v := range sortedNames(tenant) {
			if slices.Contains(cert.TenantVars, v) {
				continue
			}
			try := base
			try.Vars = maps.Clone(trusted)
			if try.Vars == nil {
				try.Vars = map[string]string{}
			}
			try.Vars[v] = tenant[v]
			if got, _ := renderAll(key, cert, try); got != want {
				out = append(out, fmt.Sprintf("vars.%s: would change the subject or names of %s, which is signed by CA %q; only the config sets them (list the var in its tenant_vars to allow it)", v, key, cert.CA))
			}
		}
	}
	return out
}

// checkImportedCertificates applies the subject rules of imported-CA
// certificates at config load: organization and organizational units only
// for imported CAs, tenant_vars names, and the rendered subject of each
// template (alone and with each static group's vars) against
// pki.CheckSubject with the placeholder instance's node name.
func (c *Config) checkImportedCertificates(ch *checker) {
	deny := c.Certificates.DeniedGroupsAll()
	for i, g := range c.Certificates.DeniedGroups {
		if g == "" || g != strings.TrimSpace(g) {
			ch.add(fmt.Sprintf("certificates.denied_groups[%d]", i), "must be a group name without surrounding spaces, got %q", g)
		}
	}
	type use struct {
		where string
		data  TemplateData
	}
	uses := map[string][]use{}
	for _, tname := range sortedNames(c.Templates) {
		t := c.Templates[tname]
		vars := mergeVars(c.Defaults.Vars, t.Vars)
		uses[tname] = append(uses[tname], use{"", EffectiveData(c.Shard.ID, "", "", tname, t.InstanceType, vars, nil)})
	}
	for _, tenant := range sortedNames(c.Groups) {
		for _, gname := range sortedNames(c.Groups[tenant]) {
			g := c.Groups[tenant][gname]
			t, ok := c.Templates[g.Template]
			if !ok {
				continue
			}
			vars := mergeVars(c.Defaults.Vars, t.Vars, g.Vars)
			data := EffectiveData(c.Shard.ID, tenant, gname, g.Template, cmpOr(g.InstanceType, t.InstanceType), vars, nil)
			uses[g.Template] = append(uses[g.Template], use{"groups." + tenant + "." + gname + ".vars", data})
		}
	}
	for _, tname := range sortedNames(c.Templates) {
		t := c.Templates[tname]
		for _, kname := range sortedNames(t.Keys) {
			cert := t.Keys[kname].Certificate
			if cert == nil {
				continue
			}
			key := "templates." + tname + ".keys." + kname + ".certificate"
			if cert.CA != "" && cert.CA != WorkloadCA {
				if err := validImportedName(cert.CA); err != nil {
					ch.add(key+".ca", "%v", err)
					continue
				}
			}
			if !cert.Imported() {
				if len(cert.Organization) > 0 {
					ch.add(key+".organization", "only a certificate of an imported CA (ca) sets its organization; a workload certificate's is its tenant")
				}
				if len(cert.OrganizationalUnits) > 0 {
					ch.add(key+".organizational_units", "only a certificate of an imported CA (ca) sets organizational units")
				}
				if len(cert.TenantVars) > 0 {
					ch.add(key+".tenant_vars", "only a certificate of an imported CA restricts vars; a workload certificate sees every var")
				}
				continue
			}
			for i, v := range cert.TenantVars {
				if v == "" || strings.ContainsAny(v, " .{}") {
					ch.add(fmt.Sprintf("%s.tenant_vars[%d]", key, i), "must be a var name, got %q", v)
				}
			}
			// Literal organizations are refused as written, whatever renders.
			for i, o := range cert.Organization {
				if strings.Contains(o, "{{") {
					continue
				}
				if err := pki.CheckSubject("", []string{o}, deny, "x"); err != nil && !strings.Contains(err.Error(), "common name") {
					ch.add(fmt.Sprintf("%s.organization[%d]", key, i), "%v", err)
				}
			}
			for _, u := range uses[tname] {
				rs, err := RenderSubject(key, cert, CertificateData(cert, u.data, u.data.Vars))
				if err != nil {
					continue // left to signing: it may depend on instance data
				}
				if err := pki.CheckSubject(rs.CommonName, rs.Organization, deny, u.data.Instance.Hostname); err != nil {
					where := key
					if u.where != "" {
						where = u.where
					}
					ch.add(where, "%s renders a refused subject: %v", key, err)
				}
			}
		}
	}
}

// validImportedName checks a CA name as importedca does (the package is a
// leaf too, but config stays below it).
func validImportedName(name string) error {
	if err := layout.ValidateID("CA name", name); err != nil {
		return fmt.Errorf("%w (\"workload\" or the name of an imported CA)", err)
	}
	if strings.EqualFold(name, "cluster") {
		return fmt.Errorf("the cluster CA signs only Nstance's own identities, never template certificates")
	}
	return nil
}

func mergeVars(layers ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, l := range layers {
		maps.Copy(out, l)
	}
	return out
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// checkUserdata checks a template's userdata: inline text or an object key,
// not both; the text parses as a Go template and its literal size is within
// the limit (rendered userdata is checked again per instance).
func checkUserdata(ch *checker, key string, t Template, limit int) {
	if t.Userdata != "" && t.UserdataObject != "" {
		ch.add(key+".userdata_object", "set userdata or userdata_object, not both")
	}
	if t.Userdata != "" {
		if _, err := template.New(key + ".userdata").Option("missingkey=error").Parse(t.Userdata); err != nil {
			ch.add(key+".userdata", "not a valid Go template: %v", err)
		}
		if limit > 0 && len(t.Userdata) > limit {
			ch.add(key+".userdata", "%d bytes, more than shard.limits.max_user_data_bytes (%d)", len(t.Userdata), limit)
		}
	}
	if o := t.UserdataObject; o != "" {
		if err := layout.CheckTemplateObject(o); err != nil {
			ch.add(key+".userdata_object", "%v", err)
		}
	}
}

// checkDomain checks shard.instance_domain: DNS labels separated by dots.
func checkDomain(d string) error {
	d = strings.TrimSuffix(d, ".")
	if d == "" || len(d) > 253 {
		return fmt.Errorf("%q is not a DNS domain", d)
	}
	for _, l := range strings.Split(d, ".") {
		if !dnsLabel.MatchString(l) {
			return fmt.Errorf("%q is not a DNS domain (label %q)", d, l)
		}
	}
	return nil
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
