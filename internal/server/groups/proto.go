package groups

import (
	"maps"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// SpecProto returns the group's spec in its wire form.
func (g *Group) SpecProto() *nstancev1.GroupSpec {
	s := &nstancev1.GroupSpec{
		GroupId: g.ID, Template: g.Spec.Template, Size: uint32(g.Spec.Size), InstanceType: g.Spec.InstanceType,
		SubnetPool: g.Spec.SubnetPool, Vars: maps.Clone(g.Spec.Vars), Labels: maps.Clone(g.Spec.Labels),
		UserDataSha256: g.Spec.UserDataSHA256, UserDataFormat: g.Spec.UserDataFormat, Image: g.Spec.Image,
	}
	if g.Spec.DrainTimeout != nil {
		s.DrainTimeout = durationpb.New(*g.Spec.DrainTimeout)
	}
	if r := g.Spec.Rollout; r != (Rollout{}) {
		s.Rollout = &nstancev1.RolloutStrategy{MaxUnavailable: uint32(r.MaxUnavailable), Paused: r.Paused}
		if r.MaxSurge != nil {
			s.Rollout.MaxSurge = proto.Uint32(uint32(*r.MaxSurge))
		}
	}
	return s
}
