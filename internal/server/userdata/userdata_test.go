package userdata_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/internal/server/userdata"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

func TestStoreSealsAndChecks(t *testing.T) {
	ctx := context.Background()
	k, err := secrets.ParseKey([]byte(strings.Repeat("cd", 32)))
	require.NoError(t, err)
	ring, err := secrets.NewKeyring(k)
	require.NoError(t, err)
	mem := memstore.New()
	s := &userdata.Store{Secrets: &secrets.Store{Objects: mem, Ring: ring}, Keys: layout.New(""), Shard: "s1"}
	data := []byte("#cloud-config\nruncmd: [kubeadm join --token abcdef.0123456789abcdef]\n")
	sum, err := s.Put(ctx, "acme", data)
	require.NoError(t, err)
	require.Equal(t, userdata.Sum(data), sum)
	again, err := s.Put(ctx, "acme", data)
	require.NoError(t, err, "the same bytes twice are one object")
	require.Equal(t, sum, again)
	raw, err := mem.Get(ctx, layout.New("").UserData("s1", "acme", sum))
	require.NoError(t, err)
	require.NotContains(t, string(raw.Body), "kubeadm", "stored encrypted")
	got, err := s.Get(ctx, "acme", sum)
	require.NoError(t, err)
	require.Equal(t, data, got)
	_, err = s.Get(ctx, "other-tenant", sum)
	require.ErrorIs(t, err, objstore.ErrNotFound, "one tenant cannot name another's data")
	// Bytes that do not match their name are refused.
	require.NoError(t, s.Secrets.Put(ctx, layout.New("").UserData("s1", "acme", strings.Repeat("0", 64)), []byte("x"), objstore.PutOptions{}))
	_, err = s.Get(ctx, "acme", strings.Repeat("0", 64))
	require.ErrorContains(t, err, "do not match their hash")
	_, err = (*userdata.Store)(nil).Put(ctx, "acme", data)
	require.ErrorContains(t, err, "no secret store")
}

func TestRenderAndLimits(t *testing.T) {
	ctx := context.Background()
	data := config.TemplateData{Cluster: "c1", Shard: "s1", Group: "g", Vars: map[string]string{"role": "db"},
		Instance: config.NewInstanceData("g-1a2b3c4d", "m5.large", "nodes.example.com", nil)}
	objects := map[string]string{"boot/node.sh": "#!/bin/sh\nhostname {{ .Instance.FQDN }} # {{ .Vars.role }}\n"}
	read := func(_ context.Context, key string) ([]byte, error) {
		if v, ok := objects[key]; ok {
			return []byte(v), nil
		}
		return nil, errors.New("no such object")
	}
	out, err := userdata.Render(ctx, "templates.t", config.Template{Userdata: "#!/bin/sh\necho {{ .Instance.Hostname }} {{ .Cluster }}\n"}, data, read)
	require.NoError(t, err)
	require.Equal(t, "#!/bin/sh\necho g-1a2b3c4d c1\n", string(out))
	out, err = userdata.Render(ctx, "templates.t", config.Template{UserdataObject: "boot/node.sh"}, data, read)
	require.NoError(t, err)
	require.Equal(t, "#!/bin/sh\nhostname g-1a2b3c4d.nodes.example.com # db\n", string(out))
	out, err = userdata.Render(ctx, "templates.t", config.Template{}, data, read)
	require.NoError(t, err)
	require.Nil(t, out)
	_, err = userdata.Render(ctx, "templates.t", config.Template{UserdataObject: "missing.sh"}, data, read)
	require.ErrorContains(t, err, "templates.t.userdata_object: reading missing.sh")
	_, err = userdata.Render(ctx, "templates.t", config.Template{UserdataObject: "cluster/secret/ca.key"}, data, read)
	require.ErrorContains(t, err, "Nstance's own state")
	_, err = userdata.Render(ctx, "templates.t", config.Template{Userdata: "{{ .Vars.missing }}"}, data, read)
	require.ErrorContains(t, err, "templates.t.userdata")

	require.NoError(t, userdata.CheckSize("group g", make([]byte, 10), 10))
	require.EqualError(t, userdata.CheckSize("group g", make([]byte, 11), 10), "group g: user data is 11 bytes, more than shard.limits.max_user_data_bytes (10)")
	f, err := userdata.CheckFormat("")
	require.NoError(t, err)
	require.Equal(t, "cloud-config", f)
	_, err = userdata.CheckFormat("yaml")
	require.ErrorContains(t, err, "user_data_format")
}

func TestPruneKeepsWhatIsNamedAndWhatIsNew(t *testing.T) {
	ctx := context.Background()
	k, err := secrets.ParseKey([]byte(strings.Repeat("ef", 32)))
	require.NoError(t, err)
	ring, err := secrets.NewKeyring(k)
	require.NoError(t, err)
	mem := memstore.New()
	sealed := &secrets.Store{Objects: mem, Ring: ring}
	s := &userdata.Store{Secrets: sealed, Keys: layout.New(""), Shard: "s1"}
	other := &userdata.Store{Secrets: sealed, Keys: layout.New(""), Shard: "s2"}
	used, err := s.Put(ctx, "acme", []byte("#!/bin/sh\necho used\n"))
	require.NoError(t, err)
	unused, err := s.Put(ctx, "acme", []byte("#!/bin/sh\necho old\n"))
	require.NoError(t, err)
	otherShard, err := other.Put(ctx, "acme", []byte("#!/bin/sh\necho s2\n"))
	require.NoError(t, err)
	keep := func(tenant, sum string) bool { return tenant == "acme" && sum == used }

	n, err := s.Prune(ctx, keep, time.Now().Add(-time.Hour))
	require.NoError(t, err)
	require.Zero(t, n, "nothing older than the grace period")
	n, err = s.Prune(ctx, keep, time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = s.Get(ctx, "acme", used)
	require.NoError(t, err)
	_, err = s.Get(ctx, "acme", unused)
	require.ErrorIs(t, err, objstore.ErrNotFound)
	_, err = other.Get(ctx, "acme", otherShard)
	require.NoError(t, err, "another shard's data is not this shard's to prune")
}
