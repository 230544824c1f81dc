package config

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// workloadDoc has a template whose certificate names come from group vars
// and a shard that advertises nstance.example.com and binds 10.0.0.5.
const workloadDoc = `{
  "cluster": {"id": "c1"},
  "shard": {
    "id": "s1",
    "infra": {"provider": "tmux"},
    "bind": {
      "health_addr": "0.0.0.0:8990", "election_addr": "0.0.0.0:8991",
      "registration_addr": "10.0.0.5:8992", "operator_addr": "0.0.0.0:8993", "agent_addr": "0.0.0.0:8994",
    },
    "advertise": {"hosts": ["nstance.example.com"]},
  },
  "templates": {"web": {"kind": "worker",
    "keys": {"tls": {"type": "ed25519", "certificate": {
      "common_name": "{{ .InstanceID }}",
      "dns_names": ["{{ .Vars.dns }}"], "ip_addresses": ["{{ .Vars.ip }}"], "uris": ["{{ .Vars.uri }}"],
      "usages": ["server_auth"],
    }}},
  }},
  "groups": {"acme": {"g": {"template": "web", "vars": {"dns": "web.example.com", "ip": "10.1.0.1", "uri": "spiffe://workloads/web"}}}},
}`

func TestWorkloadNamesAtValidation(t *testing.T) {
	cfg, err := Parse([]byte(workloadDoc))
	require.NoError(t, err)
	require.Equal(t, []string{"10.0.0.5", "127.0.0.1", "::1", "localhost", "nstance.example.com"}, cfg.ServerHosts())

	tests := []struct {
		name    string
		replace [2]string
		wantKey string
		want    string
	}{
		{"operator URI var", [2]string{`"uri": "spiffe://workloads/web"`, `"uri": "spiffe://c1/tenant/acme/operator/op-1"`},
			"groups.acme.g.vars", `templates.web.keys.tls.certificate.uris[0] is "spiffe://c1/tenant/acme/operator/op-1": URI`},
		{"server DNS var", [2]string{`"dns": "web.example.com"`, `"dns": "nstance.example.com"`},
			"groups.acme.g.vars", `dns_names[0] is "nstance.example.com": DNS name "nstance.example.com" is a name of the nstance-server`},
		{"wildcard over server", [2]string{`"dns": "web.example.com"`, `"dns": "*.example.com"`}, "groups.acme.g.vars", "covers"},
		{"server bind IP var", [2]string{`"ip": "10.1.0.1"`, `"ip": "10.0.0.5"`},
			"groups.acme.g.vars", `ip_addresses[0] is "10.0.0.5": IP address 10.0.0.5 is an address of the nstance-server`},
		{"loopback var", [2]string{`"ip": "10.1.0.1"`, `"ip": "127.0.0.1"`}, "groups.acme.g.vars", "address of the nstance-server"},
		{"literal server name", [2]string{`"dns_names": ["{{ .Vars.dns }}"]`, `"dns_names": ["NSTANCE.example.com."]`},
			"templates.web.keys.tls.certificate.dns_names[0]", "name of the nstance-server"},
		{"literal server IP", [2]string{`"ip_addresses": ["{{ .Vars.ip }}"]`, `"ip_addresses": ["10.0.0.5"]`},
			"templates.web.keys.tls.certificate.ip_addresses[0]", "address of the nstance-server"},
		{"literal trust-domain URI", [2]string{`"uris": ["{{ .Vars.uri }}"]`, `"uris": ["spiffe://c1/shard/s1/server/x"]`},
			"templates.web.keys.tls.certificate.uris[0]", "trust domain"},
		{"common name is server", [2]string{`"common_name": "{{ .InstanceID }}"`, `"common_name": "localhost"`},
			"templates.web.keys.tls.certificate.common_name", "name of the nstance-server"},
		{"nonce lifetime", [2]string{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1"}, "certificates": {"nonce_max_lifetime": "10m"}`},
			"certificates.agent_nonce_ttl", "must not be longer than certificates.nonce_max_lifetime (10m0s)"},
		{"negative nonce lifetime", [2]string{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1"}, "certificates": {"nonce_max_lifetime": "-1h"}`},
			"certificates.nonce_max_lifetime", "must be positive"},
		{"nonce lifetime over 30 days", [2]string{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1"}, "certificates": {"nonce_max_lifetime": "721h"}`},
			"certificates.nonce_max_lifetime", "must be at most 720h0m0s"},
		{"negative revocation sync", [2]string{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1"}, "certificates": {"revocation_sync_interval": "-1s"}`},
			"certificates.revocation_sync_interval", "must be positive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc := strings.Replace(workloadDoc, tc.replace[0], tc.replace[1], 1)
			require.NotEqual(t, workloadDoc, doc, "replacement did not apply")
			_, err := Parse([]byte(doc))
			es, ok := AsErrors(err)
			require.True(t, ok, "want field errors, got %v", err)
			var found bool
			for _, e := range es {
				if e.Key == tc.wantKey && strings.Contains(e.Reason, tc.want) {
					found = true
				}
			}
			require.True(t, found, "want %s: %s in %v", tc.wantKey, tc.want, err)
		})
	}
}

func TestWorkloadPolicyAndData(t *testing.T) {
	cfg, err := Parse([]byte(workloadDoc))
	require.NoError(t, err)
	require.Equal(t, DefaultNonceMaxLifetime, cfg.Certificates.NonceMaxLifetime.D())
	require.Equal(t, 24*time.Hour, DefaultNonceMaxLifetime)
	require.Equal(t, DefaultRevocationSyncInterval, cfg.Certificates.RevocationSyncInterval.D())
	p := cfg.WorkloadPolicy("srv-host", "localhost")
	require.Equal(t, "c1", p.TrustDomain)
	require.Contains(t, p.ServerHosts, "srv-host")

	data := EffectiveData("s1", "acme", "g", "web", "", map[string]string{"dns": "srv-host", "ip": "10.1.0.1", "uri": "urn:x"}, nil)
	require.Equal(t, "g-00000000", data.InstanceID)
	reasons := cfg.CheckTemplateCertificates("web", data, p)
	require.Len(t, reasons, 1)
	require.Contains(t, reasons[0], `dns_names[0] is "srv-host"`)
	// Names that need data only an instance has are left to the signer.
	require.Empty(t, cfg.CheckTemplateCertificates("web", EffectiveData("s1", "acme", "g", "web", "", nil, nil), p))
	require.Empty(t, cfg.CheckTemplateCertificates("nope", data, p))

	out, err := Render("k", "{{ .Vars.a }}-{{ .Shard }}", TemplateData{Shard: "s1", Vars: map[string]string{"a": "x"}})
	require.NoError(t, err)
	require.Equal(t, "x-s1", out)
	_, err = Render("k", "{{ .Vars.missing }}", TemplateData{Vars: map[string]string{}})
	require.ErrorContains(t, err, "k:")
	require.True(t, IsDevProvider("tmux"))
	require.False(t, IsDevProvider("aws"))
}

func TestTemplateArgs(t *testing.T) {
	c := &Config{Defaults: Defaults{Args: map[string]string{"image": "base", "zone": "a"}},
		Templates: map[string]Template{"web": {Args: map[string]string{"image": "web"}}, "bare": {}}}
	require.Equal(t, []string{"bare", "web"}, c.TemplateNames())
	require.Equal(t, map[string]string{"image": "web", "zone": "a"}, c.TemplateArgs("web"), "the template's own win")
	require.Equal(t, map[string]string{"image": "base", "zone": "a"}, c.TemplateArgs("bare"))
	c.TemplateArgs("web")["zone"] = "b"
	require.Equal(t, "a", c.Defaults.Args["zone"], "a map of its own")
	require.Equal(t, map[string]string{}, (&Config{}).TemplateArgs("none"))
}
