package shardtest_test

import (
	"context"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/server/provider/gcp"
	gcpfake "github.com/nstance-dev/nstance/internal/server/provider/gcp/fake"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

// killed is a leader address holder whose Release never reaches the
// cloud, as for a server killed while leading.
type killed struct{ *gcp.AliasIP }

func (killed) Release(context.Context) error { return nil }

// TestLeaderChangeMovesTheGCPAliasIP: two servers of one shard, each with
// the gcp alias IP holder of its own VM on the Compute Engine fake. The
// first leads and carries the reserved address; the second, a standby,
// does not take it (its release at start leaves the leader's alone). The
// leader goes away without releasing (killed); the standby wins the
// election and takes the address off the old leader's interface onto its
// own before it serves.
func TestLeaderChangeMovesTheGCPAliasIP(t *testing.T) {
	const zone, region = "europe-west4-a", "europe-west4"
	gce := gcpfake.New()
	gce.AddAddress(region, "shard-leader", "10.0.0.10")
	holder := func(name string) *gcp.AliasIP {
		gce.PutInstance(zone, &computepb.Instance{Name: proto.String(name), NetworkInterfaces: []*computepb.NetworkInterface{
			{Name: proto.String("nic0"), Fingerprint: proto.String("fp-" + name)}}})
		return &gcp.AliasIP{API: gce, Project: gcpfake.Project, Region: region, Address: "shard-leader", Zone: zone, Instance: name,
			Backoff: wait.Backoff{Duration: 5 * time.Millisecond, Cap: 50 * time.Millisecond}, Log: logr.Discard()}
	}
	carrier := func() []string {
		var out []string
		for _, i := range gce.Instances() {
			for _, r := range i.GetNetworkInterfaces()[0].GetAliasIpRanges() {
				if r.GetIpCidrRange() == "10.0.0.10/32" {
					out = append(out, i.GetName())
				}
			}
		}
		return out
	}
	store := memstore.New()
	a := shardtest.Start(t, shardtest.Options{Store: store, ServerID: "server-a", LeaderAddress: killed{holder("server-a")}})
	require.Equal(t, []string{"server-a"}, carrier(), "the leader carries the address")

	b := shardtest.Start(t, shardtest.Options{Store: store, ServerID: "server-b", LeaderAddress: holder("server-b"), Standby: true})
	require.False(t, b.App.ServingGRPC())
	require.Equal(t, []string{"server-a"}, carrier(), "the standby leaves the leader's address alone")

	a.Stop()
	require.Eventually(t, b.App.ServingGRPC, 30*time.Second, 10*time.Millisecond, "the standby takes over")
	require.Equal(t, []string{"server-b"}, carrier(), "the address moved before the new leader served")
	require.Positive(t, gce.Calls("UpdateNetworkInterface"))
}
