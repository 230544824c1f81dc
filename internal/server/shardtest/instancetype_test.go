package shardtest_test

import (
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/aws"
	"github.com/nstance-dev/nstance/internal/server/provider/aws/fake"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func TestDescribeInstanceTypeDevCatalog(t *testing.T) {
	sh := shardtest.Start(t, shardtest.Options{})
	c := sh.Client(t, "acme")
	ctx := ctxT(t)

	want := &nstancev1.InstanceTypeInfo{Name: "test.small", Vcpus: 2, MemoryMib: 4096, EphemeralStorageGib: 20, Pods: 110,
		Architecture: "amd64", OperatingSystem: "linux"}
	byName, err := c.DescribeInstanceType(ctx, &nstancev1.DescribeInstanceTypeRequest{InstanceType: "test.small"})
	require.NoError(t, err)
	require.True(t, proto.Equal(want, byName.GetInstanceType()), "%v", byName.GetInstanceType())
	byTemplate, err := c.DescribeInstanceType(ctx, &nstancev1.DescribeInstanceTypeRequest{Template: "worker"})
	require.NoError(t, err)
	require.True(t, proto.Equal(want, byTemplate.GetInstanceType()), "%v", byTemplate.GetInstanceType())

	for _, tc := range []struct {
		name string
		req  *nstancev1.DescribeInstanceTypeRequest
		code codes.Code
	}{
		{"nothing named", &nstancev1.DescribeInstanceTypeRequest{}, codes.InvalidArgument},
		{"unknown type (mock provider has no lookup)", &nstancev1.DescribeInstanceTypeRequest{InstanceType: "m5.large"}, codes.NotFound},
		{"unknown template", &nstancev1.DescribeInstanceTypeRequest{Template: "nope"}, codes.NotFound},
	} {
		_, err := c.DescribeInstanceType(ctx, tc.req)
		require.Equal(t, tc.code, status.Code(err), "%s: %v", tc.name, err)
	}
}

func TestDescribeInstanceTypeTemplateOfAnotherTenant(t *testing.T) {
	cfg := strings.Replace(shardtest.Config("test-cluster", "test-1", "mock"), `"instance_type": "test.small",`, `"instance_type": "test.small", "tenants": ["globex"],`, 1)
	sh := shardtest.Start(t, shardtest.Options{ConfigJSONC: cfg})
	ctx := ctxT(t)
	_, err := sh.Client(t, "acme").DescribeInstanceType(ctx, &nstancev1.DescribeInstanceTypeRequest{Template: "worker"})
	require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	_, err = sh.Client(t, "globex").DescribeInstanceType(ctx, &nstancev1.DescribeInstanceTypeRequest{Template: "worker"})
	require.NoError(t, err)
}

func TestDescribeInstanceTypeAWSProvider(t *testing.T) {
	ec2 := fake.New("test-subnet-a")
	ec2.AddInstanceType(fake.InstanceType("g4dn.xlarge", 4, 16384, 1, 125, types.ArchitectureTypeX8664))
	o := aws.DefaultOptions()
	o.ImageID = "ami-0123456789abcdef0"
	cfg, err := config.Parse([]byte(shardtest.Config("test-cluster", "test-1", "mock")))
	require.NoError(t, err)
	sh := shardtest.Start(t, shardtest.Options{Provider: aws.New(ec2, *o, provider.Env{Config: func() *config.Config { return cfg }})})
	c := sh.Client(t, "acme")
	ctx := ctxT(t)

	var got *nstancev1.DescribeInstanceTypeResponse
	for range 2 {
		got, err = c.DescribeInstanceType(ctx, &nstancev1.DescribeInstanceTypeRequest{InstanceType: "g4dn.xlarge"})
		require.NoError(t, err)
		require.True(t, proto.Equal(&nstancev1.InstanceTypeInfo{Name: "g4dn.xlarge", Vcpus: 4, MemoryMib: 16384, Gpus: 1, EphemeralStorageGib: 116,
			Pods: 110, Architecture: "amd64", OperatingSystem: "linux"}, got.GetInstanceType()), "%v", got.GetInstanceType())
	}
	require.Equal(t, 1, ec2.Calls(fake.OpDescribeInstanceTypes), "the provider caches the type")
	// The config catalog answers first.
	got, err = c.DescribeInstanceType(ctx, &nstancev1.DescribeInstanceTypeRequest{Template: "worker"})
	require.NoError(t, err)
	require.Equal(t, int32(2), got.GetInstanceType().GetVcpus())
	_, err = c.DescribeInstanceType(ctx, &nstancev1.DescribeInstanceTypeRequest{InstanceType: "x9.huge"})
	require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
}
