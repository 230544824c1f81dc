package shardgroup

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func TestDesiredSpec(t *testing.T) {
	sg := &infrav1.NstanceShardGroup{Spec: infrav1.NstanceShardGroupSpec{
		Group: "web", Shard: "a", Size: 3, Template: "worker", InstanceType: "m7i.large", SubnetPool: "private",
		Vars: map[string]string{"k": "v"}, DrainTimeout: &metav1.Duration{Duration: time.Minute},
	}}
	got := DesiredSpec(sg)
	require.Equal(t, "web", got.GetGroupId())
	require.Equal(t, uint32(3), got.GetSize())
	require.Equal(t, "m7i.large", got.GetInstanceType())
	require.Equal(t, map[string]string{"k": "v"}, got.GetVars())
	require.Equal(t, time.Minute, got.GetDrainTimeout().AsDuration())
	sg.Spec.Vars["k"] = "changed"
	require.Equal(t, "v", got.GetVars()["k"], "spec does not alias the object")
}

func TestSpecMatches(t *testing.T) {
	base := func() *nstancev1.GroupSpec {
		return &nstancev1.GroupSpec{GroupId: "g", Size: 2, Template: "worker", Vars: map[string]string{"a": "1"}, DrainTimeout: durationpb.New(time.Second)}
	}
	tests := []struct {
		name   string
		mutate func(desired, server *nstancev1.GroupSpec)
		want   bool
	}{
		{"equal", func(_, _ *nstancev1.GroupSpec) {}, true},
		{"size differs", func(_, s *nstancev1.GroupSpec) { s.Size = 3 }, false},
		{"template differs", func(_, s *nstancev1.GroupSpec) { s.Template = "gpu" }, false},
		{"server defaulted instance type", func(_, s *nstancev1.GroupSpec) { s.InstanceType = "test.small" }, true},
		{"instance type wanted", func(d, _ *nstancev1.GroupSpec) { d.InstanceType = "big" }, false},
		{"vars differ", func(_, s *nstancev1.GroupSpec) { s.Vars = map[string]string{"a": "2"} }, false},
		{"drain differs", func(_, s *nstancev1.GroupSpec) { s.DrainTimeout = durationpb.New(time.Hour) }, false},
		{"no desired drain", func(d, s *nstancev1.GroupSpec) { d.DrainTimeout = nil; s.DrainTimeout = durationpb.New(time.Hour) }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, s := base(), base()
			tt.mutate(d, s)
			require.Equal(t, tt.want, SpecMatches(d, s))
		})
	}
	require.False(t, SpecMatches(base(), nil))
}

func TestErrorClasses(t *testing.T) {
	require.True(t, unreachable(status.Error(codes.Unavailable, "x")))
	require.True(t, unreachable(status.Error(codes.DeadlineExceeded, "x")))
	require.False(t, unreachable(status.Error(codes.InvalidArgument, "x")))
	require.True(t, rejected(status.Error(codes.InvalidArgument, "x")))
	require.True(t, rejected(status.Error(codes.FailedPrecondition, "static group")))
	require.False(t, rejected(status.Error(codes.Internal, "x")))
}
