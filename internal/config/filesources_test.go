package config

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// withFiles is minimal with template t delivering files (a JSON object body).
func withFiles(files string) string {
	return strings.Replace(minimal, `"templates": {"t": {"kind": "worker"}}`, `"templates": {"t": {"kind": "worker", "files": `+files+`}}`, 1)
}

func TestFileSourcesParse(t *testing.T) {
	cfg, err := Parse([]byte(withFiles(`{
	  "db": {"kind": "secret", "secret": "db-password"},
	  "api": {"kind": "secret", "source": "aws-secrets-manager", "secret_id": "prod/api", "version_stage": "AWSPREVIOUS", "region": "eu-west-1", "mode": "0400"},
	  "tok": {"kind": "secret", "source": "aws-ssm", "parameter": "/prod/token:3"},
	  "gcp": {"kind": "secret", "source": "gcp-secret-manager", "secret_id": "projects/p1/secrets/api", "version_id": "4"},
	  "conf": {"kind": "storage", "object": "files/app.conf", "template": true, "mode": "0644"},
	}`)))
	require.NoError(t, err)
	files := cfg.Templates["t"].Files
	require.Equal(t, FileSourceCluster, files["db"].SecretSource())
	require.Equal(t, "prod/api", files["api"].SecretID)
	require.Equal(t, "AWSPREVIOUS", files["api"].VersionStage)
	require.Equal(t, "/prod/token:3", files["tok"].Parameter)
	require.Equal(t, FileSourceGCPSecretManager, files["gcp"].SecretSource())
	require.Equal(t, "4", files["gcp"].VersionID)
	require.True(t, files["conf"].Template)
	require.Equal(t, "files/app.conf", files["conf"].Object)
	require.Equal(t, DefaultFileCacheTTL, cfg.Shard.FileSources.CacheTTL.D())
	require.Equal(t, DefaultFileMaxStale, cfg.Shard.FileSources.MaxStale.D())

	doc := strings.Replace(minimal, `"zone": "deva"}`, `"zone": "deva"}, "file_sources": {"cache_ttl": "2h"}`, 1)
	cfg, err = Parse([]byte(doc))
	require.NoError(t, err)
	require.Equal(t, 2*time.Hour, cfg.Shard.FileSources.MaxStale.D(), "max_stale defaults to at least cache_ttl")
}

