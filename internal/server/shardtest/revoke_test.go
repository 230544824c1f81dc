package shardtest_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/agent/identity"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/pkg/objstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// operatorConn is one open connection of an operator, proven to work.
type operatorConn struct {
	tc *tls.Config
	c  nstancev1.OperatorServiceClient
}

func openOperator(t *testing.T, sh *shardtest.Shard, id string) operatorConn {
	t.Helper()
	return openOperatorOf(t, sh, "acme", id)
}

func openOperatorOf(t *testing.T, sh *shardtest.Shard, tenant, id string) operatorConn {
	t.Helper()
	tc, err := sh.OperatorTLS(tenant, pki.RoleOperator, id)
	require.NoError(t, err)
	conn, err := grpc.NewClient(sh.OperatorAddr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	oc := operatorConn{tc: tc, c: nstancev1.NewOperatorServiceClient(conn)}
	_, err = oc.c.GetConfigStatus(ctxT(t), &nstancev1.GetConfigStatusRequest{})
	require.NoError(t, err, "operator %s before revocation", id)
	return oc
}

// openWatch opens a WatchGroups stream and waits until it is subscribed.
func openWatch(t *testing.T, c nstancev1.OperatorServiceClient) *collector[*nstancev1.GroupEvent] {
	t.Helper()
	w, err := c.WatchGroups(ctxT(t), &nstancev1.WatchGroupsRequest{})
	require.NoError(t, err)
	_, err = w.Header()
	require.NoError(t, err)
	return collect(t, w.Recv)
}

// streamEnded waits for the stream to end and returns its error.
func streamEnded[T any](t *testing.T, c *collector[T]) error {
	t.Helper()
	select {
	case err := <-c.err:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("the stream of a revoked certificate is still open")
		return nil
	}
}

// requireRefused checks that tc is refused everywhere: the next RPC on its
// open connection, its open stream, RenewCertificate, and a new connection
// (whose TLS handshake the server refuses).
func requireRefused(t *testing.T, sh *shardtest.Shard, oc operatorConn, watch *collector[*nstancev1.GroupEvent]) {
	t.Helper()
	_, err := oc.c.GetConfigStatus(ctxT(t), &nstancev1.GetConfigStatusRequest{})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "next RPC on the open connection: %v", err)
	require.Contains(t, err.Error(), "certificate revoked")
	_, err = oc.c.RenewCertificate(ctxT(t), &nstancev1.RenewCertificateRequest{})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "RenewCertificate: %v", err)
	if watch != nil {
		err = streamEnded(t, watch)
		require.Equal(t, codes.PermissionDenied, status.Code(err), "open stream: %v", err)
	}
	require.ErrorContains(t, clientHandshake(t, sh.OperatorAddr, oc.tc), "bad certificate", "new connection")
	err = call(t, sh.OperatorAddr, oc.tc)
	require.Equal(t, codes.Unavailable, status.Code(err), "RPC on a new connection: %v", err)
}

func requireWorks(t *testing.T, sh *shardtest.Shard, oc operatorConn) {
	t.Helper()
	_, err := oc.c.GetConfigStatus(ctxT(t), &nstancev1.GetConfigStatusRequest{})
	require.NoError(t, err)
	_, err = oc.c.RenewCertificate(ctxT(t), &nstancev1.RenewCertificateRequest{})
	require.NoError(t, err)
	require.NoError(t, call(t, sh.OperatorAddr, oc.tc))
}

