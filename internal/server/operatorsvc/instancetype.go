package operatorsvc

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/server/provider"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// DescribeInstanceType implements the RPC: the instance type named, or the
// instance_type of a template open to the caller's tenant, looked up in
// Options.InstanceTypes.
func (s *Service) DescribeInstanceType(ctx context.Context, req *nstancev1.DescribeInstanceTypeRequest) (*nstancev1.DescribeInstanceTypeResponse, error) {
	tenant, err := s.tenant(ctx)
	if err != nil {
		return nil, err
	}
	if s.o.InstanceTypes == nil || s.o.Config == nil {
		return nil, status.Error(codes.Unimplemented, "this server has no instance-type catalog")
	}
	name := req.GetInstanceType()
	if tmpl := req.GetTemplate(); tmpl != "" {
		cfg := s.o.Config.Current()
		t, ok := cfg.Templates[tmpl]
		if reason := cfg.CheckTemplateTenant(tmpl, tenant); !ok || reason != "" {
			// A template of another tenant reads as missing.
			return nil, status.Errorf(codes.NotFound, "template %q not found", tmpl)
		}
		if name == "" {
			name = t.InstanceType
		}
	}
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "no instance type: give instance_type or a template that names one")
	}
	it, err := s.o.InstanceTypes.DescribeInstanceType(ctx, name)
	if errors.Is(err, provider.ErrUnknownInstanceType) {
		return nil, status.Error(codes.NotFound, err.Error())
	}
	if err != nil {
		return nil, toStatus(err)
	}
	return &nstancev1.DescribeInstanceTypeResponse{InstanceType: &nstancev1.InstanceTypeInfo{
		Name: it.Name, Vcpus: it.VCPUs, MemoryMib: it.MemoryMiB, Gpus: it.GPUs, EphemeralStorageGib: it.EphemeralStorageGiB,
		Pods: it.Pods, Architecture: it.Architecture, OperatingSystem: it.OperatingSystem,
	}}, nil
}
