package shardtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/pkg/objstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

type watchers struct {
	groups    *collector[*nstancev1.GroupEvent]
	instances *collector[*nstancev1.InstanceEvent]
}

func watch(t *testing.T, c nstancev1.OperatorServiceClient) watchers {
	ctx := ctxT(t)
	gs, err := c.WatchGroups(ctx, &nstancev1.WatchGroupsRequest{})
	require.NoError(t, err)
	_, err = gs.Header()
	require.NoError(t, err)
	is, err := c.WatchInstances(ctx, &nstancev1.WatchInstancesRequest{})
	require.NoError(t, err)
	_, err = is.Header()
	require.NoError(t, err)
	return watchers{groups: collect(t, gs.Recv), instances: collect(t, is.Recv)}
}

func TestTwoWatchersOfATenantSeeEverythingOtherTenantsNothing(t *testing.T) {
	sh := shardtest.Start(t, shardtest.Options{})
	acme1, acme2, other := sh.Client(t, "acme"), sh.Client(t, "acme"), sh.Client(t, "globex")
	ctx := ctxT(t)

	// A group that exists before the watchers connect arrives as a snapshot.
	upsert(t, acme1, "early", 1, 0)
	waitGroup(t, acme1, "early", 1)

	ws := []watchers{watch(t, acme1), watch(t, acme2)}
	wo := watch(t, other)
	for _, w := range ws {
		ev := w.groups.next(t, 5*time.Second, func(e *nstancev1.GroupEvent) bool { return e.GetGroupId() == "early" })
		require.True(t, ev.GetSnapshot())
		require.Equal(t, nstancev1.GroupEventType_GROUP_EVENT_TYPE_UPSERT, ev.GetType())
		require.Equal(t, uint32(1), ev.GetGroup().GetActualSize())
	}

	upsert(t, acme1, "web", 2, 0)
	g := waitGroup(t, acme1, "web", 2)
	resp, err := acme1.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: instanceID(g.GetProviderIds()[0]), SkipDrain: false})
	require.NoError(t, err)
	victim := resp.GetInstance().GetInstanceId()
	require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION, resp.GetInstance().GetState())
	_, err = acme2.AcknowledgeDrained(ctx, &nstancev1.AcknowledgeDrainedRequest{InstanceId: victim})
	require.NoError(t, err)
	_, err = acme2.DeleteGroup(ctx, &nstancev1.DeleteGroupRequest{GroupId: "early"})
	require.NoError(t, err)

	for i, w := range ws {
		// web's pass may publish after early's deletion (it runs on its own).
		w.groups.each(t, 5*time.Second, func(e *nstancev1.GroupEvent) bool {
			return e.GetGroupId() == "web" && !e.GetSnapshot() && e.GetGroup().GetActualSize() == 2 && e.GetGroup().GetReadyCount() == 2
		}, func(e *nstancev1.GroupEvent) bool {
			return e.GetGroupId() == "early" && e.GetType() == nstancev1.GroupEventType_GROUP_EVENT_TYPE_DELETE
		})
		for _, st := range []nstancev1.InstanceEventStatus{
			nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION,
			nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETING,
			nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED,
		} {
			ev := w.instances.next(t, 5*time.Second, func(e *nstancev1.InstanceEvent) bool { return e.GetInstanceId() == victim && e.GetStatus() == st })
			require.Equal(t, nstancev1.DeletionReason_DELETION_REASON_ON_DEMAND_DELETE, ev.GetReason(), "watcher %d", i)
			require.Equal(t, "test-1", ev.GetShard())
		}
	}
	// The replacement brings web back to two.
	waitGroup(t, acme1, "web", 2)

	wo.groups.none(t, 300*time.Millisecond, func(*nstancev1.GroupEvent) bool { return true })
	wo.instances.none(t, 10*time.Millisecond, func(*nstancev1.InstanceEvent) bool { return true })
	list, err := other.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
	require.NoError(t, err)
	require.Empty(t, list.GetGroups())
	_, err = other.GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: instanceID(g.GetProviderIds()[1])}})
	require.Equal(t, codes.NotFound, status.Code(err), "another tenant's instance is invisible")
	_, err = other.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: instanceID(g.GetProviderIds()[1])})
	require.Equal(t, codes.NotFound, status.Code(err))
	_, err = other.DeleteGroup(ctx, &nstancev1.DeleteGroupRequest{GroupId: "web"})
	require.Equal(t, codes.NotFound, status.Code(err))
	waitGroup(t, acme1, "web", 2)
}