// TestRevokedOperatorIsRefusedAtOnce: revoking an operator (its record is
// deleted and a deny entry written) refuses its very next RPC on an open
// connection, ends its open streams, refuses RenewCertificate and any new
// handshake, while another operator of the same tenant keeps working; a new
// server of the shard (same storage) refuses it too.
func TestRevokedOperatorIsRefusedAtOnce(t *testing.T) {
	sh := shardtest.Start(t, shardtest.Options{RequireOperatorRecords: true})
	a, b := openOperator(t, sh, "op-a"), openOperator(t, sh, "op-b")
	watchA, watchB := openWatch(t, a.c), openWatch(t, b.c)

	e, err := sh.Revocations.RevokeOperator(ctxT(t), "acme", "op-a", "test")
	require.NoError(t, err)
	require.Equal(t, "spiffe://test-cluster/tenant/acme/operator/op-a", e.URI)
	_, err = sh.Store.Head(ctxT(t), sh.Keys.Operator("acme", "op-a"))
	require.Error(t, err, "the record is deleted")
	requireRefused(t, sh, a, watchA)
	requireWorks(t, sh, b)
	select {
	case err := <-watchB.err:
		t.Fatalf("the other operator's stream ended: %v", err)
	default:
	}

	// A restarted server (the next leader) loads the entry from storage.
	sh.Stop()
	sh2 := shardtest.Start(t, shardtest.Options{Store: sh.Store, CA: sh.CA, RequireOperatorRecords: true})
	require.ErrorContains(t, clientHandshake(t, sh2.OperatorAddr, a.tc), "bad certificate")
	require.NoError(t, call(t, sh2.OperatorAddr, b.tc))
}

// TestDeletedOperatorRecord: deleting an operator record by hand makes
// RenewCertificate and the next handshake fail at once and, within one
// revocation sync, every RPC and stream on open connections; a record
// deleted before any sync saw it counts the same.
func TestDeletedOperatorRecord(t *testing.T) {
	for _, seen := range []bool{true, false} {
		t.Run(fmt.Sprintf("seen by a sync %v", seen), func(t *testing.T) {
			sh := shardtest.Start(t, shardtest.Options{RequireOperatorRecords: true})
			a, b := openOperator(t, sh, "op-a"), openOperator(t, sh, "op-b")
			watchA := openWatch(t, a.c)
			if seen {
				require.NoError(t, sh.Revocations.Sync(ctxT(t)))
			}
			require.NoError(t, sh.Store.Delete(ctxT(t), sh.Keys.Operator("acme", "op-a")))
			// At once: RenewCertificate and the next handshake read the record.
			_, err := a.c.RenewCertificate(ctxT(t), &nstancev1.RenewCertificateRequest{})
			require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
			require.ErrorContains(t, clientHandshake(t, sh.OperatorAddr, a.tc), "bad certificate", "new connection")
			// The open connection and stream within one sync.
			require.NoError(t, sh.Revocations.Sync(ctxT(t)))
			requireRefused(t, sh, a, watchA)
			requireWorks(t, sh, b)
		})
	}
}

// TestOperatorWithoutRecordIsRefused: a certificate the CA issued for an
// operator id that has no record (never registered, or its record lost) is
// refused at the handshake when records are required.
func TestOperatorWithoutRecordIsRefused(t *testing.T) {
	sh := shardtest.Start(t, shardtest.Options{RequireOperatorRecords: true})
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	cert, _, err := sh.CA.IssueClient(pki.ClientRequest{Identity: pki.Identity{ClusterID: sh.ClusterID, Tenant: "acme", Role: pki.RoleAdmin, ClientID: "ghost"},
		PublicKey: pub, Validity: time.Hour}, time.Now())
	require.NoError(t, err)
	tc := pki.ClientTLS(sh.CA.Pool(), &tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: priv}, "127.0.0.1")
	require.ErrorContains(t, clientHandshake(t, sh.OperatorAddr, tc), "bad certificate")
	require.NoError(t, call(t, sh.OperatorAddr, openOperator(t, sh, "registered").tc))
}

