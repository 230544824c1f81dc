package config

import (
	"fmt"

	"github.com/nstance-dev/nstance/internal/msgsize"
)

// Limits bound what one client, source address or tenant can make the server
// hold or do. Every key has a default (applied when unset or 0); negative and
// out-of-range values are refused. The listener limits (streams, connections,
// message sizes, registration rate), the watch buffer and the file size are
// read when the server starts; the tenant quotas and create rate are read on
// every call.
type Limits struct {
	// MaxConcurrentStreams caps concurrent RPCs on one HTTP/2 connection, on
	// every listener (default 100; the anonymous Registration listener
	// allows at most 8, with 64 KiB flow-control windows).
	MaxConcurrentStreams int `json:"max_concurrent_streams"`
	// MaxConnectionsPerSource caps open connections from one source IP
	// address per listener (default 1024; agents behind one NAT address share it).
	MaxConnectionsPerSource int `json:"max_connections_per_source"`
	// MaxWatchesPerOperator caps concurrent watch streams of one operator
	// (or admin) identity (default 32).
	MaxWatchesPerOperator int `json:"max_watches_per_operator"`
	// MaxStreamsPerAgent caps concurrent server-streaming calls (key
	// requests, file deliveries) of one agent identity; an agent uses two,
	// more only while a reconnect overlaps a stream the server has not yet
	// seen end (default 16).
	MaxStreamsPerAgent int `json:"max_streams_per_agent"`
	// WatchBuffer is how many events a watch buffers for a slow reader
	// before it is disconnected with ResourceExhausted (default 1024).
	WatchBuffer int `json:"watch_buffer"`
	// MaxMessageBytes is the largest gRPC message the server receives or
	// sends on the Operator and Agent listeners, and sends on the
	// Registration listener (default 16 MiB, 4 MiB to 64 MiB; clients
	// accept up to 64 MiB).
	MaxMessageBytes int `json:"max_message_bytes"`
	// MaxRegistrationMessageBytes is the largest message the anonymous
	// Registration listener receives (default 64 KiB, 16 KiB to 1 MiB); a
	// registration request (a nonce, a public key, a CSR) is at most about
	// 13 KiB. A longer message is refused from its 5-byte header, before
	// the server grants flow-control window for its body.
	MaxRegistrationMessageBytes int `json:"max_registration_message_bytes"`
	// MaxFileBytes is the largest total content of the files delivered to
	// one instance (default 8 MiB; at most max_message_bytes - 1 MiB).
	MaxFileBytes int `json:"max_file_bytes"`
	// MaxUserDataBytes is the largest bootstrap data (a template's rendered
	// userdata, or what UpsertGroup and CreateInstance send) of one
	// instance (default 16 KiB, EC2's limit; at most 1 MiB). A provider may
	// allow less once it adds its own part (the agent's bootstrap on AWS).
	MaxUserDataBytes int `json:"max_user_data_bytes"`
	// RegistrationRate limits registration attempts per source IP address
	// (IPv6: per /64), default 300 a minute with bursts of 100 (a NAT
	// address may carry many agents starting at once).
	RegistrationRate RateLimit `json:"registration_rate"`
	// RegistrationSources is how many source addresses the registration
	// limiter tracks at once (default 10000); beyond it, new sources are
	// refused until idle ones expire.
	RegistrationSources int `json:"registration_sources"`
	// MaxGroupsPerTenant caps dynamic groups per tenant (default 256).
	MaxGroupsPerTenant int `json:"max_groups_per_tenant"`
	// MaxVars caps vars of one group or on-demand instance (default 64).
	MaxVars int `json:"max_vars"`
	// MaxLabels caps labels of one group or on-demand instance (default 64).
	MaxLabels int `json:"max_labels"`
	// MaxVarKeyBytes caps the length of one var name a tenant sends
	// (default 128: a name a template refers to as {{ .Vars.name }}).
	MaxVarKeyBytes int `json:"max_var_key_bytes"`
	// MaxVarValueBytes caps one var value a tenant sends (default 4 KiB:
	// room for a PEM certificate or a long join command; bulk data belongs
	// in user data or files, not vars).
	MaxVarValueBytes int `json:"max_var_value_bytes"`
	// MaxLabelKeyBytes caps the length of one label key (default 317: a
	// Kubernetes qualified name, 253-byte prefix, "/", 63-byte name).
	MaxLabelKeyBytes int `json:"max_label_key_bytes"`
	// MaxLabelValueBytes caps one label value (default 1 KiB; a Kubernetes
	// label value is at most 63 bytes, this leaves room for descriptions).
	MaxLabelValueBytes int `json:"max_label_value_bytes"`
	// MaxTenantGroupBytes caps the stored size of all dynamic groups of one
	// tenant on the shard (default 1 MiB: 4 KiB for each of the default 256
	// groups; a group with a few short vars takes 300-500 bytes, one with a
	// PEM certificate in a var about 5 KiB). It bounds the tenant's groups
	// document, which each of the tenant's group writes rewrites, and what
	// the tenant's groups cost the server's memory; other tenants' writes
	// do not see it (each tenant has its own document; bench/tenantgroups).
	MaxTenantGroupBytes int `json:"max_tenant_group_bytes"`
	// TenantCreateRate limits instance creations per tenant: on-demand
	// CreateInstance calls beyond it are refused, group scale-ups wait.
	TenantCreateRate RateLimit `json:"tenant_create_rate"`
}

