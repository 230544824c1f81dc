package nstancev1_test

import (
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

type rpcKind int

const (
	unary rpcKind = iota
	serverStream
	clientStream
	bidiStream
)

func kindOf(md protoreflect.MethodDescriptor) rpcKind {
	switch {
	case md.IsStreamingClient() && md.IsStreamingServer():
		return bidiStream
	case md.IsStreamingServer():
		return serverStream
	case md.IsStreamingClient():
		return clientStream
	default:
		return unary
	}
}

// wantServices is the complete RPC surface of nstance.v1.
var wantServices = []struct {
	service string
	desc    *grpc.ServiceDesc
	rpcs    map[string]rpcKind
}{
	{
		service: "nstance.v1.RegistrationService",
		desc:    &nstancev1.RegistrationService_ServiceDesc,
		rpcs: map[string]rpcKind{
			"RegisterAgent":    unary,
			"RegisterOperator": unary,
		},
	},
	{
		service: "nstance.v1.AgentService",
		desc:    &nstancev1.AgentService_ServiceDesc,
		rpcs: map[string]rpcKind{
			"KeyGenRequests":   serverStream,
			"SubmitPublicKeys": unary,
			"ReceiveFiles":     serverStream,
			"ReportHealth":     clientStream,
		},
	},
	{
		service: "nstance.v1.OperatorService",
		desc:    &nstancev1.OperatorService_ServiceDesc,
		rpcs: map[string]rpcKind{
			"GetConfigStatus":      unary,
			"RefreshConfig":        unary,
			"ListGroups":           unary,
			"UpsertGroup":          unary,
			"DeleteGroup":          unary,
			"CreateInstance":       unary,
			"DeleteInstance":       unary,
			"DescribeInstanceType": unary,
			"GetInstanceStatus":    unary,
			"ListInstances":        unary,
			"AcknowledgeDrained":   unary,
			"WatchGroups":          serverStream,
			"WatchInstances":       serverStream,
			"WatchErrors":          serverStream,
			"RenewCertificate":     unary,
			"ListOperators":        unary,
			"ListRevocations":      unary,
			"Revoke":               unary,
		},
	},
}

func TestServicesHaveExactRPCSet(t *testing.T) {
	for _, tt := range wantServices {
		t.Run(tt.service, func(t *testing.T) {
			d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(tt.service))
			require.NoError(t, err)
			sd, ok := d.(protoreflect.ServiceDescriptor)
			require.True(t, ok, "%s is not a service", tt.service)

			got := map[string]rpcKind{}
			for i := 0; i < sd.Methods().Len(); i++ {
				md := sd.Methods().Get(i)
				got[string(md.Name())] = kindOf(md)
			}
			require.Equal(t, tt.rpcs, got)

			// The generated gRPC descriptor must agree with the proto descriptor.
			require.Equal(t, tt.service, tt.desc.ServiceName)
			grpcRPCs := map[string]rpcKind{}
			for _, m := range tt.desc.Methods {
				grpcRPCs[m.MethodName] = unary
			}
			for _, s := range tt.desc.Streams {
				k := bidiStream
				if !s.ClientStreams {
					k = serverStream
				} else if !s.ServerStreams {
					k = clientStream
				}
				grpcRPCs[s.StreamName] = k
			}
			require.Equal(t, tt.rpcs, grpcRPCs)
		})
	}
}

func TestPackageDeclaresOnlyKnownServices(t *testing.T) {
	var got, want []string
	protoregistry.GlobalFiles.RangeFilesByPackage(pkgName, func(fd protoreflect.FileDescriptor) bool {
		for i := 0; i < fd.Services().Len(); i++ {
			got = append(got, string(fd.Services().Get(i).FullName()))
		}
		return true
	})
	for _, s := range wantServices {
		want = append(want, s.service)
	}
	sort.Strings(got)
	sort.Strings(want)
	require.Equal(t, want, got)
}

func TestFileOptions(t *testing.T) {
	files := []string{
		"nstance/v1/agent.proto",
		"nstance/v1/common.proto",
		"nstance/v1/group.proto",
		"nstance/v1/instance.proto",
		"nstance/v1/operator.proto",
		"nstance/v1/registration.proto",
	}
	var registered []string
	protoregistry.GlobalFiles.RangeFilesByPackage(pkgName, func(fd protoreflect.FileDescriptor) bool {
		registered = append(registered, fd.Path())
		return true
	})
	sort.Strings(registered)
	require.Equal(t, files, registered)

	for _, path := range files {
		t.Run(path, func(t *testing.T) {
			fd, err := protoregistry.GlobalFiles.FindFileByPath(path)
			require.NoError(t, err)
			fdp := protodesc.ToFileDescriptorProto(fd)
			require.Equal(t, "proto3", fdp.GetSyntax())
			require.Equal(t, pkgName, fdp.GetPackage())
			require.Equal(t, "github.com/nstance-dev/nstance/pkg/proto/nstance/v1;nstancev1", fdp.GetOptions().GetGoPackage())
		})
	}
}