// TestDeletedInstanceAgentIsRefused: once an instance is deleted, its real
// agent's certificate is refused on the Agent port: the next RPC on an open
// connection, an open stream, and a new handshake; another instance's agent
// keeps working.
func TestDeletedInstanceAgentIsRefused(t *testing.T) {
	a := startAgentShard(t)
	a.upsert(t, 2, "")
	waitGroup(t, a.c, "workers", 2)
	ids := a.ids(t)
	require.Len(t, ids, 2)
	// The agent's certificate, held in memory: the provider removes the
	// instance's files when it deletes it.
	agentTLS := func(id string) *tls.Config {
		dir := filepath.Join(a.stateDir, id, "identity")
		cert, err := tls.LoadX509KeyPair(filepath.Join(dir, identity.CertFile), filepath.Join(dir, identity.KeyFile))
		require.NoError(t, err)
		return pki.ClientTLS(a.sh.CA.Pool(), &cert, "127.0.0.1")
	}
	type agentConn struct {
		tc *tls.Config
		c  nstancev1.AgentServiceClient
	}
	open := func(id string) agentConn {
		tc := agentTLS(id)
		conn, err := grpc.NewClient(a.sh.AgentAddr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		ac := agentConn{tc: tc, c: nstancev1.NewAgentServiceClient(conn)}
		_, err = ac.c.SubmitPublicKeys(ctxT(t), &nstancev1.SubmitPublicKeysRequest{})
		require.NoError(t, err, "agent %s before deletion", id)
		return ac
	}
	gone, kept := open(ids[0]), open(ids[1])
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	st, err := gone.c.KeyGenRequests(ctx, &nstancev1.KeyGenRequestsRequest{})
	require.NoError(t, err)
	_, err = st.Header()
	require.NoError(t, err)
	stream := collect(t, st.Recv)

	// Scale down to the other instance: the first one is deleted.
	_, err = a.c.DeleteInstance(ctxT(t), &nstancev1.DeleteInstanceRequest{InstanceId: ids[0], SkipDrain: true})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, ok := a.sh.Assembly.Instances.Get(ids[0])
		return !ok
	}, 20*time.Second, 10*time.Millisecond)

	_, err = gone.c.SubmitPublicKeys(ctxT(t), &nstancev1.SubmitPublicKeysRequest{})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "next RPC on the open connection: %v", err)
	err = streamEnded(t, stream)
	require.Equal(t, codes.PermissionDenied, status.Code(err), "open stream: %v", err)
	require.ErrorContains(t, clientHandshake(t, a.sh.AgentAddr, gone.tc), "bad certificate", "new connection")

	_, err = kept.c.SubmitPublicKeys(ctxT(t), &nstancev1.SubmitPublicKeysRequest{})
	require.NoError(t, err)
	require.NoError(t, clientHandshake(t, a.sh.AgentAddr, kept.tc))
}

