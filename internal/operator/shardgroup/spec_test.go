package shardgroup

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/userdata"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func TestDesiredSpec(t *testing.T) {
	sg := &infrav1.NstanceShardGroup{Spec: infrav1.NstanceShardGroupSpec{
		Group: "web", Shard: "a", Size: 3, Template: "worker", InstanceType: "m7i.large", SubnetPool: "private",
		Vars: map[string]string{"k": "v"}, DrainTimeout: &metav1.Duration{Duration: time.Minute},
	}}
	got := DesiredSpec(sg, userdata.Data{})
	require.Equal(t, "web", got.GetGroupId())
	require.Equal(t, uint32(3), got.GetSize())
	require.Equal(t, "m7i.large", got.GetInstanceType())
	require.Equal(t, map[string]string{"k": "v"}, got.GetVars())
	require.Equal(t, time.Minute, got.GetDrainTimeout().AsDuration())
	sg.Spec.Vars["k"] = "changed"
	require.Equal(t, "v", got.GetVars()["k"], "spec does not alias the object")
	sg.Spec.DrainTimeout = &metav1.Duration{}
	require.NotNil(t, DesiredSpec(sg, userdata.Data{}).GetDrainTimeout(), "0 (no drain) is sent, distinct from unset")
	require.Zero(t, DesiredSpec(sg, userdata.Data{}).GetDrainTimeout().AsDuration())
	sg.Spec.DrainTimeout = nil
	require.Nil(t, DesiredSpec(sg, userdata.Data{}).GetDrainTimeout(), "unset: the server's default")
	sg.Spec.DrainTimeout = &metav1.Duration{Duration: time.Minute}
	require.Empty(t, got.GetUserData(), "no bootstrap data: the template's userdata")
	require.Empty(t, got.GetUserDataFormat())

	require.Nil(t, got.GetRollout(), "no budget: the server's defaults")
	require.Empty(t, got.GetImage())

	sg.Spec.Image = "ami-2"
	sg.Spec.Rollout = &infrav1.ShardRollout{}
	require.Nil(t, DesiredSpec(sg, userdata.Data{}).GetRollout(), "an empty budget is the server's default, sent as none")
	sg.Spec.Rollout = &infrav1.ShardRollout{Paused: true}
	require.True(t, proto.Equal(&nstancev1.RolloutStrategy{Paused: true}, DesiredSpec(sg, userdata.Data{}).GetRollout()))
	sg.Spec.Rollout = &infrav1.ShardRollout{MaxSurge: ptr.To[int32](2), MaxUnavailable: 1}
	got = DesiredSpec(sg, userdata.Data{})
	require.True(t, proto.Equal(&nstancev1.RolloutStrategy{MaxSurge: proto.Uint32(2), MaxUnavailable: 1}, got.GetRollout()), "%v", got.GetRollout())
	require.Equal(t, "ami-2", got.GetImage())

	withData := DesiredSpec(sg, userdata.Data{Secret: "boot", Value: []byte("#cloud-config\n"), Format: userdata.FormatIgnition})
	require.Equal(t, []byte("#cloud-config\n"), withData.GetUserData())
	require.Equal(t, userdata.FormatIgnition, withData.GetUserDataFormat())
}