func TestRefreshConfigOutcomes(t *testing.T) {
	sh := shardtest.Start(t, shardtest.Options{})
	// RefreshConfig is an admin action; an admin may do what an operator does for its tenant.
	c := sh.AdminClient(t, "default")
	ctx := ctxT(t)
	_, err := sh.Client(t, "default").RefreshConfig(ctx, &nstancev1.RefreshConfigRequest{})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "an operator may not refresh the shard config: %v", err)
	// Config errors go to the admin's tenant only.
	otherErrs, err := sh.Client(t, "other").WatchErrors(ctx, &nstancev1.WatchErrorsRequest{})
	require.NoError(t, err)
	_, err = otherErrs.Header()
	require.NoError(t, err)
	otherEvents := collect(t, otherErrs.Recv)
	key := sh.Keys.Config(sh.ShardID)
	before, err := c.GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
	require.NoError(t, err)
	require.NotEmpty(t, before.GetEtag())
	defer otherEvents.none(t, 500*time.Millisecond, func(*nstancev1.ErrorEvent) bool { return true })
	require.NotNil(t, before.GetLastModified())

	res, err := c.RefreshConfig(ctx, &nstancev1.RefreshConfigRequest{})
	require.NoError(t, err)
	require.Equal(t, nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_NOT_MODIFIED, res.GetOutcome())

	errs, err := c.WatchErrors(ctx, &nstancev1.WatchErrorsRequest{})
	require.NoError(t, err)
	_, err = errs.Header()
	require.NoError(t, err)
	errEvents := collect(t, errs.Recv)

	invalid := []struct {
		name, body, key string
	}{
		{"unknown template in static group", `{"cluster":{"id":"test-cluster"},"shard":{"id":"test-1","infra":{"provider":"mock"},"bind":{"health_addr":"127.0.0.1:0","election_addr":"127.0.0.1:0","registration_addr":"127.0.0.1:0","operator_addr":"127.0.0.1:0","agent_addr":"127.0.0.1:0"}},"groups":{"default":{"g":{"template":"nope","size":1}}}}`, "groups.default.g.template"},
		{"shard id changed", shardtest.Config("test-cluster", "test-2", "mock"), "shard.id"},
		{"not JSON", `{"cluster": `, ""},
	}
	for _, tc := range invalid {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sh.Store.Put(ctx, key, []byte(tc.body), objstore.PutOptions{})
			require.NoError(t, err)
			res, err := c.RefreshConfig(ctx, &nstancev1.RefreshConfigRequest{})
			require.NoError(t, err)
			require.Equal(t, nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_INVALID, res.GetOutcome(), res.GetMessage())
			require.Equal(t, before.GetEtag(), res.GetEtag(), "running config unchanged")
			require.NotEmpty(t, res.GetValidationErrors())
			if tc.key != "" {
				var keys []string
				for _, ve := range res.GetValidationErrors() {
					keys = append(keys, ve.GetKey())
				}
				require.Contains(t, keys, tc.key)
			}
			st, err := c.GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
			require.NoError(t, err)
			require.Equal(t, before.GetEtag(), st.GetEtag())
			errEvents.next(t, 5*time.Second, func(e *nstancev1.ErrorEvent) bool {
				return e.GetSource() == nstancev1.ErrorSource_ERROR_SOURCE_CONFIG
			})
		})
	}
	// The server keeps working with the old config.
	upsert(t, c, "still-works", 1, 0)
	waitGroup(t, c, "still-works", 1)

	// A valid change with a static group is applied and reconciled.
	good := shardtest.Config("test-cluster", "test-1", "mock")
	good = good[:len(good)-len(`  "groups": {},
}`)] + `  "groups": { "default": { "static-web": { "template": "worker", "size": 2 } } },
}`
	_, err = sh.Store.Put(ctx, key, []byte(good), objstore.PutOptions{})
	require.NoError(t, err)
	res, err = c.RefreshConfig(ctx, &nstancev1.RefreshConfigRequest{})
	require.NoError(t, err)
	require.Equal(t, nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_UPDATED, res.GetOutcome(), res.GetMessage())
	require.NotEqual(t, before.GetEtag(), res.GetEtag())
	require.Equal(t, before.GetEtag(), res.GetPreviousEtag())
	g := waitGroup(t, c, "static-web", 2)
	require.True(t, g.GetStatic())
	_, err = c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "static-web", Template: "worker", Size: 5}})
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "static groups are read-only")
	_, err = c.DeleteGroup(ctx, &nstancev1.DeleteGroupRequest{GroupId: "static-web"})
	require.Equal(t, codes.FailedPrecondition, status.Code(err))

	require.NoError(t, sh.Store.Delete(ctx, key))
	res, err = c.RefreshConfig(ctx, &nstancev1.RefreshConfigRequest{})
	require.NoError(t, err)
	require.Equal(t, nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_STORAGE_ERROR, res.GetOutcome())
	waitGroup(t, c, "static-web", 2)
}