// TestAdminRevocationRPCs: only admins list operators and revocations and
// revoke; an operator revoked through the RPC is refused at once.
func TestAdminRevocationRPCs(t *testing.T) {
	sh := shardtest.Start(t, shardtest.Options{RequireOperatorRecords: true})
	a, b := openOperator(t, sh, "op-a"), openOperator(t, sh, "op-b")
	admin := sh.AdminClient(t, "acme")

	_, err := b.c.Revoke(ctxT(t), &nstancev1.RevokeRequest{Target: &nstancev1.RevokeRequest_OperatorId{OperatorId: "op-a"}})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	_, err = b.c.ListOperators(ctxT(t), &nstancev1.ListOperatorsRequest{})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	_, err = b.c.ListRevocations(ctxT(t), &nstancev1.ListRevocationsRequest{})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)

	ops, err := admin.ListOperators(ctxT(t), &nstancev1.ListOperatorsRequest{})
	require.NoError(t, err)
	var ids []string
	for _, o := range ops.GetOperators() {
		ids = append(ids, o.GetOperatorId())
		if o.GetOperatorId() == "op-a" {
			require.Equal(t, "spiffe://test-cluster/tenant/acme/operator/op-a", o.GetUri())
			require.Equal(t, nstancev1.ClientRole_CLIENT_ROLE_OPERATOR, o.GetRole())
		}
	}
	require.Equal(t, []string{"admin-acme", "op-a", "op-b"}, ids)

	for name, req := range map[string]*nstancev1.RevokeRequest{
		"no target":       {},
		"bad serial":      {Target: &nstancev1.RevokeRequest_Serial{Serial: "12ab"}},
		"bad operator id": {Target: &nstancev1.RevokeRequest_OperatorId{OperatorId: "../op"}},
		"bad instance id": {Target: &nstancev1.RevokeRequest_InstanceId{InstanceId: "a/b"}},
	} {
		_, err := admin.Revoke(ctxT(t), req)
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", name, err)
	}

	resp, err := admin.Revoke(ctxT(t), &nstancev1.RevokeRequest{Target: &nstancev1.RevokeRequest_OperatorId{OperatorId: "op-a"}, Reason: "left the team"})
	require.NoError(t, err)
	r := resp.GetRevocation()
	require.Equal(t, nstancev1.RevocationKind_REVOCATION_KIND_OPERATOR, r.GetKind())
	require.Equal(t, "op-a", r.GetSubject())
	require.Equal(t, "left the team", r.GetReason())
	require.Equal(t, "spiffe://test-cluster/tenant/acme/admin/admin-acme", r.GetRevokedBy())
	requireRefused(t, sh, a, nil)
	requireWorks(t, sh, b)

	_, err = admin.Revoke(ctxT(t), &nstancev1.RevokeRequest{Target: &nstancev1.RevokeRequest_InstanceId{InstanceId: "workers-0a1b2c3d"}})
	require.NoError(t, err)
	list, err := admin.ListRevocations(ctxT(t), &nstancev1.ListRevocationsRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetRevocations(), 2)
	require.Equal(t, "op-a", list.GetRevocations()[0].GetSubject())
	require.Equal(t, nstancev1.RevocationKind_REVOCATION_KIND_AGENT, list.GetRevocations()[1].GetKind())
	require.Equal(t, sh.ShardID, list.GetRevocations()[1].GetShard())
	ops, err = admin.ListOperators(ctxT(t), &nstancev1.ListOperatorsRequest{})
	require.NoError(t, err)
	require.Len(t, ops.GetOperators(), 2, "op-a's record is gone")
}

// TestLegacyOperatorRecordAfterUpgrade: an operator registered by a version
// before tenant-scoped ids has its record at cluster/operators/{id}.json;
// after the upgrade it keeps working and renewing (the renewal is recorded
// where the record is), and nothing is revoked.
func TestLegacyOperatorRecordAfterUpgrade(t *testing.T) {
	sh := shardtest.Start(t, shardtest.Options{RequireOperatorRecords: true})
	a := openOperator(t, sh, "op-a")
	obj, err := sh.Store.Get(ctxT(t), sh.Keys.Operator("acme", "op-a"))
	require.NoError(t, err)
	_, err = sh.Store.Put(ctxT(t), sh.Keys.LegacyOperator("op-a"), obj.Body, objstore.PutOptions{})
	require.NoError(t, err)
	require.NoError(t, sh.Store.Delete(ctxT(t), sh.Keys.Operator("acme", "op-a")))
	require.NoError(t, sh.Revocations.Sync(ctxT(t)))
	requireWorks(t, sh, a)
	require.NoError(t, sh.Revocations.Sync(ctxT(t)))
	require.Empty(t, sh.Revocations.Entries())
	after, err := sh.Store.Get(ctxT(t), sh.Keys.LegacyOperator("op-a"))
	require.NoError(t, err)
	require.NotEqual(t, string(obj.Body), string(after.Body), "the renewal is recorded in the legacy record")
	// Another tenant's operator of that id is not admitted by it.
	other := openOperatorOf(t, sh, "beta", "op-a")
	require.NoError(t, sh.Store.Delete(ctxT(t), sh.Keys.Operator("beta", "op-a")))
	require.ErrorContains(t, clientHandshake(t, sh.OperatorAddr, other.tc), "bad certificate")
}
