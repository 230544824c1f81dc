package config

import (
	"bytes"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"sort"
	"strings"
	"text/template"

	"github.com/nstance-dev/nstance/internal/pki"
)

// TemplateData is what templated file contents, userdata and certificate
// fields may refer to, e.g. {{ .Instance.Hostname }} or {{ .Vars.role }}.
// Vars are merged with defaults < template < group (< request, for
// on-demand instances).
type TemplateData struct {
	InstanceID   string
	Tenant       string
	Cluster      string
	Shard        string
	Group        string
	Template     string
	InstanceType string
	Vars         map[string]string
	Args         map[string]string
	// Image is the instance's image: its "image" arg (GroupSpec.image, or
	// the id its template's image_name resolved to when it was created).
	Image string
	// Instance describes the instance itself.
	Instance InstanceData
}

// InstanceData is the .Instance of TemplateData.
type InstanceData struct {
	// ID is the instance id.
	ID string
	// Hostname is the instance's host name and Kubernetes node name: its id.
	Hostname string
	// FQDN is Hostname under shard.instance_domain when that is set, else
	// Hostname.
	FQDN string
	// IP4 and IP6 are the instance's first provider-reported IPv4 and IPv6
	// addresses; empty until the provider reported one (they are never
	// known to userdata, which is rendered before the instance exists).
	IP4, IP6 string
	// Type is the provider instance type.
	Type string
}

// NewInstanceData fills InstanceData from an instance's id, type and
// provider-reported addresses; domain is shard.instance_domain.
func NewInstanceData(id, instanceType, domain string, addresses []string) InstanceData {
	d := InstanceData{ID: id, Hostname: id, FQDN: id, Type: instanceType}
	if domain != "" {
		d.FQDN = id + "." + strings.TrimSuffix(domain, ".")
	}
	for _, a := range addresses {
		ip := net.ParseIP(a)
		switch {
		case ip == nil:
		case ip.To4() != nil:
			if d.IP4 == "" {
				d.IP4 = ip.String()
			}
		case d.IP6 == "":
			d.IP6 = ip.String()
		}
	}
	return d
}

