package config

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// nodeDoc has a kubelet template: client and serving certificates signed by
// the imported CA "kubernetes", the client one a node identity.
const nodeDoc = `{
  "cluster": {"id": "c1"},
  "shard": {"id": "s1", "infra": {"provider": "tmux"}, "instance_domain": "nodes.example.com",
    "bind": {"health_addr": "0.0.0.0:8990", "election_addr": "0.0.0.0:8991", "registration_addr": "0.0.0.0:8992",
      "operator_addr": "0.0.0.0:8993", "agent_addr": "0.0.0.0:8994"}},
  "certificates": {"denied_groups": ["cluster-admins"]},
  "templates": {"node": {"kind": "worker",
    "userdata": "#!/bin/sh\necho {{ .Instance.Hostname }}\n",
    "vars": {"role": "worker"},
    "keys": {
      "kubelet-client": {"type": "ecdsa-p256", "certificate": {"ca": "kubernetes",
        "common_name": "system:node:{{ .Instance.Hostname }}", "organization": ["system:nodes"],
        "usages": ["client_auth"]}},
      "kubelet-serving": {"type": "ecdsa-p256", "certificate": {"ca": "kubernetes",
        "common_name": "system:node:{{ .Instance.Hostname }}", "organization": ["system:nodes"],
        "organizational_units": ["{{ .Vars.role }}"], "tenant_vars": ["zone"],
        "dns_names": ["{{ .Instance.Hostname }}", "{{ .Instance.FQDN }}"], "usages": ["server_auth"]}},
    },
  }},
  "groups": {"acme": {"g": {"template": "node", "vars": {"role": "infra"}}}},
}`

