package shardtest_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	smtypes "github.com/aws/aws-sdk-go-v2/service/secretsmanager/types"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/internal/secrets/awssecrets"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// fakeSecretsManager answers GetSecretValue for AWSCURRENT from a map.
type fakeSecretsManager struct {
	mu     sync.Mutex
	values map[string]string
}

func (f *fakeSecretsManager) put(id, v string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.values[id] = v
}

func (f *fakeSecretsManager) GetSecretValue(_ context.Context, in *secretsmanager.GetSecretValueInput, _ ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.values[aws.ToString(in.SecretId)]
	if !ok || (in.VersionStage != nil && aws.ToString(in.VersionStage) != "AWSCURRENT") {
		return nil, &smtypes.ResourceNotFoundException{Message: aws.String("Secrets Manager can't find the specified secret.")}
	}
	return &secretsmanager.GetSecretValueOutput{Name: in.SecretId, SecretString: aws.String(v), VersionStages: []string{"AWSCURRENT"}}, nil
}

// A secret from the cluster's encrypted store, one from Secrets Manager and
// a rendered storage object reach a real agent, the secrets with mode 0600;
// a secret created after the instance started is reported to the tenant
// without holding back the other files, then delivered; a rotated Secrets
// Manager value arrives within cache_ttl.
func TestSecretAndStorageFilesReachTheAgent(t *testing.T) {
	ctx := context.Background()
	objects := memstore.New()
	keys := layout.New("")
	k, err := secrets.ParseKey([]byte(shardtest.EncryptionKey))
	require.NoError(t, err)
	ring, err := secrets.NewKeyring(k)
	require.NoError(t, err)
	sealed := &secrets.Store{Objects: objects, Ring: ring}
	require.NoError(t, sealed.Put(ctx, keys.FileSecret("db-password"), []byte("hunter2\n"), objstore.PutOptions{}))
	_, err = objects.Put(ctx, keys.Object("files/app.conf"), []byte("role={{ .Vars.role }} id={{ .InstanceID }}\n"), objstore.PutOptions{})
	require.NoError(t, err)
	sm := &fakeSecretsManager{values: map[string]string{"prod/api": "api-v1"}}
	remote := awssecrets.New(func(context.Context, string) (awssecrets.SecretsManagerAPI, awssecrets.SSMAPI, error) {
		return sm, nil, nil
	})

	cfg := strings.Replace(agentConfig("worker"), `"tls": { "kind": "certificate", "path": "tls.crt", "key": "tls" },`,
		`"tls": { "kind": "certificate", "path": "tls.crt", "key": "tls" },
        "db": { "kind": "secret", "path": "secrets/db.pw", "secret": "db-password" },
        "api": { "kind": "secret", "path": "secrets/api.key", "source": "aws-secrets-manager", "secret_id": "prod/api", "version_stage": "AWSCURRENT", "region": "eu-west-1", "mode": "0400" },
        "later": { "kind": "secret", "path": "secrets/later", "secret": "later" },
        "conf": { "kind": "storage", "path": "app.conf", "object": "files/app.conf", "template": true },`, 1)
	cfg = strings.Replace(cfg, `"default_drain_timeout": "30s",`, `"default_drain_timeout": "30s", "file_sources": { "cache_ttl": "1s", "max_stale": "1m" },`, 1)
	require.Contains(t, cfg, `"later"`)
	a := startAgentShardWith(t, cfg, func(o *shardtest.Options) { o.Store, o.Remote = objects, remote })
	_, errs := a.watch(t)
	a.upsert(t, 1, "")
	waitGroup(t, a.c, "workers", 1)
	id := a.ids(t)[0]

	mode := func(name string) os.FileMode {
		st, err := os.Stat(filepath.Join(a.stateDir, id, "files", name))
		if err != nil {
			return 0
		}
		return st.Mode().Perm()
	}
	require.Eventually(t, func() bool {
		return a.file(id, "secrets/db.pw") == "hunter2\n" && a.file(id, "secrets/api.key") == "api-v1" &&
			a.file(id, "app.conf") == "role=worker id="+id+"\n" && a.file(id, "role.txt") == "role=worker group=workers"
	}, 15*time.Second, 20*time.Millisecond, "secret and storage files delivered with the others")
	require.Equal(t, os.FileMode(0o600), mode("secrets/db.pw"))
	require.Equal(t, os.FileMode(0o400), mode("secrets/api.key"))
	require.Zero(t, mode("app.conf")&0o022, "storage files are never group- or world-writable")
	require.Empty(t, a.file(id, "secrets/later"))

	ev := errs.next(t, 10*time.Second, func(e *nstancev1.ErrorEvent) bool {
		return e.GetInstanceId() == id && strings.Contains(e.GetMessage(), `file secret "later" does not exist`)
	})
	require.Equal(t, nstancev1.ErrorSource_ERROR_SOURCE_CONFIG, ev.GetSource())
	require.Contains(t, ev.GetMessage(), "files.later (secrets/later)")
	require.NotContains(t, ev.GetMessage(), "hunter2")

	// Created now, it is delivered without anyone telling the server.
	require.NoError(t, sealed.Put(ctx, keys.FileSecret("later"), []byte("late value"), objstore.PutOptions{}))
	require.Eventually(t, func() bool { return a.file(id, "secrets/later") == "late value" }, 15*time.Second, 20*time.Millisecond)
	require.Equal(t, os.FileMode(0o600), mode("secrets/later"))

	// A rotation in Secrets Manager reaches the instance within cache_ttl.
	sm.put("prod/api", "api-v2")
	require.Eventually(t, func() bool { return a.file(id, "secrets/api.key") == "api-v2" }, 15*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return a.agentHash(id) == a.serverHash(t, id) }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, []string{id}, a.ids(t), "no instance was replaced")
}
