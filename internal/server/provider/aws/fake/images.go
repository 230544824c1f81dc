package fake

import (
	"context"
	"fmt"
	"path"
	"slices"
	"sort"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// Further operation names.
const (
	OpDescribeImages  = "DescribeImages"
	OpDescribeSubnets = "DescribeSubnets"
)

// AddImage registers an available AMI: DescribeImages answers it.
func (f *EC2) AddImage(id, name, owner string, arch types.ArchitectureValues, created time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.images = append(f.images, types.Image{ImageId: awssdk.String(id), Name: awssdk.String(name), OwnerId: awssdk.String(owner),
		Architecture: arch, CreationDate: awssdk.String(created.UTC().Format("2006-01-02T15:04:05.000Z")), State: types.ImageStateAvailable})
}

// FailImages makes the next n DescribeImages calls fail with an
// authorization error (not retried by the SDK).
func (f *EC2) FailImages(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failImages += n
}

// DescribeImages answers by Owners and the filters name (with * and ?
// wildcards), architecture and state, as EC2 does.
func (f *EC2) DescribeImages(_ context.Context, in *ec2.DescribeImagesInput, _ ...func(*ec2.Options)) (*ec2.DescribeImagesOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpDescribeImages); err != nil {
		return nil, err
	}
	if f.failImages > 0 {
		f.failImages--
		return nil, apiError("UnauthorizedOperation", "You are not authorized to perform this operation.")
	}
	out := &ec2.DescribeImagesOutput{}
	for _, im := range f.images {
		if len(in.Owners) > 0 && !slices.Contains(in.Owners, awssdk.ToString(im.OwnerId)) {
			continue
		}
		if len(in.ImageIds) > 0 && !slices.Contains(in.ImageIds, awssdk.ToString(im.ImageId)) {
			continue
		}
		ok := true
		for _, flt := range in.Filters {
			var have string
			switch awssdk.ToString(flt.Name) {
			case "name":
				have = awssdk.ToString(im.Name)
			case "architecture":
				have = string(im.Architecture)
			case "state":
				have = string(im.State)
			default:
				return nil, apiError("InvalidParameterValue", fmt.Sprintf("The filter '%s' is invalid (fake)", awssdk.ToString(flt.Name)))
			}
			ok = ok && slices.ContainsFunc(flt.Values, func(pattern string) bool { m, _ := path.Match(pattern, have); return m })
		}
		if ok {
			out.Images = append(out.Images, im)
		}
	}
	return out, f.leave(OpDescribeImages)
}

// subnet is one fake subnet with its free address count and tags.
type subnet struct {
	id   string
	free int32
	tags map[string]string
}

// AddSubnet registers a subnet with free addresses and tags: RunInstances
// accepts it and takes one address per launch (none left:
// InsufficientFreeAddressesInSubnet), DescribeSubnets answers it.
func (f *EC2) AddSubnet(id string, free int32, tags map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subnets[id] = true
	f.subnetInfo[id] = &subnet{id: id, free: free, tags: tags}
}

// SetFree sets a subnet's free address count.
func (f *EC2) SetFree(id string, free int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.subnetInfo[id]; ok {
		s.free = free
	}
}

// takeAddress uses one address of a known subnet; callers hold f.mu.
func (f *EC2) takeAddress(id string) error {
	s, ok := f.subnetInfo[id]
	if !ok {
		return nil
	}
	if s.free <= 0 {
		return apiError("InsufficientFreeAddressesInSubnet", fmt.Sprintf("There are not enough free addresses in subnet '%s' to satisfy the requested number of instances.", id))
	}
	s.free--
	return nil
}

// DescribeSubnets answers by SubnetIds (unknown: InvalidSubnetID.NotFound)
// and tag:KEY filters.
func (f *EC2) DescribeSubnets(_ context.Context, in *ec2.DescribeSubnetsInput, _ ...func(*ec2.Options)) (*ec2.DescribeSubnetsOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpDescribeSubnets); err != nil {
		return nil, err
	}
	for _, id := range in.SubnetIds {
		if _, ok := f.subnetInfo[id]; !ok {
			return nil, apiError("InvalidSubnetID.NotFound", fmt.Sprintf("The subnet ID '%s' does not exist", id))
		}
	}
	ids := make([]string, 0, len(f.subnetInfo))
	for id := range f.subnetInfo {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	out := &ec2.DescribeSubnetsOutput{}
	for _, id := range ids {
		s := f.subnetInfo[id]
		if len(in.SubnetIds) > 0 && !slices.Contains(in.SubnetIds, id) {
			continue
		}
		ok := true
		for _, flt := range in.Filters {
			name := awssdk.ToString(flt.Name)
			if len(name) < 5 || name[:4] != "tag:" {
				return nil, apiError("InvalidParameterValue", fmt.Sprintf("The filter '%s' is invalid (fake)", name))
			}
			v, has := s.tags[name[4:]]
			ok = ok && has && slices.Contains(flt.Values, v)
		}
		if !ok {
			continue
		}
		sn := types.Subnet{SubnetId: awssdk.String(id), AvailableIpAddressCount: awssdk.Int32(s.free),
			AvailabilityZone: awssdk.String(Zone), State: types.SubnetStateAvailable, VpcId: awssdk.String("vpc-fake")}
		keys := make([]string, 0, len(s.tags))
		for k := range s.tags {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			sn.Tags = append(sn.Tags, types.Tag{Key: awssdk.String(k), Value: awssdk.String(s.tags[k])})
		}
		out.Subnets = append(out.Subnets, sn)
	}
	return out, f.leave(OpDescribeSubnets)
}
