package layout

import (
	"fmt"
	"regexp"
	"strings"
)

// Keys builds object keys below an optional prefix.
type Keys struct {
	// Prefix is prepended to every key; empty or ending without a slash (one is added).
	Prefix string
}

// New returns Keys for prefix (leading and trailing slashes are trimmed).
func New(prefix string) Keys {
	return Keys{Prefix: strings.Trim(prefix, "/")}
}

func (k Keys) join(parts ...string) string {
	p := strings.Join(parts, "/")
	if k.Prefix == "" {
		return p
	}
	return k.Prefix + "/" + p
}

// CACert is the cluster CA certificate (plain PEM).
func (k Keys) CACert() string { return k.join("cluster", "ca.crt") }

// CAKey is the encrypted cluster CA private key.
func (k Keys) CAKey() string { return k.join("cluster", "secret", "ca.key") }

// CABundle is every cluster CA servers and clients trust (plain PEM). It
// holds two CAs while the cluster CA rotates; absent, CACert alone is trusted.
func (k Keys) CABundle() string { return k.join("cluster", "ca-bundle.crt") }

// CARotation is the state of a cluster CA rotation (JSON).
func (k Keys) CARotation() string { return k.join("cluster", "ca-rotation.json") }

// NextCACert is the incoming cluster CA certificate between the introduce
// and switch phases of a rotation.
func (k Keys) NextCACert() string { return k.join("cluster", "ca-next.crt") }

// NextCAKey is the encrypted private key of the incoming cluster CA.
func (k Keys) NextCAKey() string { return k.join("cluster", "secret", "ca-next.key") }

// PreviousCACert is the outgoing cluster CA certificate between the switch
// and retire phases of a rotation.
func (k Keys) PreviousCACert() string { return k.join("cluster", "ca-previous.crt") }

// WorkloadCACert is the shared workload CA certificate (plain PEM) of a
// cluster created before workload CAs were per tenant: it signs nothing any
// more and is trusted in every tenant's bundle until
// WorkloadCATransition's time (see TenantWorkloadCACert).
func (k Keys) WorkloadCACert() string { return k.join("cluster", "workload-ca.crt") }

// WorkloadCAKey is the encrypted private key of the shared workload CA.
func (k Keys) WorkloadCAKey() string { return k.join("cluster", "secret", "workload-ca.key") }

// WorkloadCATransition records (JSON) until when the shared workload CA
// stays in the tenants' bundles: written once, create-only, by the first
// server that finds the shared CA.
func (k Keys) WorkloadCATransition() string { return k.join("cluster", "workload-ca-transition.json") }

// TenantWorkloadCACert is the workload CA certificate (plain PEM) of one
// tenant (a ValidateID): it signs the certificates the tenant's instance
// templates ask for, and it alone (with the shared CA during a transition)
// is the tenant's ca_bundle. No Nstance listener trusts it.
func (k Keys) TenantWorkloadCACert(tenant string) string {
	return k.join("cluster", "tenants", tenant, "workload-ca.crt")
}

// TenantWorkloadCAKey is the encrypted private key of a tenant's workload CA.
func (k Keys) TenantWorkloadCAKey(tenant string) string {
	return k.join("cluster", "secret", "tenants", tenant, "workload-ca.key")
}

// TenantWorkloadCAPrefix lists the tenants' workload CA certificates (and
// nothing else).
func (k Keys) TenantWorkloadCAPrefix() string { return k.join("cluster", "tenants") + "/" }

// ImportedCACert is the certificate (plain PEM) of a CA the admin imported
// under name (`nstance-admin cluster ca import`), e.g. a workload
// Kubernetes cluster's CA that signs kubelet certificates.
func (k Keys) ImportedCACert(name string) string { return k.join("cluster", "cas", name+".crt") }

// ImportedCAKey is the encrypted private key of an imported CA.
func (k Keys) ImportedCAKey(name string) string {
	return k.join("cluster", "secret", "cas", name+".key")
}

// ImportedCAPrefix lists the imported CAs' certificates.
func (k Keys) ImportedCAPrefix() string { return k.join("cluster", "cas") + "/" }

// UserData is bootstrap data a tenant sent for instances of a shard
// (UpsertGroup, CreateInstance), an encrypted envelope named by the hex
// SHA-256 of its plaintext. It lives under the secret prefix so that an
// encryption key rotation re-seals it.
func (k Keys) UserData(shard, tenant, sha256Hex string) string {
	return k.join("cluster", "secret", "userdata", shard, tenant, sha256Hex)
}

// UserDataPrefix lists the bootstrap data stored for a shard.
func (k Keys) UserDataPrefix(shard string) string {
	return k.join("cluster", "secret", "userdata", shard) + "/"
}

// NonceSigningKey is the encrypted Ed25519 key that signs registration nonces.
func (k Keys) NonceSigningKey() string { return k.join("cluster", "secret", "nonce-signing.key") }

// SecretPrefix is where every encrypted secret lives.
func (k Keys) SecretPrefix() string { return k.join("cluster", "secret") + "/" }

// FileSecret is the encrypted value of the file secret called name, which
// template files of kind secret name (ValidateID). It is sealed like every
// other secret, with the object key as the authenticated name, and lives
// under SecretPrefix so an encryption-key rotation re-seals it too.
func (k Keys) FileSecret(name string) string { return k.join("cluster", "secret", "files", name) }

