package layout

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestKeys(t *testing.T) {
	tests := []struct {
		name   string
		prefix string
		got    func(Keys) string
		want   string
	}{
		{"ca no prefix", "", Keys.CACert, "cluster/ca.crt"},
		{"ca prefix", "/p/q/", Keys.CACert, "p/q/cluster/ca.crt"},
		{"config", "", func(k Keys) string { return k.Config("dev-1") }, "config/dev-1.jsonc"},
		{"shard leader", "x", func(k Keys) string { return k.ShardLeader("s") }, "x/shard/s/leader.json"},
		{"nonce", "", func(k Keys) string { return k.ShardNonce("s", "abc") }, "shard/s/nonces/abc"},
		{"cluster revocation", "p", func(k Keys) string { return k.ClusterRevocation("ab12") }, "p/cluster/revocations/ab12.json"},
		{"shard revocation", "", func(k Keys) string { return k.ShardRevocation("s", "ab12") }, "shard/s/revocations/ab12.json"},
		{"operator prefix", "", func(k Keys) string { return k.OperatorPrefix() }, "cluster/operators/"},
		{"operator", "p", func(k Keys) string { return k.Operator("tenant-b", "op") }, "p/cluster/operators/tenant-b/op.json"},
		{"legacy operator", "p", func(k Keys) string { return k.LegacyOperator("op") }, "p/cluster/operators/op.json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.got(New(tc.prefix)))
		})
	}
}

func TestParseOperatorKey(t *testing.T) {
	k := New("p")
	for _, tc := range []struct {
		key, tenant, id string
		legacy, ok      bool
	}{
		{k.Operator("tenant-b", "op"), "tenant-b", "op", false, true},
		{k.LegacyOperator("op"), "", "op", true, true},
		{"p/cluster/operators/a/b/c.json", "", "", false, false},
		{"p/cluster/operators/a/op.txt", "", "", false, false},
		{"cluster/operators/a/op.json", "", "", false, false},
		{"p/cluster/operators/-a/op.json", "-a", "op", false, false},
	} {
		tenant, id, legacy, ok := k.ParseOperatorKey(tc.key)
		require.Equal(t, tc.ok, ok, tc.key)
		if ok {
			require.Equal(t, []any{tc.tenant, tc.id, tc.legacy}, []any{tenant, id, legacy}, tc.key)
		}
	}
}

func TestValidateID(t *testing.T) {
	for _, ok := range []string{"a", "dev-1", "A.b_c-9"} {
		require.NoError(t, ValidateID("id", ok), ok)
	}
	for _, bad := range []string{"", "../x", "a/b", "-a", "a b", string(make([]byte, 200))} {
		require.Error(t, ValidateID("id", bad), bad)
	}
}

func TestTemplateObjectKeys(t *testing.T) {
	k := New("/pre/")
	if got := k.FileSecret("db"); got != "pre/cluster/secret/files/db" {
		t.Fatalf("FileSecret = %q", got)
	}
	if got := k.FileSecretPrefix(); got != "pre/cluster/secret/files/" || !strings.HasPrefix(got, k.SecretPrefix()) {
		t.Fatalf("FileSecretPrefix = %q, want it under SecretPrefix %q", got, k.SecretPrefix())
	}
	if got := k.Object("files/app.conf"); got != "pre/files/app.conf" {
		t.Fatalf("Object = %q", got)
	}
	for _, ok := range []string{"files/app.conf", "a", "web/config.d/x.yaml", "clusters/x", "shards", "configs/a"} {
		if err := CheckTemplateObject(ok); err != nil {
			t.Errorf("CheckTemplateObject(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", "/files/a", "files/", "files//a", "./cluster/ca.key", "files/../cluster/secret/ca.key", "a\x00b",
		"cluster/secret/ca.key", "cluster/ca.crt", "Cluster/secret/files/db", "shard/dev-1/instances/i-1.json", "shard/dev-1/nonces/x",
		"shard/dev-1/leader.json", "config/dev-1.jsonc", "groups/dev-1.jsonc", "groups/dev-1/acme.jsonc", "cluster"} {
		if err := CheckTemplateObject(bad); err == nil {
			t.Errorf("CheckTemplateObject(%q) = nil, want an error", bad)
		}
	}
}