// Limit defaults and bounds.
const (
	DefaultMaxConcurrentStreams    = 100
	DefaultMaxConnectionsPerSource = 1024
	DefaultMaxWatchesPerOperator   = 32
	DefaultMaxStreamsPerAgent      = 16
	DefaultWatchBuffer             = 1024
	DefaultMaxMessageBytes         = 16 << 20
	DefaultMaxFileBytes            = 8 << 20
	DefaultMaxRegistrationMessage  = 64 << 10
	DefaultMaxUserDataBytes        = 16 << 10
	DefaultRegistrationPerMinute   = 300
	DefaultRegistrationBurst       = 100
	DefaultRegistrationSources     = 10000
	DefaultMaxGroupsPerTenant      = 256
	DefaultMaxVars                 = 64
	DefaultMaxLabels               = 64
	DefaultMaxVarKeyBytes          = 128
	DefaultMaxVarValueBytes        = 4 << 10
	DefaultMaxLabelKeyBytes        = 317
	DefaultMaxLabelValueBytes      = 1 << 10
	DefaultMaxTenantGroupBytes     = 1 << 20
	DefaultTenantCreatePerMinute   = 300
	DefaultTenantCreateBurst       = 100

	// MinMessageBytes is the gRPC default; smaller limits would break
	// messages every client already sends.
	MinMessageBytes = 4 << 20
	// MaxMessageBytesCap is what every nstance client accepts.
	MaxMessageBytesCap = msgsize.ClientMax
	// MessageOverheadBytes is the room a file delivery keeps for paths,
	// hashes and framing beyond the file contents.
	MessageOverheadBytes = 1 << 20
)

func setInt(p *int, v int) {
	if *p == 0 {
		*p = v
	}
}