// FileSecretPrefix lists every file secret.
func (k Keys) FileSecretPrefix() string { return k.join("cluster", "secret", "files") + "/" }

// Object is the full key of an object a template names (a file of kind
// storage, userdata_object): key is relative to the prefix; see
// CheckTemplateObject.
func (k Keys) Object(key string) string { return k.join(key) }

// Probe is where a starting server checks that the store honours
// conditional writes (one short-lived object per server start).
func (k Keys) Probe(shard, serverID, token string) string {
	return k.join("shard", shard, "probe", serverID+"-"+token)
}

// ClusterLeader is the cluster leader lease.
func (k Keys) ClusterLeader() string { return k.join("cluster", "leader.json") }

// ShardLeader is the leader lease of one shard.
func (k Keys) ShardLeader(shard string) string { return k.join("shard", shard, "leader.json") }

// Config is the configuration of one shard.
func (k Keys) Config(shard string) string { return k.join("config", shard+".jsonc") }

// ConfigPrefix lists every shard's configuration.
func (k Keys) ConfigPrefix() string { return k.join("config") + "/" }

// Groups held the dynamic groups of every tenant of one shard; servers
// still read it (a tenant without its own document keeps its groups there)
// but write TenantGroups.
func (k Keys) Groups(shard string) string { return k.join("groups", shard+".jsonc") }

// TenantGroups holds the dynamic groups of one tenant of a shard, so that a
// tenant's writes never rewrite another tenant's groups.
func (k Keys) TenantGroups(shard, tenant string) string {
	return k.join("groups", shard, tenant+".jsonc")
}

// TenantGroupsPrefix lists every tenant's groups document of a shard.
func (k Keys) TenantGroupsPrefix(shard string) string { return k.join("groups", shard) + "/" }

// Instance is the record of one instance.
func (k Keys) Instance(shard, id string) string {
	return k.join("shard", shard, "instances", id+".json")
}

// InstancePrefix lists every instance record of a shard.
func (k Keys) InstancePrefix(shard string) string { return k.join("shard", shard, "instances") + "/" }

// ShardNonce marks an agent nonce (by jti) as used.
func (k Keys) ShardNonce(shard, jti string) string { return k.join("shard", shard, "nonces", jti) }

// ClusterNonce marks an operator nonce (by jti) as used. Operator nonces are not
// bound to a shard, so their markers live at cluster level and a replay fails on
// every shard.
func (k Keys) ClusterNonce(jti string) string { return k.join("cluster", "nonces", jti) }

// Operator is the registration record of operator id of tenant: operator
// ids are scoped to their tenant (as in their SPIFFE URI), so tenants may
// use the same id without touching each other's record.
func (k Keys) Operator(tenant, id string) string {
	return k.join("cluster", "operators", tenant, id+".json")
}

// LegacyOperator is where versions before tenant-scoped operator ids kept
// the record of operator id (whatever its tenant; the record names it).
// Such records are still read (see registration.ReadOperatorRecord).
func (k Keys) LegacyOperator(id string) string { return k.join("cluster", "operators", id+".json") }

// OperatorPrefix lists every operator registration record (both layouts).
func (k Keys) OperatorPrefix() string { return k.join("cluster", "operators") + "/" }

// ParseOperatorKey tells an operator record key apart: {tenant}/{id}.json
// below OperatorPrefix, or {id}.json of the legacy layout (tenant empty,
// legacy true). ok is false for any other key.
func (k Keys) ParseOperatorKey(key string) (tenant, id string, legacy, ok bool) {
	rest, found := strings.CutPrefix(key, k.OperatorPrefix())
	if !found {
		return "", "", false, false
	}
	rest, found = strings.CutSuffix(rest, ".json")
	if !found {
		return "", "", false, false
	}
	switch parts := strings.Split(rest, "/"); len(parts) {
	case 1:
		return "", parts[0], true, ValidateID("operator id", parts[0]) == nil
	case 2:
		ok := ValidateID("tenant", parts[0]) == nil && ValidateID("operator id", parts[1]) == nil
		return parts[0], parts[1], false, ok
	}
	return "", "", false, false
}

// ClusterRevocation is one revocation entry that holds on every shard
// (operator and admin certificates, serials).
func (k Keys) ClusterRevocation(id string) string {
	return k.join("cluster", "revocations", id+".json")
}

// ClusterRevocationPrefix lists the cluster-wide revocation entries.
func (k Keys) ClusterRevocationPrefix() string { return k.join("cluster", "revocations") + "/" }

// ShardRevocation is one revocation entry of a shard (agent certificates of
// its instances).
func (k Keys) ShardRevocation(shard, id string) string {
	return k.join("shard", shard, "revocations", id+".json")
}

// ShardRevocationPrefix lists the revocation entries of one shard.
func (k Keys) ShardRevocationPrefix(shard string) string {
	return k.join("shard", shard, "revocations") + "/"
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidateID checks that s can be used as one key segment (shard id, instance
// id, jti, tenant): 1-128 characters of letters, digits, '.', '_' and '-',
// starting with a letter or digit.
func ValidateID(what, s string) error {
	if !idPattern.MatchString(s) {
		return fmt.Errorf("invalid %s %q: want 1-128 characters [A-Za-z0-9._-] starting with a letter or digit", what, s)
	}
	return nil
}
