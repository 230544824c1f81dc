package config

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func withLimits(t *testing.T, limits string) (*Config, error) {
	t.Helper()
	doc := strings.Replace(minimal, `"zone": "deva"}`, `"zone": "deva"}, "limits": {`+limits+`}`, 1)
	require.NotEqual(t, minimal, doc)
	return Parse([]byte(doc))
}

func TestLimitsDefaults(t *testing.T) {
	cfg, err := Parse([]byte(minimal))
	require.NoError(t, err)
	l := cfg.Shard.Limits
	require.Equal(t, DefaultMaxConcurrentStreams, l.MaxConcurrentStreams)
	require.Equal(t, DefaultMaxWatchesPerOperator, l.MaxWatchesPerOperator)
	require.Equal(t, DefaultMaxStreamsPerAgent, l.MaxStreamsPerAgent)
	require.Equal(t, DefaultMaxMessageBytes, l.MaxMessageBytes)
	require.Equal(t, DefaultMaxFileBytes, l.MaxFileBytes)
	require.Equal(t, 64<<10, l.MaxRegistrationMessageBytes)
	require.Equal(t, 4<<10, l.MaxVarValueBytes)
	require.Equal(t, 128, l.MaxVarKeyBytes)
	require.Equal(t, 317, l.MaxLabelKeyBytes)
	require.Equal(t, 1<<10, l.MaxLabelValueBytes)
	require.Equal(t, 1<<20, l.MaxTenantGroupBytes)
	require.Equal(t, RateLimit{PerMinute: DefaultRegistrationPerMinute, Burst: DefaultRegistrationBurst}, l.RegistrationRate)
	require.Equal(t, RateLimit{PerMinute: DefaultTenantCreatePerMinute, Burst: DefaultTenantCreateBurst}, l.TenantCreateRate)
	require.Equal(t, l, Limits{}.WithDefaults())

	// A smaller message limit lowers the default file limit with it.
	cfg, err = withLimits(t, `"max_message_bytes": 5242880`)
	require.NoError(t, err)
	require.Equal(t, 4<<20, cfg.Shard.Limits.MaxFileBytes)
}

func TestLimitsValidation(t *testing.T) {
	for _, tc := range []struct{ limits, key, want string }{
		{`"max_concurrent_streams": -1`, "shard.limits.max_concurrent_streams", "must be between 4 and"},
		{`"max_watches_per_operator": 1`, "shard.limits.max_watches_per_operator", "must be between 3 and"},
		{`"max_streams_per_agent": 2`, "shard.limits.max_streams_per_agent", "must be between 4 and"},
		{`"max_connections_per_source": -5`, "shard.limits.max_connections_per_source", "got -5"},
		{`"watch_buffer": 100000`, "shard.limits.watch_buffer", "must be between 16 and 65536"},
		{`"max_message_bytes": 1024`, "shard.limits.max_message_bytes", "must be between 4194304 and 67108864"},
		{`"max_message_bytes": 134217728`, "shard.limits.max_message_bytes", "must be between 4194304 and 67108864"},
		{`"max_file_bytes": 16777216`, "shard.limits.max_file_bytes", "max_message_bytes 16777216 less 1048576 bytes"},
		{`"registration_rate": {"per_minute": -1}`, "shard.limits.registration_rate.per_minute", "must be between 1"},
		{`"max_groups_per_tenant": -1`, "shard.limits.max_groups_per_tenant", "must be between 1"},
		{`"max_vars": 5000`, "shard.limits.max_vars", "must be between 1 and 4096"},
		{`"max_labels": -2`, "shard.limits.max_labels", "got -2"},
		{`"max_registration_message_bytes": 1024`, "shard.limits.max_registration_message_bytes", "must be between 16384 and 1048576, got 1024"},
		{`"max_registration_message_bytes": 16777216`, "shard.limits.max_registration_message_bytes", "must be between 16384 and 1048576"},
		{`"max_var_key_bytes": -1`, "shard.limits.max_var_key_bytes", "must be between 1 and 4096, got -1"},
		{`"max_var_value_bytes": 1048576`, "shard.limits.max_var_value_bytes", "must be between 1 and 262144"},
		{`"max_label_key_bytes": 5000`, "shard.limits.max_label_key_bytes", "must be between 1 and 4096"},
		{`"max_label_value_bytes": -3`, "shard.limits.max_label_value_bytes", "got -3"},
		{`"max_tenant_group_bytes": 1000`, "shard.limits.max_tenant_group_bytes", "must be between 4096 and 67108864, got 1000"},
		{`"max_tenant_group_bytes": 134217728`, "shard.limits.max_tenant_group_bytes", "must be between 4096 and 67108864"},
		{`"tenant_create_rate": {"burst": -1}`, "shard.limits.tenant_create_rate.burst", "must be between 1"},
		{`"max_vars": "many"`, "shard.limits.max_vars", "want integer, got string"},
		{`"max_streams": 5`, "shard.limits.max_streams", "unknown key"},
	} {
		t.Run(tc.key, func(t *testing.T) {
			_, err := withLimits(t, tc.limits)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.key+": ")
			require.Contains(t, err.Error(), tc.want)
		})
	}
	cfg, err := withLimits(t, `"max_message_bytes": 67108864, "max_file_bytes": 66060288, "max_watches_per_operator": 3`)
	require.NoError(t, err)
	require.Equal(t, 63<<20, cfg.Shard.Limits.MaxFileBytes)
	// The bounds themselves are accepted.
	cfg, err = withLimits(t, `"max_registration_message_bytes": 16384, "max_var_key_bytes": 4096, "max_var_value_bytes": 262144, `+
		`"max_label_key_bytes": 1, "max_label_value_bytes": 262144, "max_tenant_group_bytes": 67108864`)
	require.NoError(t, err)
	require.Equal(t, 64<<20, cfg.Shard.Limits.MaxTenantGroupBytes)
}

func TestTemplateFilesAboveMaxFileBytesRefused(t *testing.T) {
	big := strings.Repeat("x", 2<<20)
	doc := strings.Replace(minimal, `"kind": "worker"}`, fmt.Sprintf(`"kind": "worker", "files": {"a": {"kind": "string", "content": %q}, "b": {"kind": "string", "content": %q}}}`, big, big), 1)
	doc = strings.Replace(doc, `"zone": "deva"}`, `"zone": "deva"}, "limits": {"max_file_bytes": 4194303}`, 1)
	_, err := Parse([]byte(doc))
	require.Error(t, err)
	require.Contains(t, err.Error(), "templates.t.files: file contents total 4194304 bytes, more than shard.limits.max_file_bytes (4194303)")
	// At the limit it is accepted.
	_, err = Parse([]byte(strings.Replace(doc, "4194303", "4194304", 1)))
	require.NoError(t, err)
}