func TestSpecMatches(t *testing.T) {
	data := []byte("#cloud-config\nruncmd: [true]\n")
	base := func() *nstancev1.GroupSpec {
		return &nstancev1.GroupSpec{GroupId: "g", Size: 2, Template: "worker", Vars: map[string]string{"a": "1"}, DrainTimeout: durationpb.New(time.Second)}
	}
	tests := []struct {
		name   string
		mutate func(desired *nstancev1.GroupSpec, server *nstancev1.GroupStatus)
		want   bool
	}{
		{"equal", func(_ *nstancev1.GroupSpec, _ *nstancev1.GroupStatus) {}, true},
		{"size differs", func(_ *nstancev1.GroupSpec, s *nstancev1.GroupStatus) { s.Spec.Size = 3 }, false},
		{"template differs", func(_ *nstancev1.GroupSpec, s *nstancev1.GroupStatus) { s.Spec.Template = "gpu" }, false},
		{"server defaulted instance type", func(_ *nstancev1.GroupSpec, s *nstancev1.GroupStatus) { s.Spec.InstanceType = "test.small" }, true},
		{"instance type wanted", func(d *nstancev1.GroupSpec, _ *nstancev1.GroupStatus) { d.InstanceType = "big" }, false},
		{"vars differ", func(_ *nstancev1.GroupSpec, s *nstancev1.GroupStatus) { s.Spec.Vars = map[string]string{"a": "2"} }, false},
		{"drain differs", func(_ *nstancev1.GroupSpec, s *nstancev1.GroupStatus) {
			s.Spec.DrainTimeout = durationpb.New(time.Hour)
		}, false},
		{"desired no drain (0), server unset", func(d *nstancev1.GroupSpec, s *nstancev1.GroupStatus) {
			d.DrainTimeout, s.Spec.DrainTimeout = durationpb.New(0), nil
		}, false},
		{"desired no drain (0), server 0", func(d *nstancev1.GroupSpec, s *nstancev1.GroupStatus) {
			d.DrainTimeout, s.Spec.DrainTimeout = durationpb.New(0), durationpb.New(0)
		}, true},
		{"no desired drain", func(d *nstancev1.GroupSpec, s *nstancev1.GroupStatus) {
			d.DrainTimeout = nil
			s.Spec.DrainTimeout = durationpb.New(time.Hour)
		}, true},
		{"user data the server holds", func(d *nstancev1.GroupSpec, s *nstancev1.GroupStatus) {
			d.UserData, d.UserDataFormat = data, userdata.FormatCloudConfig
			s.UserDataSha256 = userdata.Hash(data)
		}, true},
		{"user data the server does not hold yet", func(d *nstancev1.GroupSpec, _ *nstancev1.GroupStatus) {
			d.UserData, d.UserDataFormat = data, userdata.FormatCloudConfig
		}, false},
		{"other user data on the server (a new Secret)", func(d *nstancev1.GroupSpec, s *nstancev1.GroupStatus) {
			d.UserData, d.UserDataFormat = data, userdata.FormatCloudConfig
			s.UserDataSha256 = userdata.Hash([]byte("old"))
		}, false},
		{"user data removed", func(_ *nstancev1.GroupSpec, s *nstancev1.GroupStatus) { s.UserDataSha256 = userdata.Hash(data) }, false},
		{"format differs", func(d *nstancev1.GroupSpec, s *nstancev1.GroupStatus) {
			d.UserData, d.UserDataFormat = data, userdata.FormatIgnition
			s.UserDataSha256, s.Spec.UserDataFormat = userdata.Hash(data), userdata.FormatCloudConfig
		}, false},
		{"image wanted", func(d *nstancev1.GroupSpec, _ *nstancev1.GroupStatus) { d.Image = "ami-2" }, false},
		{"image removed", func(_ *nstancev1.GroupSpec, s *nstancev1.GroupStatus) { s.Spec.Image = "ami-1" }, false},
		{"same image", func(d *nstancev1.GroupSpec, s *nstancev1.GroupStatus) { d.Image, s.Spec.Image = "ami-1", "ami-1" }, true},
		{"no desired rollout", func(_ *nstancev1.GroupSpec, s *nstancev1.GroupStatus) {
			s.Spec.Rollout = &nstancev1.RolloutStrategy{Paused: true}
		}, true},
		{"rollout the server holds", func(d *nstancev1.GroupSpec, s *nstancev1.GroupStatus) {
			d.Rollout = &nstancev1.RolloutStrategy{MaxSurge: proto.Uint32(1)}
			s.Spec.Rollout = &nstancev1.RolloutStrategy{MaxSurge: proto.Uint32(1)}
		}, true},
		{"paused on the server, budget wanted", func(d *nstancev1.GroupSpec, s *nstancev1.GroupStatus) {
			d.Rollout = &nstancev1.RolloutStrategy{MaxSurge: proto.Uint32(1)}
			s.Spec.Rollout = &nstancev1.RolloutStrategy{Paused: true}
		}, false},
		{"format not reported", func(d *nstancev1.GroupSpec, s *nstancev1.GroupStatus) {
			d.UserData, d.UserDataFormat = data, userdata.FormatIgnition
			s.UserDataSha256 = userdata.Hash(data)
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, s := base(), &nstancev1.GroupStatus{Spec: base()}
			tt.mutate(d, s)
			require.Equal(t, tt.want, SpecMatches(d, s))
		})
	}
	require.False(t, SpecMatches(base(), nil))
	require.False(t, SpecMatches(base(), &nstancev1.GroupStatus{}))
}

func TestErrorClasses(t *testing.T) {
	require.True(t, unreachable(status.Error(codes.Unavailable, "x")))
	require.True(t, unreachable(status.Error(codes.DeadlineExceeded, "x")))
	require.False(t, unreachable(status.Error(codes.InvalidArgument, "x")))
	require.True(t, rejected(status.Error(codes.InvalidArgument, "x")))
	require.True(t, rejected(status.Error(codes.FailedPrecondition, "static group")))
	require.False(t, rejected(status.Error(codes.Internal, "x")))
}
