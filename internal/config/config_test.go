package config

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const minimal = `{
  // comment
  "cluster": {"id": "c1"},
  "shard": {
    "id": "s1",
    "infra": {"provider": "tmux", "region": "dev", "zone": "deva"},
    "bind": {
      "health_addr": "127.0.0.1:0", "election_addr": "127.0.0.1:0",
      "registration_addr": "127.0.0.1:0", "operator_addr": "127.0.0.1:0", "agent_addr": "127.0.0.1:0",
    },
  },
  "templates": {"t": {"kind": "worker"}},
  "groups": {"default": {"g": {"template": "t", "size": 2}}},
}`

func TestParseExample(t *testing.T) {
	data, err := os.ReadFile("../../examples/config-tmux.jsonc")
	require.NoError(t, err)
	cfg, err := Parse(data)
	require.NoError(t, err)
	require.Equal(t, "tmux", cfg.Shard.Infra.Provider)
	require.Equal(t, "dev", cfg.Shard.Infra.Region)
	require.Equal(t, "deva", cfg.Shard.Infra.Zone)
	require.Equal(t, "0.0.0.0:8994", cfg.Shard.Bind.AgentAddr)
	require.Equal(t, 1, cfg.Groups["default"]["workers"].Size)
	require.Equal(t, 15*time.Second, cfg.Cluster.LeaderElection.LeaseDuration.D())
}

func TestParseDefaults(t *testing.T) {
	cfg, err := Parse([]byte(minimal))
	require.NoError(t, err)
	le := cfg.Cluster.LeaderElection
	require.Equal(t, DefaultLeaseDuration, le.LeaseDuration.D())
	require.Equal(t, DefaultLeaseDuration/3, le.RenewInterval.D())
	require.Equal(t, DefaultLeaseDuration*2/3, le.RenewDeadline.D(), "leader stops acting well before its lease ends")
	require.Equal(t, DefaultMaxClockSkew, le.MaxClockSkew.D())
	require.Equal(t, "env", cfg.Cluster.Secrets.EncryptionKey.Provider)
	require.Equal(t, DefaultEncryptionKeyEnv, cfg.Cluster.Secrets.EncryptionKey.Env)
	require.Equal(t, DefaultAgentNonceTTL, cfg.Certificates.AgentNonceTTL.D())
	require.Equal(t, LeaderAddressNone, cfg.Shard.LeaderAddress.Mode)
	require.False(t, cfg.Shard.Registration.SourceCheckOff(), "the source-address check is on by default")
	r := Registration{SourceAddressCheck: "off", TrustedProxies: []string{"10.1.2.3/8", "192.168.0.9", "::ffff:172.16.0.1"}}
	require.True(t, r.SourceCheckOff())
	require.Equal(t, "[10.0.0.0/8 192.168.0.9/32 172.16.0.1/32]", fmt.Sprint(r.Proxies()))
}

func TestParseLeaderAddressAndAWSKeys(t *testing.T) {
	doc := strings.Replace(minimal, `"zone": "deva"}`, `"zone": "deva"}, "leader_address": {"mode": "aws-eni", "network_interface_id": "eni-0123456789abcdef0"}`, 1)
	doc = strings.Replace(doc, `"cluster": {"id": "c1"}`, `"cluster": {"id": "c1", "secrets": {
	  "encryption_key": {"provider": "aws-secrets-manager", "secret_id": "nstance/key", "region": "eu-west-1"},
	  "previous_keys": [{"provider": "aws-secrets-manager", "secret_id": "nstance/key", "version_stage": "AWSPREVIOUS"}, {"provider": "aws-ssm", "parameter": "/nstance/key:2"}]}}`, 1)
	cfg, err := Parse([]byte(doc))
	require.NoError(t, err)
	require.Equal(t, LeaderAddress{Mode: LeaderAddressAWSENI, NetworkInterfaceID: "eni-0123456789abcdef0", DeviceIndex: 1}, cfg.Shard.LeaderAddress)
	require.Equal(t, "eu-west-1", cfg.Cluster.Secrets.EncryptionKey.Region)
	require.Equal(t, "AWSPREVIOUS", cfg.Cluster.Secrets.PreviousKeys[0].VersionStage)
	require.Equal(t, "/nstance/key:2", cfg.Cluster.Secrets.PreviousKeys[1].Parameter)

	vip := strings.Replace(minimal, `"zone": "deva"}`, `"zone": "deva"}, "leader_address": {"mode": "vip", "interface": "eth0", "address": "10.0.0.10/24"}`, 1)
	cfg, err = Parse([]byte(vip))
	require.NoError(t, err)
	require.Equal(t, LeaderAddress{Mode: LeaderAddressVIP, Interface: "eth0", Address: "10.0.0.10/24"}, cfg.Shard.LeaderAddress)
}

