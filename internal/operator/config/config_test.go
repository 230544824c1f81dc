package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

const validYAML = `
cluster_id: example-cluster
tenant: default
shards:
  us-west-2a:
    registration_addr: "10.0.0.1:8992"
    operator_addr: "10.0.0.1:8993"
  us-east-1a:
    registration_addr: "10.0.1.1:8992"
    operator_addr: "10.0.1.1:8993"
`

func TestParseValid(t *testing.T) {
	cfg, err := Parse([]byte(validYAML))
	require.NoError(t, err)
	require.Equal(t, "example-cluster", cfg.ClusterID)
	require.Equal(t, "default", cfg.Tenant)
	require.Equal(t, []string{"us-east-1a", "us-west-2a"}, cfg.ShardIDs())
	require.Equal(t, Shard{RegistrationAddr: "10.0.0.1:8992", OperatorAddr: "10.0.0.1:8993"}, cfg.Shards["us-west-2a"])
	require.Empty(t, cfg.OnDemandNamespaces, "unset: the operator's namespace only")

	cfg, err = Parse([]byte(validYAML + "on_demand_namespaces: [batch, team-a]\n"))
	require.NoError(t, err)
	require.Equal(t, []string{"batch", "team-a"}, cfg.OnDemandNamespaces)

	require.Empty(t, cfg.CarryLabelPrefixes, "unset: nothing is carried")
	cfg, err = Parse([]byte(validYAML + "carry_label_prefixes: [example.com/, team]\ncarry_taint_prefixes: [dedicated]\n"))
	require.NoError(t, err)
	require.Equal(t, []string{"example.com/", "team"}, cfg.CarryLabelPrefixes)
	require.Equal(t, []string{"dedicated"}, cfg.CarryTaintPrefixes)
}

func TestReservedNodeKey(t *testing.T) {
	for key, want := range map[string]bool{
		"kubernetes.io/hostname":                  true,
		"node-role.kubernetes.io/worker":          true,
		"node.kubernetes.io/unschedulable":        true,
		"k8s.io/x":                                true,
		"beta.k8s.io/x":                           true,
		"node.cluster.x-k8s.io/pool":              true,
		"team.node.cluster.x-k8s.io/x":            true,
		"cluster.x-k8s.io/cluster-name":           false, // not a Node key CAPI syncs
		"example.com/team":                        false,
		"notkubernetes.io/x":                      false,
		"dedicated":                               false,
		"ToBeDeletedByClusterAutoscaler":          false,
		"kubernetes.io":                           false, // a name, not a prefix
		"example.com/kubernetes.io":               false,
		"topology.kubernetes.io/zone":             true,
		"node.cloudprovider.kubernetes.io/uninit": true,
	} {
		require.Equal(t, want, ReservedNodeKey(key), key)
	}
}

func TestParseInvalid(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"empty", ``, []string{"cluster_id is required", "tenant is required", "at least one shard"}},
		{"not yaml", "cluster_id: [", []string{"parse YAML"}},
		{"unknown key", validYAML + "\nextra: 1\n", []string{"parse YAML", "extra"}},
		{"bad cluster id", "cluster_id: Bad_ID\ntenant: t\nshards: {a: {registration_addr: 'h:1', operator_addr: 'h:2'}}", []string{"cluster_id \"Bad_ID\""}},
		{"missing addr", "cluster_id: c\ntenant: t\nshards: {a: {registration_addr: 'h:1'}}", []string{"shards.a.operator_addr is required"}},
		{"addr without port", "cluster_id: c\ntenant: t\nshards: {a: {registration_addr: 'h', operator_addr: 'h:2'}}", []string{"shards.a.registration_addr \"h\" must be host:port"}},
		{"bad on-demand namespace", validYAML + "on_demand_namespaces: [ok, Not_A_Namespace, '*']\n",
			[]string{`on_demand_namespaces[1] "Not_A_Namespace" must be a namespace name`, `on_demand_namespaces[2] "*"`}},
		{"carry prefixes", validYAML + "carry_label_prefixes: ['', node-role.kubernetes.io/, example.com/]\ncarry_taint_prefixes: [node.cluster.x-k8s.io/]\n",
			[]string{"carry_label_prefixes[0] is empty", `carry_label_prefixes[1] "node-role.kubernetes.io/" names keys`, `carry_taint_prefixes[0] "node.cluster.x-k8s.io/"`}},
		{"shard with separator", "cluster_id: c\ntenant: t\nshards: {a--b: {registration_addr: 'h:1', operator_addr: 'h:2'}}", []string{"shards.a--b: shard ID"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			require.Error(t, err)
			for _, w := range tt.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	_, err := Load(filepath.Join(dir, "missing.yaml"))
	require.ErrorContains(t, err, "does not exist")

	path := filepath.Join(dir, "config.yaml")
	require.NoError(t, os.WriteFile(path, []byte(validYAML), 0o600))
	cfg, err := Load(path)
	require.NoError(t, err)
	require.Len(t, cfg.Shards, 2)

	require.NoError(t, os.WriteFile(path, []byte("tenant: x"), 0o600))
	_, err = Load(path)
	require.ErrorContains(t, err, path)
	require.ErrorContains(t, err, "cluster_id is required")
}

func TestParseEnv(t *testing.T) {
	noPod := func() (string, error) { return "", errors.New("not in a pod") }
	tests := []struct {
		name    string
		vars    map[string]string
		pod     func() (string, error)
		want    Env
		wantErr string
	}{
		{
			name: "defaults with pod namespace",
			pod:  func() (string, error) { return "nstance-system", nil },
			want: Env{
				Namespace: "nstance-system", CAConfigMap: "nstance-cluster-ca", CertSecret: "nstance-operator-cert",
				KeySecret: "nstance-operator-key", NonceSecret: "nstance-operator-nonce", CAPIServiceAccount: "nstance-capi-workload",
			},
		},
		{
			name: "everything set",
			vars: map[string]string{
				EnvNamespace: "ns", EnvCAConfigMap: "ca", EnvCertSecret: "cert", EnvKeySecret: "key", EnvNonceSecret: "nonce",
				EnvCAPIEndpoint: "https://api.example:6443", EnvCAPIServiceAccount: "sa", EnvK8sJSON: "true",
			},
			pod: noPod,
			want: Env{
				Namespace: "ns", CAConfigMap: "ca", CertSecret: "cert", KeySecret: "key", NonceSecret: "nonce",
				CAPIEndpoint: "https://api.example:6443", CAPIServiceAccount: "sa", K8sJSON: true,
			},
		},
		{name: "no namespace", pod: noPod, wantErr: EnvNamespace + " is not set"},
		{name: "bad json flag", vars: map[string]string{EnvNamespace: "ns", EnvK8sJSON: "yes please"}, pod: noPod, wantErr: EnvK8sJSON},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseEnv(func(k string) string { return tt.vars[k] }, tt.pod)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}
