package aws_test

import (
	"context"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/aws"
	"github.com/nstance-dev/nstance/internal/server/provider/aws/fake"
)

func ami(id, created string, state types.ImageState) types.Image {
	return types.Image{ImageId: awssdk.String(id), CreationDate: awssdk.String(created), State: state}
}

func TestPickImage(t *testing.T) {
	off := false
	for _, tc := range []struct {
		name  string
		im    aws.Image
		found []types.Image
		want  string
		err   string
	}{
		{name: "newest", im: aws.Image{Name: "base-*"}, found: []types.Image{ami("ami-1", "2026-10-01T00:00:00.000Z", ""), ami("ami-2", "2026-11-01T00:00:00.000Z", "available"), ami("ami-3", "2026-09-01T00:00:00.000Z", "")}, want: "ami-2"},
		{name: "same date: greatest id", im: aws.Image{Name: "base-*"}, found: []types.Image{ami("ami-b", "2026-10-01T00:00:00.000Z", ""), ami("ami-a", "2026-10-01T00:00:00.000Z", "")}, want: "ami-b"},
		{name: "unavailable skipped", im: aws.Image{Name: "base-*"}, found: []types.Image{ami("ami-1", "2026-10-01T00:00:00.000Z", ""), ami("ami-2", "2026-11-01T00:00:00.000Z", types.ImageStatePending)}, want: "ami-1"},
		{name: "none", im: aws.Image{Name: "base-*", Owners: []string{"self"}}, err: `no available image matches name "base-*" (owners [self], architecture "")`},
		{name: "newest off, one", im: aws.Image{Name: "base-1", Newest: &off}, found: []types.Image{ami("ami-1", "", "")}, want: "ami-1"},
		{name: "newest off, two", im: aws.Image{Name: "base-*", Newest: &off}, found: []types.Image{ami("ami-1", "", ""), ami("ami-2", "", "")}, err: `2 images match name "base-*" and newest is off`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := aws.PickImage(tc.im, tc.found)
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestResolveImageWithFake(t *testing.T) {
	f := fake.New()
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	f.AddImage("ami-x86old", "base-1", "111", types.ArchitectureValuesX8664, t0)
	f.AddImage("ami-x86new", "base-2", "111", types.ArchitectureValuesX8664, t0.Add(time.Hour))
	f.AddImage("ami-arm", "base-3", "111", types.ArchitectureValuesArm64, t0.Add(2*time.Hour))
	f.AddImage("ami-stranger", "base-4", "222", types.ArchitectureValuesX8664, t0.Add(3*time.Hour))
	o := aws.DefaultOptions()
	o.Images = map[string]aws.Image{"base": {Name: "base-*", Owners: []string{"111"}, Architecture: "x86_64", FallbackID: "ami-fallback"}}
	p := aws.New(f, *o, provider.Env{Config: testConfig})
	id, err := p.ResolveImage(context.Background(), "base")
	require.NoError(t, err)
	require.Equal(t, "ami-x86new", id)
	require.Equal(t, []string{"base"}, p.ImageNames())
	require.Equal(t, "ami-fallback", p.ImageFallback("base"))
	require.Equal(t, aws.DefaultImageRefreshInterval, p.ImageRefreshInterval())
	_, err = p.ResolveImage(context.Background(), "nope")
	require.ErrorContains(t, err, `image "nope" is not in shard.infra.options.images`)

	// A template naming an image launches only once it is resolved.
	req := request("web-1", "web")
	req.Args = map[string]string{provider.ArgImageName: "base"}
	_, err = p.Create(context.Background(), req)
	require.ErrorContains(t, err, `image_name "base": not resolved yet`)
}

func TestValidateImages(t *testing.T) {
	reg := provider.NewRegistry(aws.Kind())
	cfg := testConfig()
	cfg.Shard.Infra.Options = map[string]any{"instance_type": "m7g.large", "images": map[string]any{
		"base": map[string]any{"name": "base-*", "architecture": "arm64", "newest": false},
		"bad":  map[string]any{"architecture": "sparc", "fallback_id": "img-1"},
	}}
	cfg.Templates = map[string]config.Template{"ok": {Args: map[string]string{provider.ArgImageName: "base"}},
		"unknown": {Args: map[string]string{provider.ArgImageName: "other"}}}
	var got []string
	for _, e := range reg.Check(cfg) {
		got = append(got, e.Error())
	}
	require.Equal(t, []string{
		`shard.infra.options.images.bad.name: required (an AMI name pattern, * and ? match)`,
		`shard.infra.options.images.bad.architecture: want x86_64, arm64, i386, x86_64_mac or arm64_mac, got "sparc"`,
		`shard.infra.options.images.bad.fallback_id: want ami-…, got "img-1"`,
		`templates.unknown.args: image_name "other" is not in shard.infra.options.images`,
	}, got)
}
