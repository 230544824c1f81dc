package aws

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/nstance-dev/nstance/internal/server/provider"
)

// DefaultImageRefreshInterval is how long a looked-up image is used before
// the next DescribeImages.
const DefaultImageRefreshInterval = time.Hour

// Image is one entry of options.images: the AMI a template names with the
// image_name arg, looked up by DescribeImages.
type Image struct {
	// Name is the AMI name pattern (* and ? wildcards), required.
	Name string `json:"name"`
	// Owners are account ids or aliases (amazon, self); empty: any owner.
	Owners []string `json:"owners"`
	// Architecture is x86_64, arm64, i386 or x86_64_mac; empty: any.
	Architecture string `json:"architecture"`
	// Newest picks the most recently created match (default true); false
	// refuses a pattern matching more than one image.
	Newest *bool `json:"newest"`
	// FallbackID is launched from while no lookup has succeeded yet.
	FallbackID string `json:"fallback_id"`
}

func (im Image) newest() bool { return im.Newest == nil || *im.Newest }

var architectures = map[string]bool{"x86_64": true, "arm64": true, "i386": true, "x86_64_mac": true, "arm64_mac": true}

// validateImages checks options.images.
func (o *Options) validateImages(add func(key, format string, args ...any)) {
	names := make([]string, 0, len(o.Images))
	for n := range o.Images {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		im, key := o.Images[n], optionsKey+".images."+n
		if n == "" || strings.ContainsAny(n, " \t\n") {
			add(key, "want a name without spaces, got %q", n)
		}
		if strings.TrimSpace(im.Name) == "" {
			add(key+".name", "required (an AMI name pattern, * and ? match)")
		}
		if im.Architecture != "" && !architectures[im.Architecture] {
			add(key+".architecture", "want x86_64, arm64, i386, x86_64_mac or arm64_mac, got %q", im.Architecture)
		}
		if im.FallbackID != "" && !strings.HasPrefix(im.FallbackID, "ami-") {
			add(key+".fallback_id", "want ami-…, got %q", im.FallbackID)
		}
	}
	if o.ImageRefreshInterval < 0 {
		add(optionsKey+".image_refresh_interval", "must not be negative, got %s", o.ImageRefreshInterval.D())
	}
}

var _ provider.ImageResolver = (*Provider)(nil)

// ImageNames implements provider.ImageResolver.
func (p *Provider) ImageNames() []string {
	out := make([]string, 0, len(p.o.Images))
	for n := range p.o.Images {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// ImageFallback implements provider.ImageResolver.
func (p *Provider) ImageFallback(name string) string { return p.o.Images[name].FallbackID }

// ImageRefreshInterval implements provider.ImageResolver.
func (p *Provider) ImageRefreshInterval() time.Duration {
	if d := p.o.ImageRefreshInterval.D(); d > 0 {
		return d
	}
	return DefaultImageRefreshInterval
}

// ResolveImage implements provider.ImageResolver: DescribeImages with the
// entry's owners and its name, architecture and state=available filters,
// then PickImage.
func (p *Provider) ResolveImage(ctx context.Context, name string) (string, error) {
	im, ok := p.o.Images[name]
	if !ok {
		return "", fmt.Errorf("image %q is not in shard.infra.options.images", name)
	}
	in := &ec2.DescribeImagesInput{Owners: im.Owners, Filters: []types.Filter{filter("name", im.Name), filter("state", "available")}}
	if im.Architecture != "" {
		in.Filters = append(in.Filters, filter("architecture", im.Architecture))
	}
	out, err := p.api.DescribeImages(ctx, in)
	if err != nil {
		return "", fmt.Errorf("image %q: DescribeImages: %w", name, err)
	}
	id, err := PickImage(im, out.Images)
	if err != nil {
		return "", fmt.Errorf("image %q: %w", name, err)
	}
	return id, nil
}

// PickImage chooses the image of an entry among DescribeImages' matches:
// the newest by creation date (ties: the greatest id, so the choice is
// stable), or the only one when newest is off. No match is an error.
func PickImage(im Image, found []types.Image) (string, error) {
	var cands []types.Image
	for _, c := range found {
		if awssdk.ToString(c.ImageId) != "" && (c.State == "" || c.State == types.ImageStateAvailable) {
			cands = append(cands, c)
		}
	}
	switch {
	case len(cands) == 0:
		return "", fmt.Errorf("no available image matches name %q (owners %v, architecture %q)", im.Name, im.Owners, im.Architecture)
	case len(cands) > 1 && !im.newest():
		return "", fmt.Errorf("%d images match name %q and newest is off", len(cands), im.Name)
	}
	sort.Slice(cands, func(a, b int) bool {
		ta, tb := created(cands[a]), created(cands[b])
		if !ta.Equal(tb) {
			return ta.After(tb)
		}
		return awssdk.ToString(cands[a].ImageId) > awssdk.ToString(cands[b].ImageId)
	})
	return awssdk.ToString(cands[0].ImageId), nil
}

// created parses an image's CreationDate (zero when missing or malformed).
func created(im types.Image) time.Time {
	t, err := time.Parse(time.RFC3339, awssdk.ToString(im.CreationDate))
	if err != nil {
		return time.Time{}
	}
	return t
}