func TestBadRequestsGetClearStatusesAndLoseNothing(t *testing.T) {
	sh := shardtest.Start(t, shardtest.Options{})
	c := sh.Client(t, "default")
	ctx := ctxT(t)
	g := upsert(t, c, "keep", 1, 0)
	waitGroup(t, c, "keep", 1)
	tests := []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"upsert without spec", func() error { _, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{}); return err }, codes.InvalidArgument},
		{"unknown template", func() error {
			_, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "x", Template: "nope", Size: 1}})
			return err
		}, codes.InvalidArgument},
		{"path in group id", func() error {
			_, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "../etc", Template: "worker", Size: 1}})
			return err
		}, codes.InvalidArgument},
		{"huge size", func() error {
			_, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "big", Template: "worker", Size: 1 << 30}})
			return err
		}, codes.InvalidArgument},
		{"unknown subnet pool", func() error {
			_, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "x", Template: "worker", SubnetPool: "nope"}})
			return err
		}, codes.InvalidArgument},
		{"stale etag", func() error {
			_, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "keep", Template: "worker", Size: 3}, ExpectedEtag: "d-stale"})
			return err
		}, codes.Aborted},
		{"delete unknown group", func() error { _, err := c.DeleteGroup(ctx, &nstancev1.DeleteGroupRequest{GroupId: "nope"}); return err }, codes.NotFound},
		{"delete without id", func() error { _, err := c.DeleteGroup(ctx, &nstancev1.DeleteGroupRequest{}); return err }, codes.InvalidArgument},
		{"instance lookup without key", func() error { _, err := c.GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{}); return err }, codes.InvalidArgument},
		{"unknown instance", func() error {
			_, err := c.AcknowledgeDrained(ctx, &nstancev1.AcknowledgeDrainedRequest{InstanceId: "nope-00000000"})
			return err
		}, codes.NotFound},
		{"ack a running instance", func() error {
			_, err := c.AcknowledgeDrained(ctx, &nstancev1.AcknowledgeDrainedRequest{InstanceId: instanceID(group(t, c, "keep").GetProviderIds()[0])})
			return err
		}, codes.Aborted},
		{"create without template", func() error { _, err := c.CreateInstance(ctx, &nstancev1.CreateInstanceRequest{}); return err }, codes.InvalidArgument},
		{"create in unknown group", func() error {
			_, err := c.CreateInstance(ctx, &nstancev1.CreateInstanceRequest{GroupId: "nope"})
			return err
		}, codes.NotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			require.Equal(t, tc.code, status.Code(err), "%v", err)
			require.NotEmpty(t, status.Convert(err).Message())
		})
	}
	after := waitGroup(t, c, "keep", 1)
	require.Equal(t, g.GetEtag(), after.GetEtag(), "rejected requests changed nothing")
	require.Len(t, group(t, c, "keep").GetProviderIds(), 1)
	resp, err := c.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
	require.NoError(t, err)
	require.Len(t, resp.GetGroups(), 1)

	// An agent certificate may not use the Operator service.
	agentConn := agentClient(t, sh)
	_, err = agentConn.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
	require.Equal(t, codes.PermissionDenied, status.Code(err))
}