func TestImportedCertificatesAtValidation(t *testing.T) {
	cfg, err := Parse([]byte(nodeDoc))
	require.NoError(t, err)
	require.Equal(t, []string{"cluster-admins", "system:masters"}, cfg.Certificates.DeniedGroupsAll())
	require.Equal(t, DefaultMaxUserDataBytes, cfg.Shard.Limits.MaxUserDataBytes)

	client := `"common_name": "system:node:{{ .Instance.Hostname }}", "organization": ["system:nodes"],
        "usages": ["client_auth"]`
	tests := []struct {
		name     string
		from, to string
		wantKey  string
		want     string
	}{
		{"masters", `"organization": ["system:nodes"],
        "usages": ["client_auth"]`, `"organization": ["system:masters"], "usages": ["client_auth"]`,
			"templates.node.keys.kubelet-client.certificate.organization[0]", "system:masters is never issued"},
		{"masters beside nodes", `"organization": ["system:nodes"],
        "usages": ["client_auth"]`, `"organization": ["system:nodes", "system:masters"], "usages": ["client_auth"]`,
			"templates.node.keys.kubelet-client.certificate.organization[1]", "never issued"},
		{"denied group", `"organization": ["system:nodes"],
        "usages": ["client_auth"]`, `"organization": ["cluster-admins"], "usages": ["client_auth"]`,
			"templates.node.keys.kubelet-client.certificate.organization[0]", "denied_groups"},
		{"masters through a static group's var", `"organization": ["system:nodes"],
        "organizational_units"`, `"organization": ["{{ .Vars.role }}"],
        "organizational_units"`, "groups.acme.g.vars", "system:masters"},
		{"fixed node name", client, `"common_name": "system:node:web-1", "organization": ["system:nodes"], "usages": ["client_auth"]`,
			"templates.node.keys.kubelet-client.certificate", "the instance's own node name"},
		{"reserved user", client, `"common_name": "system:kube-controller-manager", "usages": ["client_auth"]`,
			"templates.node.keys.kubelet-client.certificate", "reserved Kubernetes user names"},
		{"the cluster CA", `"ca": "kubernetes",
        "common_name": "system:node:{{ .Instance.Hostname }}", "organization": ["system:nodes"],
        "usages"`, `"ca": "cluster", "common_name": "x", "usages"`,
			"templates.node.keys.kubelet-client.certificate.ca", "never template certificates"},
		{"organization on a workload certificate", `"ca": "kubernetes",
        "common_name": "system:node:{{ .Instance.Hostname }}", "organization": ["system:nodes"],
        "usages"`, `"common_name": "x", "organization": ["acme"], "usages"`,
			"templates.node.keys.kubelet-client.certificate.organization", "only a certificate of an imported CA"},
		{"userdata template", `echo {{ .Instance.Hostname }}`, `echo {{ .Instance.Hostname `,
			"templates.node.userdata", "not a valid Go template"},
		{"userdata and object", `"userdata": "`, `"userdata_object": "boot/node.sh", "userdata": "`,
			"templates.node.userdata_object", "not both"},
		{"internal object", `"userdata": "#!/bin/sh\necho {{ .Instance.Hostname }}\n",`, `"userdata_object": "cluster/secret/ca.key",`,
			"templates.node.userdata_object", "holds Nstance's own state"},
		{"userdata too large", `"instance_domain"`, `"limits": {"max_user_data_bytes": 10}, "instance_domain"`,
			"templates.node.userdata", "more than shard.limits.max_user_data_bytes (10)"},
		{"domain", `"nodes.example.com"`, `"Nodes_example"`, "shard.instance_domain", "not a DNS domain"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc := strings.Replace(nodeDoc, tc.from, tc.to, 1)
			if tc.name == "masters through a static group's var" {
				doc = strings.Replace(doc, `"vars": {"role": "infra"}`, `"vars": {"role": "system:masters"}`, 1)
			}
			require.NotEqual(t, nodeDoc, doc, "replacement did not apply")
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

func TestTenantVarsAndCertificateData(t *testing.T) {
	cfg, err := Parse([]byte(nodeDoc))
	require.NoError(t, err)
	trusted := map[string]string{"role": "worker"}
	data := EffectiveData("s1", "acme", "g", "node", "", map[string]string{"role": "system:masters", "zone": "a", "other": "x"}, nil)

	// A tenant var the serving certificate's OU depends on is refused; one
	// it lists in tenant_vars, or one no certificate reads, is not.
	reasons := cfg.CheckTenantVars("node", trusted, map[string]string{"role": "system:masters", "zone": "a", "other": "x"}, data)
	require.Len(t, reasons, 1, "%v", reasons)
	require.Contains(t, reasons[0], "vars.role: would change the subject or names of templates.node.keys.kubelet-serving.certificate")
	require.Empty(t, cfg.CheckTenantVars("node", trusted, map[string]string{"zone": "b"}, data))

	// At signing the subject sees the trusted vars and the listed tenant vars only.
	cert := cfg.Templates["node"].Keys["kubelet-serving"].Certificate
	cd := CertificateData(cert, data, trusted)
	require.Equal(t, map[string]string{"role": "worker", "zone": "a"}, cd.Vars)
	rs, err := RenderSubject("k", cert, cd)
	require.NoError(t, err)
	require.Equal(t, []string{"worker"}, rs.OrganizationalUnits)
	// A workload certificate sees every var.
	require.Equal(t, data.Vars, CertificateData(&TemplateCertificate{}, data, trusted).Vars)
}

func TestInstanceData(t *testing.T) {
	d := NewInstanceData("web-1a2b3c4d", "m5.large", "nodes.example.com.", []string{"bogus", "fd00::5", "10.0.0.7", "10.0.0.8"})
	require.Equal(t, InstanceData{ID: "web-1a2b3c4d", Hostname: "web-1a2b3c4d", FQDN: "web-1a2b3c4d.nodes.example.com",
		IP4: "10.0.0.7", IP6: "fd00::5", Type: "m5.large"}, d)
	require.Equal(t, "web-1", NewInstanceData("web-1", "", "", nil).FQDN)
}
