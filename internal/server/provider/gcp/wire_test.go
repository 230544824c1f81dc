package gcp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sort"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/gcp"
	"github.com/nstance-dev/nstance/internal/server/provider/gcp/fake"
)

// The wire tests run the provider, the alias holder and the instance
// group calls on the real cloud.google.com/go/compute REST clients against
// an httptest server that plays Compute Engine's REST API over the
// stateful fake (fake.REST): URL paths, verbs, query parameters, the
// resources' JSON both ways, zone operations polled to DONE and googleapi
// error bodies all run.

func noAuth() []option.ClientOption {
	return []option.ClientOption{option.WithoutAuthentication()}
}

func wireClient(t *testing.T) (*gcp.Client, *fake.Compute, *fake.REST) {
	t.Helper()
	gce := fake.New()
	rest := fake.NewREST(gce)
	srv := httptest.NewServer(rest)
	t.Cleanup(srv.Close)
	c, err := gcp.NewClient(context.Background(), option.WithEndpoint(srv.URL), option.WithoutAuthentication(), option.WithHTTPClient(srv.Client()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c, gce, rest
}

func TestWire(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, gce, rest := wireClient(t)
	cfg := testConfig()
	o := testOptions()
	p := gcp.New(client, *o, provider.Env{Config: func() *config.Config { return cfg }})

	t.Run("create, list, status, delete", func(t *testing.T) {
		inst, err := p.Create(ctx, request("web-0a1b2c3d", "web"))
		require.NoError(t, err)
		require.Equal(t, provider.StateRunning, inst.State)
		require.Equal(t, provider.ID("c1", "s1", "web-0a1b2c3d"), inst.ProviderID)
		in := gce.Inserts()[0].GetInstanceResource()
		require.Equal(t, "zones/"+zone+"/machineTypes/e2-standard-2", in.GetMachineType())
		require.Equal(t, "c1", in.GetLabels()[gcp.LabelCluster])
		require.Contains(t, gcp.Meta(in, gcp.MetaUserData), "#!/bin/sh")

		again, err := p.Create(ctx, request("web-0a1b2c3d", "web"))
		require.NoError(t, err, "409 from the wire is the idempotent create")
		require.Equal(t, inst, again)

		req := request("web-11111111", "web")
		req.Args = map[string]string{gcp.ArgProvisioningModel: gcp.ProvisioningSpot}
		_, err = p.Create(ctx, req)
		require.NoError(t, err)
		list, err := p.List(ctx)
		require.NoError(t, err)
		require.Len(t, list, 2)
		require.Contains(t, list[1].Message, "spot")

		require.NoError(t, p.Delete(ctx, "web-11111111"))
		_, err = p.Status(ctx, "web-11111111")
		require.ErrorIs(t, err, provider.ErrNotFound, "a 404 over the wire is not found")

		gce.Fail("InsertInstance", http.StatusForbidden)
		_, err = p.Create(ctx, request("web-22222222", "web"))
		require.Equal(t, http.StatusForbidden, gcp.HTTPCode(err))
	})

	t.Run("alias IP moves", func(t *testing.T) {
		gce.AddAddress(region, "shard-leader", "10.0.0.10")
		holder := func(name string) *gcp.AliasIP {
			gce.PutInstance(zone, &computepb.Instance{Name: proto.String(name), NetworkInterfaces: []*computepb.NetworkInterface{
				{Name: proto.String("nic0"), Fingerprint: proto.String("fp-" + name)}}})
			return &gcp.AliasIP{API: client, Project: fake.Project, Region: region, Address: "shard-leader", Zone: zone, Instance: name,
				Backoff: wait.Backoff{Duration: time.Millisecond, Cap: 5 * time.Millisecond}, Log: logr.Discard()}
		}
		a, b := holder("server-a"), holder("server-b")
		require.NoError(t, a.Acquire(ctx))
		require.Equal(t, []string{"server-a"}, holders(gce, "10.0.0.10/32"))
		gce.Fail("UpdateNetworkInterface", http.StatusPreconditionFailed)
		require.NoError(t, b.Acquire(ctx))
		require.Equal(t, []string{"server-b"}, holders(gce, "10.0.0.10/32"))
		require.NoError(t, b.Release(ctx))
		require.Empty(t, holders(gce, "10.0.0.10/32"))
	})

	t.Run("unmanaged instance group", func(t *testing.T) {
		gce.AddGroup(zone, "www")
		url := fake.InstanceURL(zone, "web-0a1b2c3d")
		add := &computepb.AddInstancesInstanceGroupRequest{Project: fake.Project, Zone: zone, InstanceGroup: "www",
			InstanceGroupsAddInstancesRequestResource: &computepb.InstanceGroupsAddInstancesRequest{Instances: []*computepb.InstanceReference{{Instance: &url}}}}
		require.NoError(t, client.AddInstances(ctx, add))
		members, err := client.ListGroupInstances(ctx, &computepb.ListInstancesInstanceGroupsRequest{Project: fake.Project, Zone: zone, InstanceGroup: "www"})
		require.NoError(t, err)
		require.Len(t, members, 1)
		require.Equal(t, url, members[0].GetInstance())
		require.Equal(t, http.StatusBadRequest, gcp.HTTPCode(client.AddInstances(ctx, add)), "memberAlreadyExists")
		require.NoError(t, client.RemoveInstances(ctx, &computepb.RemoveInstancesInstanceGroupRequest{Project: fake.Project, Zone: zone, InstanceGroup: "www",
			InstanceGroupsRemoveInstancesRequestResource: &computepb.InstanceGroupsRemoveInstancesRequest{Instances: []*computepb.InstanceReference{{Instance: &url}}}}))
		require.Empty(t, gce.GroupMembers(zone, "www"))
	})

	require.Empty(t, rest.Problems())
	// Every REST method the API can call went over the wire, and their
	// permissions are the custom role's (deploy/gcp, internal/packaging).
	var seen, want []string
	for m := range rest.Seen() {
		seen = append(seen, m)
	}
	for _, m := range gcp.APIMethods() {
		want = append(want, gcp.RESTMethods[m])
	}
	want = append(want, "zoneOperations.get")
	sort.Strings(seen)
	sort.Strings(want)
	require.Equal(t, want, seen)
	perms := map[string]bool{}
	for _, m := range seen {
		for _, p := range gcp.Permissions[m] {
			perms[p] = true
		}
	}
	var got []string
	for p := range perms {
		got = append(got, p)
	}
	sort.Strings(got)
	require.Equal(t, gcp.IAMPermissions(), got)
}