func TestDynamicSubnetPoolNamedByTemplate(t *testing.T) {
	doc := strings.Replace(minimal, `"zone": "deva"}`, `"zone": "deva"}, "dynamic_subnet_pools": {"private": {"tags": {"tier": "private"}}}`, 1)
	doc = strings.Replace(doc, `"kind": "worker"}`, `"kind": "worker", "subnet_pool": "private"}`, 1)
	cfg, err := Parse([]byte(doc))
	require.NoError(t, err)
	require.True(t, cfg.Shard.HasSubnetPool("private"))
	require.False(t, cfg.Shard.HasSubnetPool("other"))
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name    string
		replace [2]string
		wantKey string
		want    string
	}{
		{"unknown top-level key", [2]string{`"cluster": {`, `"bogus": 1, "cluster": {`}, "bogus", "unknown key"},
		{"unknown nested key", [2]string{`"zone": "deva"`, `"zone": "deva", "zonee": "x"`}, "shard.infra.zonee", "unknown key"},
		{"bad address", [2]string{`"agent_addr": "127.0.0.1:0"`, `"agent_addr": "x"`}, "shard.bind.agent_addr", `invalid address "x"`},
		{"bad port", [2]string{`"agent_addr": "127.0.0.1:0"`, `"agent_addr": "127.0.0.1:99999"`}, "shard.bind.agent_addr", "between 0 and 65535"},
		{"missing cluster id", [2]string{`"id": "c1"`, `"id": ""`}, "cluster.id", "required"},
		{"bad cluster id", [2]string{`"id": "c1"`, `"id": "a/b"`}, "cluster.id", "invalid cluster id"},
		{"wrong type", [2]string{`"size": 2`, `"size": "two"`}, "groups.default.g.size", "want integer, got string"},
		{"negative size", [2]string{`"size": 2`, `"size": -1`}, "groups.default.g.size", "must not be negative"},
		{"unknown template", [2]string{`"template": "t"`, `"template": "nope"`}, "groups.default.g.template", `unknown template "nope"`},
		{"bad duration", [2]string{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1", "leader_election": {"lease_duration": "soon"}}`}, "cluster.leader_election.lease_duration", `invalid duration "soon"`},
		{"renew not shorter", [2]string{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1", "leader_election": {"lease_duration": "2s", "renew_interval": "3s"}}`}, "cluster.leader_election.renew_interval", "shorter than lease_duration"},
		{"renew deadline not shorter than the lease", [2]string{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1", "leader_election": {"lease_duration": "3s", "renew_interval": "1s", "renew_deadline": "3s"}}`}, "cluster.leader_election.renew_deadline", "shorter than lease_duration"},
		{"renew deadline not longer than renewals", [2]string{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1", "leader_election": {"lease_duration": "3s", "renew_interval": "1s", "renew_deadline": "1s"}}`}, "cluster.leader_election.renew_deadline", "longer than renew_interval"},
		{"negative clock skew", [2]string{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1", "leader_election": {"max_clock_skew": "-1s"}}`}, "cluster.leader_election.max_clock_skew", "negative"},
		{"key provider", [2]string{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1", "secrets": {"encryption_key": {"provider": "kms"}}}`}, "cluster.secrets.encryption_key.provider", `must be "env", "file", "aws-secrets-manager", "aws-ssm" or "gcp-secret-manager"`},
		{"gcp secret without id", [2]string{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1", "secrets": {"encryption_key": {"provider": "gcp-secret-manager"}}}`}, "cluster.secrets.encryption_key.secret_id", "required"},
		{"gcp secret short id", [2]string{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1", "secrets": {"encryption_key": {"provider": "gcp-secret-manager", "secret_id": "key"}}}`}, "cluster.secrets.encryption_key.secret_id", "projects/PROJECT/secrets/NAME"},
		{"gcp secret with a stage", [2]string{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1", "secrets": {"previous_keys": [{"provider": "gcp-secret-manager", "secret_id": "projects/p/secrets/k", "version_stage": "AWSPREVIOUS"}]}}`}, "cluster.secrets.previous_keys[0].version_stage", "version_id"},
		{"gcp secret with a region", [2]string{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1", "secrets": {"encryption_key": {"provider": "gcp-secret-manager", "secret_id": "projects/p/secrets/k", "region": "eu"}}}`}, "cluster.secrets.encryption_key.region", "AWS providers only"},
		{"secrets manager without id", [2]string{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1", "secrets": {"encryption_key": {"provider": "aws-secrets-manager"}}}`}, "cluster.secrets.encryption_key.secret_id", "required"},
		{"secrets manager stage and id", [2]string{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1", "secrets": {"encryption_key": {"provider": "aws-secrets-manager", "secret_id": "k", "version_stage": "AWSPREVIOUS", "version_id": "v1"}}}`}, "cluster.secrets.encryption_key.version_id", "only one"},
		{"ssm without parameter", [2]string{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1", "secrets": {"previous_keys": [{"provider": "aws-ssm"}]}}`}, "cluster.secrets.previous_keys[0].parameter", "required"},
		{"parameter on env", [2]string{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1", "secrets": {"encryption_key": {"provider": "env", "parameter": "/k"}}}`}, "cluster.secrets.encryption_key.parameter", "aws-ssm only"},
		{"leader address mode", [2]string{`"zone": "deva"}`, `"zone": "deva"}, "leader_address": {"mode": "floating"}`}, "shard.leader_address.mode", `must be "none", "vip", "aws-eni" or "gcp-alias-ip"`},
		{"vip without interface", [2]string{`"zone": "deva"}`, `"zone": "deva"}, "leader_address": {"mode": "vip", "address": "10.0.0.10/24"}`}, "shard.leader_address.interface", "required for mode vip"},
		{"vip without prefix", [2]string{`"zone": "deva"}`, `"zone": "deva"}, "leader_address": {"mode": "vip", "interface": "eth0", "address": "10.0.0.10"}`}, "shard.leader_address.address", "prefix length"},
		{"vip ipv6", [2]string{`"zone": "deva"}`, `"zone": "deva"}, "leader_address": {"mode": "vip", "interface": "eth0", "address": "fd00::10/64"}`}, "shard.leader_address.address", "IPv4 addresses only"},
		{"vip loopback", [2]string{`"zone": "deva"}`, `"zone": "deva"}, "leader_address": {"mode": "vip", "interface": "eth0", "address": "127.0.0.9/8"}`}, "shard.leader_address.address", "not a unicast host address"},
		{"eni without id", [2]string{`"zone": "deva"}`, `"zone": "deva"}, "leader_address": {"mode": "aws-eni"}`}, "shard.leader_address.network_interface_id", "required for mode aws-eni"},
		{"eni bad id", [2]string{`"zone": "deva"}`, `"zone": "deva"}, "leader_address": {"mode": "aws-eni", "network_interface_id": "i-123"}`}, "shard.leader_address.network_interface_id", "want an ENI id"},
		{"gcp alias without address", [2]string{`"zone": "deva"}`, `"zone": "deva"}, "leader_address": {"mode": "gcp-alias-ip"}`}, "shard.leader_address.gcp_address", "required for mode gcp-alias-ip"},
		{"gcp alias bad address", [2]string{`"zone": "deva"}`, `"zone": "deva"}, "leader_address": {"mode": "gcp-alias-ip", "gcp_address": "10.0.0.10"}`}, "shard.leader_address.gcp_address", "want an address name"},
		{"gcp address with eni", [2]string{`"zone": "deva"}`, `"zone": "deva"}, "leader_address": {"mode": "aws-eni", "network_interface_id": "eni-0123456789abcdef0", "gcp_address": "leader"}`}, "shard.leader_address.gcp_address", "want mode gcp-alias-ip"},
		{"address without mode", [2]string{`"zone": "deva"}`, `"zone": "deva"}, "leader_address": {"address": "10.0.0.10/24"}`}, "shard.leader_address.address", "mode is none"},
		{"duplicate bind", [2]string{`"agent_addr": "127.0.0.1:0"`, `"agent_addr": "127.0.0.1:7000", "operator_addr": "127.0.0.1:7000"`}, "", ""},
		{"bad file path", [2]string{`"kind": "worker"}`, `"kind": "worker", "files": {"f": {"kind": "string", "path": "../etc/passwd"}}}`}, "templates.t.files.f.path", "clean relative path"},
		{"cert without key", [2]string{`"kind": "worker"}`, `"kind": "worker", "files": {"f": {"kind": "certificate", "key": "k"}}}`}, "templates.t.files.f.key", `unknown key "k"`},
		{"bad key type", [2]string{`"kind": "worker"}`, `"kind": "worker", "keys": {"k": {"type": "dsa"}}}`}, "templates.t.keys.k.type", "must be one of"},
		{"reserved key name", [2]string{`"kind": "worker"}`, `"kind": "worker", "keys": {"nstance-identity": {"type": "ed25519"}}}`}, "templates.t.keys.nstance-identity", "reserved for the agent's own identity renewal"},
		{"missing provider", [2]string{`"provider": "tmux", `, ``}, "shard.infra.provider", "required"},
		{"negative health misses", [2]string{`"zone": "deva"}`, `"zone": "deva"}, "health_misses": -1`}, "shard.health_misses", "must not be negative"},
		{"negative rotation surge", [2]string{`"zone": "deva"}`, `"zone": "deva"}, "rotation_surge": -2`}, "shard.rotation_surge", "must not be negative"},
		{"source check value", [2]string{`"zone": "deva"}`, `"zone": "deva"}, "registration": {"source_address_check": "maybe"}`}, "shard.registration.source_address_check", `must be "enforce" or "off"`},
		{"trusted proxy", [2]string{`"zone": "deva"}`, `"zone": "deva"}, "registration": {"trusted_proxies": ["10.0.0.0/8", "nat-gw"]}`}, "shard.registration.trusted_proxies[1]", "neither a CIDR nor an IP"},
		{"dynamic pool without tags", [2]string{`"zone": "deva"}`, `"zone": "deva"}, "dynamic_subnet_pools": {"private": {"tags": {}}}`}, "shard.dynamic_subnet_pools.private.tags", "at least one tag"},
		{"dynamic pool also static", [2]string{`"zone": "deva"}`, `"zone": "deva"}, "subnet_pools": {"p": {"subnets": ["s-1"]}}, "dynamic_subnet_pools": {"p": {"tags": {"a": "b"}}}`}, "shard.dynamic_subnet_pools.p", "also defined in shard.subnet_pools"},
		{"unknown pool of a template", [2]string{`"kind": "worker"}`, `"kind": "worker", "subnet_pool": "nope"}`}, "templates.t.subnet_pool", `unknown subnet pool "nope"`},
		{"negative startup grace", [2]string{`"zone": "deva"}`, `"zone": "deva"}, "agent_startup_grace": "-1m"`}, "shard.agent_startup_grace", "must not be negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc := strings.Replace(minimal, tc.replace[0], tc.replace[1], 1)
			require.NotEqual(t, minimal, doc, "replacement did not apply")
			_, err := Parse([]byte(doc))
			require.Error(t, err)
			if tc.name == "duplicate bind" {
				// duplicated JSON key: the later value wins, so check a real duplicate separately
				require.Contains(t, err.Error(), "already used by")
				return
			}
			es, ok := AsErrors(err)
			require.True(t, ok, "want field errors, got %v", err)
			var found bool
			for _, e := range es {
				if e.Key == tc.wantKey && strings.Contains(e.Reason, tc.want) {
					found = true
				}
			}
			require.True(t, found, "want %s: %s in %v", tc.wantKey, tc.want, err)
			require.Contains(t, err.Error(), tc.wantKey+": ")
		})
	}
}

func TestParseSyntaxError(t *testing.T) {
	for _, doc := range []string{`{`, `[]`, `{"cluster": }`, ``} {
		_, err := Parse([]byte(doc))
		require.Error(t, err, doc)
	}
}

func TestApplyPortOffset(t *testing.T) {
	b := Bind{HealthAddr: "0.0.0.0:8990", ElectionAddr: "0.0.0.0:8991", RegistrationAddr: "0.0.0.0:8992", OperatorAddr: "127.0.0.1:0", AgentAddr: "[::]:8994"}
	require.NoError(t, b.ApplyPortOffset(10))
	require.Equal(t, Bind{HealthAddr: "0.0.0.0:9000", ElectionAddr: "0.0.0.0:9001", RegistrationAddr: "0.0.0.0:9002", OperatorAddr: "127.0.0.1:0", AgentAddr: "[::]:9004"}, b)
	bad := Bind{HealthAddr: "0.0.0.0:65535", ElectionAddr: "x:1", RegistrationAddr: "x:1", OperatorAddr: "x:1", AgentAddr: "x:1"}
	require.Error(t, bad.ApplyPortOffset(1))
}