// Render executes text as a Go template over data (a missing key is an
// error); text without "{{" is returned unchanged. key names the field in
// errors.
func Render(key, text string, data TemplateData) (string, error) {
	if !strings.Contains(text, "{{") {
		return text, nil
	}
	t, err := template.New(key).Option("missingkey=error").Parse(text)
	if err != nil {
		return "", fmt.Errorf("%s: %w", key, err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		return "", fmt.Errorf("%s: %w", key, err)
	}
	return b.String(), nil
}

// loopbackHosts are in every server certificate.
var loopbackHosts = []string{"127.0.0.1", "::1", "localhost"}

// ServerHosts are the names and addresses of this shard's servers that the
// config knows: loopback, shard.advertise.hosts, the hosts of the
// shard.advertise addresses and the specific (not wildcard) hosts of the
// shard.bind addresses. The server adds them to its certificate (with the
// --advertise-host flags and its host name), and no template certificate may
// carry any of them.
func (c *Config) ServerHosts() []string {
	hosts := append([]string{}, loopbackHosts...)
	hosts = append(hosts, c.Shard.Advertise.Hosts...)
	a, b := c.Shard.Advertise, c.Shard.Bind
	for _, addr := range []string{a.RegistrationAddr, a.AgentAddr, a.OperatorAddr,
		b.HealthAddr, b.ElectionAddr, b.RegistrationAddr, b.OperatorAddr, b.AgentAddr} {
		h, _, err := net.SplitHostPort(addr)
		if err != nil || h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil && ip.IsUnspecified() {
			continue
		}
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	return slices.Compact(hosts)
}

// WorkloadPolicy is what template certificates are checked against: no URI
// in the cluster's trust domain and none of ServerHosts plus extraHosts.
func (c *Config) WorkloadPolicy(extraHosts ...string) pki.WorkloadPolicy {
	hosts := append(c.ServerHosts(), extraHosts...)
	sort.Strings(hosts)
	return pki.WorkloadPolicy{TrustDomain: c.Cluster.ID, ServerHosts: slices.Compact(hosts)}
}

// RenderedCertificate holds the names of a template certificate after rendering.
type RenderedCertificate struct {
	CommonName  string
	DNSNames    []string
	IPAddresses []string
	URIs        []string
}

// RenderCertificate renders the name fields of a template certificate.
// key prefixes the field names in errors (e.g. "keys.tls.certificate").
func RenderCertificate(key string, c *TemplateCertificate, data TemplateData) (RenderedCertificate, error) {
	var rc RenderedCertificate
	var err error
	if rc.CommonName, err = Render(key+".common_name", c.CommonName, data); err != nil {
		return rc, err
	}
	err = renderLists(key, data, []renderedList{{"dns_names", c.DNSNames, &rc.DNSNames},
		{"ip_addresses", c.IPAddresses, &rc.IPAddresses}, {"uris", c.URIs, &rc.URIs}})
	return rc, err
}

// renderedList is one list field of a template certificate and where its
// rendered values go.
type renderedList struct {
	name string
	in   []string
	out  *[]string
}

// renderLists renders every value of each list, naming a failing one as
// key.name[i].
func renderLists(key string, data TemplateData, lists []renderedList) error {
	for _, f := range lists {
		for i, v := range f.in {
			r, err := Render(fmt.Sprintf("%s.%s[%d]", key, f.name, i), v, data)
			if err != nil {
				return err
			}
			*f.out = append(*f.out, r)
		}
	}
	return nil
}

// nameKind says how a certificate name field is parsed and checked.
type nameKind int

const (
	kindCN nameKind = iota
	kindDNS
	kindIP
	kindURI
)

// checkName checks one certificate name against p.
func checkName(kind nameKind, v string, p pki.WorkloadPolicy) error {
	switch kind {
	case kindCN, kindDNS:
		return p.CheckDNS(v)
	case kindIP:
		ip := net.ParseIP(v)
		if ip == nil {
			return fmt.Errorf("not an IP address")
		}
		return p.CheckIP(ip)
	default:
		u, err := url.Parse(v)
		if err != nil || u.Scheme == "" {
			return fmt.Errorf("not an absolute URI")
		}
		return p.CheckURI(u)
	}
}

// fields lists the name fields of a certificate with their values.
func (rc RenderedCertificate) fields() []struct {
	name string
	kind nameKind
	vals []string
} {
	var cn []string
	if rc.CommonName != "" {
		cn = []string{rc.CommonName}
	}
	return []struct {
		name string
		kind nameKind
		vals []string
	}{{"common_name", kindCN, cn}, {"dns_names", kindDNS, rc.DNSNames}, {"ip_addresses", kindIP, rc.IPAddresses}, {"uris", kindURI, rc.URIs}}
}

// CheckNames checks rendered certificate names against p and returns one
// reason per refused or unusable name; each reason names its field (under
// key) and the value it rendered to.
func (rc RenderedCertificate) CheckNames(key string, p pki.WorkloadPolicy) []string {
	var out []string
	for _, f := range rc.fields() {
		for i, v := range f.vals {
			if err := checkName(f.kind, v, p); err != nil {
				field := f.name
				if f.kind != kindCN {
					field = fmt.Sprintf("%s[%d]", f.name, i)
				}
				out = append(out, fmt.Sprintf("%s.%s is %q: %v", key, field, v, err))
			}
		}
	}
	return out
}

// EffectiveData is the template data of an instance of tmplName in group
// (tenant/group may be empty) with the given effective vars and args, for
// checks made before any instance exists: the instance id is a placeholder
// of the real form {group}-{8 hex}.
func EffectiveData(shard, tenant, group, tmplName, instanceType string, vars, args map[string]string) TemplateData {
	id := "instance-00000000"
	if group != "" {
		id = group + "-00000000"
	}
	return TemplateData{
		InstanceID: id, Tenant: tenant, Shard: shard, Group: group, Template: tmplName, InstanceType: instanceType,
		Vars: maps.Clone(vars), Args: maps.Clone(args), Image: args["image"], Instance: NewInstanceData(id, instanceType, "", nil),
	}
}

// CheckTemplateCertificates renders the certificate names of every key of
// template tmplName with data and checks them against p. It returns one
// reason per refused name; names that cannot be rendered yet (they depend on
// something only an instance has) are left to the check at signing.
func (c *Config) CheckTemplateCertificates(tmplName string, data TemplateData, p pki.WorkloadPolicy) []string {
	t, ok := c.Templates[tmplName]
	if !ok {
		return nil
	}
	var out []string
	for _, kname := range sortedNames(t.Keys) {
		cert := t.Keys[kname].Certificate
		if cert == nil {
			continue
		}
		key := "templates." + tmplName + ".keys." + kname + ".certificate"
		rc, err := RenderCertificate(key, cert, data)
		if err != nil {
			continue
		}
		out = append(out, rc.CheckNames(key, p)...)
	}
	return out
}

// TemplateNames returns the names of the templates, sorted.
func (c *Config) TemplateNames() []string { return sortedNames(c.Templates) }

// TemplateArgs returns the args an instance of template name starts from,
// before its group's: defaults.args overlaid with the template's own, in a
// map of its own.
func (c *Config) TemplateArgs(name string) map[string]string {
	args := map[string]string{}
	maps.Copy(args, c.Defaults.Args)
	maps.Copy(args, c.Templates[name].Args)
	return args
}

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkWorkloadNames refuses template certificates that would carry a
// control-plane URI or a server name, both as written (literal values) and
// as rendered with the vars of each static group using the template.
func (c *Config) checkWorkloadNames(ch *checker) {
	p := c.WorkloadPolicy()
	for _, tname := range sortedNames(c.Templates) {
		t := c.Templates[tname]
		for _, kname := range sortedNames(t.Keys) {
			cert := t.Keys[kname].Certificate
			if cert == nil {
				continue
			}
			key := "templates." + tname + ".keys." + kname + ".certificate"
			// Literal names are checked as written; templated ones per group below.
			for _, f := range (RenderedCertificate{CommonName: cert.CommonName, DNSNames: cert.DNSNames, IPAddresses: cert.IPAddresses, URIs: cert.URIs}).fields() {
				for i, v := range f.vals {
					if strings.Contains(v, "{{") || f.kind == kindIP {
						continue // IP syntax is checked by checkTemplate
					}
					if err := checkName(f.kind, v, p); err != nil {
						field := key + "." + f.name
						if f.kind != kindCN {
							field = fmt.Sprintf("%s[%d]", field, i)
						}
						ch.add(field, "%q: %v", v, err)
					}
				}
			}
			for i, v := range cert.IPAddresses {
				if ip := net.ParseIP(v); ip != nil && !strings.Contains(v, "{{") {
					if err := p.CheckIP(ip); err != nil {
						ch.add(fmt.Sprintf("%s.ip_addresses[%d]", key, i), "%q: %v", v, err)
					}
				}
			}
		}
	}
	for _, tenant := range sortedNames(c.Groups) {
		for _, gname := range sortedNames(c.Groups[tenant]) {
			g := c.Groups[tenant][gname]
			t, ok := c.Templates[g.Template]
			if !ok {
				continue
			}
			vars, args := map[string]string{}, c.TemplateArgs(g.Template)
			maps.Copy(vars, c.Defaults.Vars)
			maps.Copy(vars, t.Vars)
			maps.Copy(vars, g.Vars)
			it := t.InstanceType
			if g.InstanceType != "" {
				it = g.InstanceType
			}
			data := EffectiveData(c.Shard.ID, tenant, gname, g.Template, it, vars, args)
			for _, reason := range c.CheckTemplateCertificates(g.Template, data, p) {
				ch.add("groups."+tenant+"."+gname+".vars", "with this group's vars, %s", reason)
			}
		}
	}
}
