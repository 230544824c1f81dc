package gcp_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/server/provider/gcp"
	"github.com/nstance-dev/nstance/internal/server/provider/gcp/fake"
)

const region = "europe-west4"

func server(gce *fake.Compute, name string) *gcp.AliasIP {
	gce.PutInstance(zone, &computepb.Instance{Name: proto.String(name), NetworkInterfaces: []*computepb.NetworkInterface{
		{Name: proto.String("nic0"), NetworkIP: proto.String("10.0.0.2"), Fingerprint: proto.String("fp-" + name)}}})
	return &gcp.AliasIP{API: gce, Project: fake.Project, Region: region, Address: "shard-leader", Zone: zone, Instance: name,
		Backoff: wait.Backoff{Duration: time.Millisecond, Factor: 1.5, Cap: 5 * time.Millisecond}, Log: logr.Discard()}
}

// holders returns the instances whose nic0 carries the range.
func holders(gce *fake.Compute, cidr string) []string {
	var out []string
	for _, i := range gce.Instances() {
		for _, ni := range i.GetNetworkInterfaces() {
			for _, r := range ni.GetAliasIpRanges() {
				if r.GetIpCidrRange() == cidr {
					out = append(out, i.GetName())
				}
			}
		}
	}
	return out
}

// TestAliasIPMovesToTheLeader: the address follows Acquire from one
// server to the other, a previous holder that never released (killed) is
// forced off, a fingerprint race and a transient error are retried, and
// Release leaves the address with nobody.
func TestAliasIPMovesToTheLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gce := fake.New()
	gce.AddAddress(region, "shard-leader", "10.0.0.10")
	a, b := server(gce, "server-a"), server(gce, "server-b")

	require.NoError(t, a.Release(ctx), "releasing what is not held is done")
	require.NoError(t, a.Acquire(ctx))
	require.Equal(t, []string{"server-a"}, holders(gce, "10.0.0.10/32"))
	require.NoError(t, a.Acquire(ctx), "acquiring again changes nothing")
	calls := gce.Calls("UpdateNetworkInterface")

	// server-a is killed without a release; server-b takes over, one
	// fingerprint race and one unavailable answer on the way.
	gce.Fail("UpdateNetworkInterface", http.StatusPreconditionFailed, http.StatusServiceUnavailable)
	require.NoError(t, b.Acquire(ctx))
	require.Equal(t, []string{"server-b"}, holders(gce, "10.0.0.10/32"))
	require.Equal(t, calls+4, gce.Calls("UpdateNetworkInterface"), "two failures, off server-a, on server-b")

	// The old leader's release at its restart leaves the new one alone.
	require.NoError(t, a.Release(ctx))
	require.Equal(t, []string{"server-b"}, holders(gce, "10.0.0.10/32"))
	require.NoError(t, b.Release(ctx))
	require.Empty(t, holders(gce, "10.0.0.10/32"))
}

func TestAliasIPKeepsOtherRanges(t *testing.T) {
	ctx := context.Background()
	gce := fake.New()
	gce.AddAddress(region, "shard-leader", "10.0.0.10")
	gce.PutInstance(zone, &computepb.Instance{Name: proto.String("server-a"), NetworkInterfaces: []*computepb.NetworkInterface{
		{Name: proto.String("nic0"), Fingerprint: proto.String("fp"), AliasIpRanges: []*computepb.AliasIpRange{
			{IpCidrRange: proto.String("10.8.0.0/24"), SubnetworkRangeName: proto.String("pods")}}}}})
	a := &gcp.AliasIP{API: gce, Project: fake.Project, Region: region, Address: "shard-leader", Zone: zone, Instance: "server-a",
		Backoff: wait.Backoff{Duration: time.Millisecond, Cap: time.Millisecond}, Log: logr.Discard()}
	require.NoError(t, a.Acquire(ctx))
	require.Equal(t, []string{"server-a"}, holders(gce, "10.8.0.0/24"), "the pod range stays")
	require.NoError(t, a.Release(ctx))
	require.Equal(t, []string{"server-a"}, holders(gce, "10.8.0.0/24"))
	require.Empty(t, holders(gce, "10.0.0.10/32"))
}

func TestAliasIPFatalErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	gce := fake.New()
	a := server(gce, "server-a")
	err := a.Acquire(ctx)
	require.Error(t, err, "no such address")
	require.True(t, gcp.NotFound(err))
	require.NoError(t, ctx.Err(), "failed at once, not at the deadline")

	gce.AddAddress(region, "shard-leader", "10.0.0.10")
	a.Interface = "nic1"
	require.ErrorContains(t, a.Acquire(ctx), "no such network interface")
	require.NoError(t, ctx.Err())
}

func TestParseInstanceURL(t *testing.T) {
	z, n, ok := gcp.ParseInstanceURL("https://www.googleapis.com/compute/v1/projects/p/zones/europe-west4-a/instances/server-a")
	require.True(t, ok)
	require.Equal(t, "europe-west4-a", z)
	require.Equal(t, "server-a", n)
	_, _, ok = gcp.ParseInstanceURL("projects/p/regions/r/addresses/x")
	require.False(t, ok)
}

func TestNewAliasIPParsesTheAddressPath(t *testing.T) {
	a, err := gcp.NewAliasIP(context.Background(), gcp.AliasConfig{Address: "projects/p-123456/regions/europe-west4/addresses/leader",
		Zone: zone, Instance: "server-a", Endpoint: "http://127.0.0.1:1"}, noAuth()...)
	require.NoError(t, err)
	require.Equal(t, "p-123456", a.Project)
	require.Equal(t, "europe-west4", a.Region)
	require.Equal(t, "leader", a.Address)
	a2, err := gcp.NewAliasIP(context.Background(), gcp.AliasConfig{Address: "leader", Project: "p-123456", Zone: zone,
		Instance: "server-a", Endpoint: "http://127.0.0.1:1"}, noAuth()...)
	require.NoError(t, err)
	require.Equal(t, region, a2.Region, "the region of the zone")
}