func TestFileSourcesInvalid(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		wantKey string
		want    string
	}{
		{"secret without name", withFiles(`{"db": {"kind": "secret"}}`), "templates.t.files.db.secret", "required for kind secret"},
		{"secret bad name", withFiles(`{"db": {"kind": "secret", "secret": "a/b"}}`), "templates.t.files.db.secret", "invalid secret name"},
		{"secret mode too loose", withFiles(`{"db": {"kind": "secret", "secret": "db", "mode": "0640"}}`), "templates.t.files.db.mode", `at most "0600"`},
		{"secret with content", withFiles(`{"db": {"kind": "secret", "secret": "db", "content": "x"}}`), "templates.t.files.db.content", "not for kind secret"},
		{"unknown source", withFiles(`{"db": {"kind": "secret", "source": "vault", "secret": "db"}}`), "templates.t.files.db.source", `must be "cluster", "aws-secrets-manager", "aws-ssm" or "gcp-secret-manager"`},
		{"gcp secret short id", withFiles(`{"db": {"kind": "secret", "source": "gcp-secret-manager", "secret_id": "db"}}`), "templates.t.files.db.secret_id", "projects/PROJECT/secrets/NAME"},
		{"gcp secret with parameter", withFiles(`{"db": {"kind": "secret", "source": "gcp-secret-manager", "secret_id": "projects/p/secrets/db", "parameter": "/x"}}`), "templates.t.files.db.parameter", "gcp-secret-manager"},
		{"secrets manager without id", withFiles(`{"db": {"kind": "secret", "source": "aws-secrets-manager"}}`), "templates.t.files.db.secret_id", "required for source aws-secrets-manager"},
		{"secrets manager stage and id", withFiles(`{"db": {"kind": "secret", "source": "aws-secrets-manager", "secret_id": "x", "version_stage": "AWSCURRENT", "version_id": "v1"}}`), "templates.t.files.db.version_id", "only one"},
		{"secrets manager with store name", withFiles(`{"db": {"kind": "secret", "source": "aws-secrets-manager", "secret_id": "x", "secret": "db"}}`), "templates.t.files.db.secret", "not used by source aws-secrets-manager"},
		{"ssm without parameter", withFiles(`{"db": {"kind": "secret", "source": "aws-ssm"}}`), "templates.t.files.db.parameter", "required for source aws-ssm"},
		{"ssm with secret id", withFiles(`{"db": {"kind": "secret", "source": "aws-ssm", "parameter": "/p", "secret_id": "x"}}`), "templates.t.files.db.secret_id", "not used by source aws-ssm"},
		{"cluster source with region", withFiles(`{"db": {"kind": "secret", "secret": "db", "region": "eu-west-1"}}`), "templates.t.files.db.region", "not used by source cluster"},
		{"storage without object", withFiles(`{"c": {"kind": "storage"}}`), "templates.t.files.c.object", "required for kind storage"},
		{"storage secret prefix", withFiles(`{"c": {"kind": "storage", "object": "cluster/secret/ca.key"}}`), "templates.t.files.c.object", "Nstance's own state"},
		{"storage instance record", withFiles(`{"c": {"kind": "storage", "object": "shard/s1/instances/i-1.json"}}`), "templates.t.files.c.object", "Nstance's own state"},
		{"storage nonce", withFiles(`{"c": {"kind": "storage", "object": "shard/s1/nonces/abc"}}`), "templates.t.files.c.object", "Nstance's own state"},
		{"storage leader lease", withFiles(`{"c": {"kind": "storage", "object": "cluster/leader.json"}}`), "templates.t.files.c.object", "Nstance's own state"},
		{"storage dot dot", withFiles(`{"c": {"kind": "storage", "object": "files/../cluster/secret/ca.key"}}`), "templates.t.files.c.object", `".." segment`},
		{"storage leading slash", withFiles(`{"c": {"kind": "storage", "object": "/files/a"}}`), "templates.t.files.c.object", "empty segment"},
		{"storage with content", withFiles(`{"c": {"kind": "storage", "object": "files/a", "content": "x"}}`), "templates.t.files.c.content", "not for kind storage"},
		{"storage with secret", withFiles(`{"c": {"kind": "storage", "object": "files/a", "secret": "db"}}`), "templates.t.files.c.secret", "for kind secret only"},
		{"template on string", withFiles(`{"c": {"kind": "string", "content": "x", "template": true}}`), "templates.t.files.c.template", "for kind storage only"},
		{"object on string", withFiles(`{"c": {"kind": "string", "content": "x", "object": "files/a"}}`), "templates.t.files.c.object", "for kind storage only"},
		{"secret id on env", withFiles(`{"c": {"kind": "env", "content": "A=b", "secret_id": "x"}}`), "templates.t.files.c.secret_id", "for kind secret only"},
		{"cache ttl", strings.Replace(minimal, `"zone": "deva"}`, `"zone": "deva"}, "file_sources": {"cache_ttl": "-1m"}`, 1), "shard.file_sources.cache_ttl", "must be positive"},
		{"max stale", strings.Replace(minimal, `"zone": "deva"}`, `"zone": "deva"}, "file_sources": {"cache_ttl": "10m", "max_stale": "5m"}`, 1), "shard.file_sources.max_stale", "not be shorter than cache_ttl"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.NotEqual(t, minimal, tc.doc, "replacement did not apply")
			_, err := Parse([]byte(tc.doc))
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