func TestOnDemandInstanceIdempotentAndProviderErrorsRetried(t *testing.T) {
	p := mock.New()
	failures := 2
	p.FailCreate(func(provider.CreateRequest) error {
		if failures > 0 {
			failures--
			return errors.New("simulated capacity error")
		}
		return nil
	})
	sh := shardtest.Start(t, shardtest.Options{Provider: p})
	c := sh.Client(t, "default")
	ctx := ctxT(t)
	es, err := c.WatchErrors(ctx, &nstancev1.WatchErrorsRequest{Sources: []nstancev1.ErrorSource{nstancev1.ErrorSource_ERROR_SOURCE_PROVIDER}})
	require.NoError(t, err)
	_, err = es.Header()
	require.NoError(t, err)
	errEvents := collect(t, es.Recv)

	req := &nstancev1.CreateInstanceRequest{Template: "worker", ClientToken: "tok-1", Vars: map[string]string{"role": "gpu"}}
	first, err := c.CreateInstance(ctx, req)
	require.NoError(t, err)
	second, err := c.CreateInstance(ctx, req)
	require.NoError(t, err)
	require.Equal(t, first.GetInstance().GetInstanceId(), second.GetInstance().GetInstanceId(), "same token, same instance")
	ev := errEvents.next(t, 5*time.Second, func(*nstancev1.ErrorEvent) bool { return true })
	require.Contains(t, ev.GetMessage(), "simulated capacity error")
	require.Equal(t, first.GetInstance().GetInstanceId(), ev.GetInstanceId())
	require.Eventually(t, func() bool {
		st, err := c.GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_ClientToken{ClientToken: "tok-1"}})
		return err == nil && st.GetInstance().GetState() == nstancev1.InstanceState_INSTANCE_STATE_RUNNING
	}, 10*time.Second, 20*time.Millisecond, "creation retried with backoff until it succeeded")
	cr, ok := p.Request(first.GetInstance().GetInstanceId())
	require.True(t, ok)
	require.Equal(t, "gpu", cr.Vars["role"], "request vars override the template's")
	require.Equal(t, "test", cr.Vars["environment"], "config defaults are merged in")
	require.NotEmpty(t, cr.AgentNonce, "a nonce was minted for the agent")
	require.Contains(t, string(cr.CACertPEM), "BEGIN CERTIFICATE")
	creates, _ := p.Counts()
	require.Equal(t, 1, creates)
	_, err = c.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: first.GetInstance().GetInstanceId(), SkipDrain: true})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := c.GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: first.GetInstance().GetInstanceId()}})
		return status.Code(err) == codes.NotFound
	}, 5*time.Second, 20*time.Millisecond)
	list, _ := p.List(context.Background())
	require.Empty(t, list)
}

