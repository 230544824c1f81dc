package app

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/leaderaddr"
	"github.com/nstance-dev/nstance/internal/server/provider/aws"
	"github.com/nstance-dev/nstance/internal/server/provider/gcp"
)

// leaderAddressTimeout bounds one Release of the leader address.
const leaderAddressTimeout = 10 * time.Second

// newLeaderAddress builds the holder of the shard's fixed address from
// shard.leader_address. A VIP lives no longer than the shard lease lets
// this server act (the elector's ValidUntil).
func (a *App) newLeaderAddress(la config.LeaderAddress, infra config.Infra) (leaderaddr.Holder, error) {
	if a.o.LeaderAddress != nil {
		return a.o.LeaderAddress, nil
	}
	if ref := a.o.LeaderPod; ref != "" {
		// --leader-pod (NSTANCE_LEADER_POD, set by the nstance-server
		// chart): on Kubernetes the leader labels its pod and the shard's
		// Service selects the label.
		if a.o.LeaderInterfaceID != "" {
			return nil, fmt.Errorf("--leader-pod and --leader-interface: choose one")
		}
		return leaderaddr.NewPodLabel(nil, ref, a.log().WithName("leader-address"))
	}
	if id := a.o.LeaderInterfaceID; id != "" {
		// --leader-interface (NSTANCE_LEADER_ENI, written by the AWS user
		// data of the shard's Auto Scaling group) wins over the config.
		if !config.ValidENIID(id) {
			return nil, fmt.Errorf("--leader-interface %q: want an ENI id (eni-...)", id)
		}
		la.Mode, la.NetworkInterfaceID = config.LeaderAddressAWSENI, id
		if la.DeviceIndex == 0 {
			la.DeviceIndex = 1
		}
	}
	switch la.Mode {
	case "", config.LeaderAddressNone:
		return leaderaddr.None{}, nil
	case config.LeaderAddressVIP:
		until := func() time.Time {
			el := (leaderFence{a: a}).elector()
			if el == nil {
				return time.Time{}
			}
			if st := el.Status(); st.Leading {
				return st.ValidUntil
			}
			return time.Time{}
		}
		return leaderaddr.NewVIP(la.Interface, la.Address, until, a.log().WithName("leader-address"))
	case config.LeaderAddressAWSENI:
		// This instance's id (and the region, unless shard.infra names
		// one) come from the instance metadata service.
		ctx, cancel := context.WithTimeout(context.Background(), leaderAddressTimeout)
		defer cancel()
		region := ""
		if infra.Provider == aws.KindName {
			region = infra.Region
		}
		return aws.NewENI(ctx, aws.ENIConfig{NetworkInterfaceID: la.NetworkInterfaceID, DeviceIndex: int32(la.DeviceIndex),
			Region: region, Log: a.log().WithName("leader-address")})
	case config.LeaderAddressGCPAlias:
		// This instance's project, zone and name come from the metadata
		// server; the project of a bare address name is the gcp
		// provider's, when it runs.
		ctx, cancel := context.WithTimeout(context.Background(), leaderAddressTimeout)
		defer cancel()
		c := gcp.AliasConfig{Address: la.GCPAddress, Log: a.log().WithName("leader-address")}
		if infra.Provider == gcp.KindName {
			c.Region = infra.Region
			if p, ok := infra.Options["project"].(string); ok {
				c.Project = p
			}
			if e, ok := infra.Options["endpoint"].(string); ok {
				c.Endpoint = e
			}
		}
		return gcp.NewAliasIP(ctx, c)
	default:
		return nil, fmt.Errorf("shard.leader_address.mode %q: unknown mode", la.Mode)
	}
}

// releaseLeaderAddress gives the address up, bounded by
// leaderAddressTimeout, logging a failure.
func releaseLeaderAddress(h leaderaddr.Holder, log logr.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), leaderAddressTimeout)
	defer cancel()
	if err := h.Release(ctx); err != nil {
		log.Error(err, "releasing the leader address")
	}
}
