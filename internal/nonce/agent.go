package nonce

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// AgentRequest names the instance an agent nonce is for.
type AgentRequest struct {
	InstanceID string
	Tenant     string
	GroupID    string
}

// AgentMinter mints the agent nonces of one shard with the cluster's
// Ed25519 nonce key: the nonce a new instance's agent presents on first
// contact with the Registration service.
type AgentMinter struct {
	Key       ed25519.PrivateKey
	ClusterID string
	Shard     string
	// TTL is the nonce lifetime (certificates.agent_nonce_ttl).
	TTL time.Duration
	Now func() time.Time
}

// MintAgentNonce mints the nonce of the instance req names.
func (m AgentMinter) MintAgentNonce(_ context.Context, req AgentRequest) (string, error) {
	now := time.Now
	if m.Now != nil {
		now = m.Now
	}
	tok, err := Mint(m.Key, Claims{
		Kind: KindAgent, ClusterID: m.ClusterID, Tenant: req.Tenant, Shard: m.Shard, Group: req.GroupID,
		RegisteredClaims: jwt.RegisteredClaims{Subject: req.InstanceID},
	}, m.TTL, now())
	if err != nil {
		return "", fmt.Errorf("minting agent nonce for %s: %w", req.InstanceID, err)
	}
	return tok, nil
}