func (l *Limits) applyDefaults() {
	setInt(&l.MaxConcurrentStreams, DefaultMaxConcurrentStreams)
	setInt(&l.MaxConnectionsPerSource, DefaultMaxConnectionsPerSource)
	setInt(&l.MaxWatchesPerOperator, DefaultMaxWatchesPerOperator)
	setInt(&l.MaxStreamsPerAgent, DefaultMaxStreamsPerAgent)
	setInt(&l.WatchBuffer, DefaultWatchBuffer)
	setInt(&l.MaxMessageBytes, DefaultMaxMessageBytes)
	setInt(&l.MaxRegistrationMessageBytes, DefaultMaxRegistrationMessage)
	setInt(&l.MaxFileBytes, max(1, min(DefaultMaxFileBytes, l.MaxMessageBytes-MessageOverheadBytes)))
	setInt(&l.MaxUserDataBytes, DefaultMaxUserDataBytes)
	setInt(&l.RegistrationRate.PerMinute, DefaultRegistrationPerMinute)
	setInt(&l.RegistrationRate.Burst, DefaultRegistrationBurst)
	setInt(&l.RegistrationSources, DefaultRegistrationSources)
	setInt(&l.MaxGroupsPerTenant, DefaultMaxGroupsPerTenant)
	setInt(&l.MaxVars, DefaultMaxVars)
	setInt(&l.MaxLabels, DefaultMaxLabels)
	setInt(&l.MaxVarKeyBytes, DefaultMaxVarKeyBytes)
	setInt(&l.MaxVarValueBytes, DefaultMaxVarValueBytes)
	setInt(&l.MaxLabelKeyBytes, DefaultMaxLabelKeyBytes)
	setInt(&l.MaxLabelValueBytes, DefaultMaxLabelValueBytes)
	setInt(&l.MaxTenantGroupBytes, DefaultMaxTenantGroupBytes)
	setInt(&l.TenantCreateRate.PerMinute, DefaultTenantCreatePerMinute)
	setInt(&l.TenantCreateRate.Burst, DefaultTenantCreateBurst)
}

func (l Limits) validate(ch *checker) {
	for _, r := range []struct {
		key      string
		v        int
		min, max int
	}{
		{"max_concurrent_streams", l.MaxConcurrentStreams, 4, 1 << 20},
		{"max_connections_per_source", l.MaxConnectionsPerSource, 1, 1 << 20},
		{"max_watches_per_operator", l.MaxWatchesPerOperator, 3, 1 << 16},
		{"max_streams_per_agent", l.MaxStreamsPerAgent, 4, 1 << 16},
		{"watch_buffer", l.WatchBuffer, 16, 1 << 16},
		{"max_message_bytes", l.MaxMessageBytes, MinMessageBytes, MaxMessageBytesCap},
		{"max_registration_message_bytes", l.MaxRegistrationMessageBytes, 16 << 10, 1 << 20},
		{"max_file_bytes", l.MaxFileBytes, 1, max(1, l.MaxMessageBytes-MessageOverheadBytes)},
		{"max_user_data_bytes", l.MaxUserDataBytes, 1, 1 << 20},
		{"registration_rate.per_minute", l.RegistrationRate.PerMinute, 1, 1 << 20},
		{"registration_rate.burst", l.RegistrationRate.Burst, 1, 1 << 20},
		{"registration_sources", l.RegistrationSources, 16, 1 << 22},
		{"max_groups_per_tenant", l.MaxGroupsPerTenant, 1, 1 << 20},
		{"max_vars", l.MaxVars, 1, 1 << 12},
		{"max_labels", l.MaxLabels, 1, 1 << 12},
		{"max_var_key_bytes", l.MaxVarKeyBytes, 1, 4 << 10},
		{"max_var_value_bytes", l.MaxVarValueBytes, 1, 256 << 10},
		{"max_label_key_bytes", l.MaxLabelKeyBytes, 1, 4 << 10},
		{"max_label_value_bytes", l.MaxLabelValueBytes, 1, 256 << 10},
		{"max_tenant_group_bytes", l.MaxTenantGroupBytes, 4 << 10, 64 << 20},
		{"tenant_create_rate.per_minute", l.TenantCreateRate.PerMinute, 1, 1 << 20},
		{"tenant_create_rate.burst", l.TenantCreateRate.Burst, 1, 1 << 20},
	} {
		if r.v < r.min || r.v > r.max {
			reason := fmt.Sprintf("must be between %d and %d, got %d", r.min, r.max, r.v)
			if r.key == "max_file_bytes" && r.v > r.max {
				reason += fmt.Sprintf(" (max_message_bytes %d less %d bytes for paths and hashes)", l.MaxMessageBytes, MessageOverheadBytes)
			}
			ch.add("shard.limits."+r.key, "%s", reason)
		}
	}
}

// WithDefaults returns l with every unset limit at its default, for callers
// holding a Config that did not come through Parse.
func (l Limits) WithDefaults() Limits {
	l.applyDefaults()
	return l
}
