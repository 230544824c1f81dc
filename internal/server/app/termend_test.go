package app

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/server/agentapi"
	"github.com/nstance-dev/nstance/internal/server/election"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// TestTermEndReleasesAgentState: the Agent service's per-instance state
// (submitted keys and issued certificates, health reports) belongs to a
// leadership term. A server that loses the shard lease drops it: nothing
// would ever forget it otherwise (instances are forgotten by the leader
// that deletes them), so a server that led once and then stood by while
// the fleet churned kept every instance it had served, and a later term
// started from that stale state.
func TestTermEndReleasesAgentState(t *testing.T) {
	store := memstore.New()
	putConfig(t, store, "c1", "s1")
	r := startApp(t, store, "srv-a", "s1")
	waitServing(t, 30*time.Second, r)
	r.app.mu.Lock()
	built := r.app.built
	r.app.mu.Unlock()
	require.NotNil(t, built.AgentKeys)
	ctx := context.Background()
	const n = 500
	for i := range n {
		ref := agentapi.Ref{InstanceID: fmt.Sprintf("i-%04d", i), Tenant: "default", Shard: "s1"}
		require.NoError(t, built.AgentKeys.PutKey(ctx, ref, "k", agentapi.StoredKey{Type: nstancev1.KeyType_KEY_TYPE_ED25519, PublicKeyPEM: "pem"}))
		require.NoError(t, built.Health.RecordHealth(ctx, ref, &nstancev1.HealthReport{}, time.Now()))
	}
	require.Len(t, built.Health.IDs(), n)
	require.Equal(t, n, built.AgentKeys.Len())

	// Another server takes the lease (as after a partition): this one's
	// next renewal fails and its term ends.
	key := layout.New("").ShardLeader("s1")
	obj, err := store.Get(ctx, key)
	require.NoError(t, err)
	var lease election.Lease
	require.NoError(t, json.Unmarshal(obj.Body, &lease))
	now := time.Now()
	body, err := json.Marshal(election.Lease{Holder: "srv-other", Incarnation: "x", RenewedAt: now, ExpiresAt: now.Add(time.Hour), Term: lease.Term + 1})
	require.NoError(t, err)
	_, err = store.Put(ctx, key, body, objstore.PutOptions{IfMatch: obj.ETag})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return !r.app.ServingGRPC() }, 10*time.Second, 20*time.Millisecond, "the term ends")
	require.Eventually(t, func() bool { return built.AgentKeys.Len() == 0 && len(built.Health.IDs()) == 0 },
		10*time.Second, 20*time.Millisecond, "the term's agent state is released")
}