// A watcher that connects after an instance went pending-deletion (an
// operator restart, a stream reconnect) still learns about the drain, with
// its deadline; once acknowledged it is no longer re-announced.
func TestWatchInstancesReannouncesPendingDrains(t *testing.T) {
	sh := shardtest.Start(t, shardtest.Options{})
	c := sh.Client(t, "acme")
	ctx := ctxT(t)
	upsert(t, c, "web", 2, 30*time.Second)
	g := waitGroup(t, c, "web", 2)
	victim := instanceID(g.GetProviderIds()[0])
	resp, err := c.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: victim})
	require.NoError(t, err)
	require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION, resp.GetInstance().GetState())

	tests := []struct {
		name   string
		tenant string
		want   bool
	}{
		{"same tenant sees the pending drain", "acme", true},
		{"other tenant sees nothing", "globex", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := watch(t, sh.Client(t, tc.tenant))
			match := func(e *nstancev1.InstanceEvent) bool {
				return e.GetInstanceId() == victim && e.GetStatus() == nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION
			}
			if !tc.want {
				w.instances.none(t, 300*time.Millisecond, match)
				return
			}
			ev := w.instances.next(t, 5*time.Second, match)
			require.Equal(t, g.GetProviderIds()[0], ev.GetProviderId())
			require.Equal(t, resp.GetInstance().GetDrainDeadline().AsTime(), ev.GetDrainDeadline().AsTime())
			require.Equal(t, nstancev1.DeletionReason_DELETION_REASON_ON_DEMAND_DELETE, ev.GetReason())
		})
	}
	_, err = c.AcknowledgeDrained(ctx, &nstancev1.AcknowledgeDrainedRequest{InstanceId: victim})
	require.NoError(t, err)
	w := watch(t, c)
	w.instances.none(t, 300*time.Millisecond, func(e *nstancev1.InstanceEvent) bool {
		return e.GetInstanceId() == victim && e.GetStatus() == nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION
	})
}

func TestListInstancesFiltersByGroupStateAndTenant(t *testing.T) {
	sh := shardtest.Start(t, shardtest.Options{})
	acme, other := sh.Client(t, "acme"), sh.Client(t, "globex")
	ctx := ctxT(t)
	upsert(t, acme, "web", 2, 0)
	upsert(t, acme, "db", 1, 0)
	upsert(t, other, "web", 1, 0)
	web := waitGroup(t, acme, "web", 2)
	waitGroup(t, acme, "db", 1)
	waitGroup(t, other, "web", 1)

	all, err := acme.ListInstances(ctx, &nstancev1.ListInstancesRequest{})
	require.NoError(t, err)
	require.Len(t, all.GetInstances(), 3, "another tenant's instances are never listed")
	for i, in := range all.GetInstances() {
		require.Equal(t, sh.ShardID, in.GetShard())
		require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_RUNNING, in.GetState())
		if i > 0 {
			require.Less(t, all.GetInstances()[i-1].GetInstanceId(), in.GetInstanceId(), "sorted by id")
		}
	}

	webOnly, err := acme.ListInstances(ctx, &nstancev1.ListInstancesRequest{GroupIds: []string{"web"}})
	require.NoError(t, err)
	require.Len(t, webOnly.GetInstances(), 2)
	require.Equal(t, web.GetProviderIds(), []string{webOnly.GetInstances()[0].GetProviderId(), webOnly.GetInstances()[1].GetProviderId()})

	victim := webOnly.GetInstances()[0].GetInstanceId()
	_, err = acme.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: victim})
	require.NoError(t, err)
	pending, err := acme.ListInstances(ctx, &nstancev1.ListInstancesRequest{States: []nstancev1.InstanceState{nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION}})
	require.NoError(t, err)
	require.Len(t, pending.GetInstances(), 1)
	require.Equal(t, victim, pending.GetInstances()[0].GetInstanceId())
	require.NotNil(t, pending.GetInstances()[0].GetDrainDeadline())

	_, err = acme.ListInstances(ctx, &nstancev1.ListInstancesRequest{States: []nstancev1.InstanceState{nstancev1.InstanceState_INSTANCE_STATE_UNSPECIFIED}})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	_, err = acme.ListInstances(ctx, &nstancev1.ListInstancesRequest{States: []nstancev1.InstanceState{99}})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
}
