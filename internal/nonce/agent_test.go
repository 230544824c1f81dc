package nonce

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestAgentMinter(t *testing.T) {
	pub, priv := keys(t)
	now := time.Now()
	m := AgentMinter{Key: priv, ClusterID: "c1", Shard: "s1", TTL: 15 * time.Minute, Now: func() time.Time { return now }}
	tok, err := m.MintAgentNonce(context.Background(), AgentRequest{InstanceID: "web-1", Tenant: "t", GroupID: "web"})
	require.NoError(t, err)
	c, err := (&Verifier{Key: pub, ClusterID: "c1", Shard: "s1", Now: func() time.Time { return now }}).Verify(tok, KindAgent)
	require.NoError(t, err)
	require.Equal(t, "web-1", c.Subject)
	require.Equal(t, "t", c.Tenant)
	require.Equal(t, "web", c.Group)
	require.Equal(t, "s1", c.Shard)
	require.WithinDuration(t, now.Add(15*time.Minute), c.ExpiresAt.Time, time.Second)
	// Another shard's verifier refuses it.
	_, err = (&Verifier{Key: pub, ClusterID: "c1", Shard: "s2", Now: func() time.Time { return now }}).Verify(tok, KindAgent)
	require.Error(t, err)
}
