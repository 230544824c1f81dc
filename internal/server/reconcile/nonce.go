package reconcile

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/nstance-dev/nstance/internal/nonce"
)

// NonceMinter mints the short-lived registration nonce an instance's agent
// presents on first contact.
type NonceMinter interface {
	MintAgentNonce(ctx context.Context, req AgentNonceRequest) (string, error)
}

// AgentNonceRequest names the instance a nonce is for.
type AgentNonceRequest struct {
	InstanceID string
	Tenant     string
	GroupID    string
}

// KeyMinter mints agent nonces with the cluster's Ed25519 nonce key.
type KeyMinter struct {
	Key       ed25519.PrivateKey
	ClusterID string
	Shard     string
	// TTL is the nonce lifetime (certificates.agent_nonce_ttl).
	TTL time.Duration
	Now func() time.Time
}

// MintAgentNonce implements NonceMinter.
func (m KeyMinter) MintAgentNonce(ctx context.Context, req AgentNonceRequest) (string, error) {
	now := time.Now
	if m.Now != nil {
		now = m.Now
	}
	tok, err := nonce.Mint(m.Key, nonce.Claims{
		Kind: nonce.KindAgent, ClusterID: m.ClusterID, Tenant: req.Tenant, Shard: m.Shard, Group: req.GroupID,
		RegisteredClaims: jwt.RegisteredClaims{Subject: req.InstanceID},
	}, m.TTL, now())
	if err != nil {
		return "", fmt.Errorf("minting agent nonce for %s: %w", req.InstanceID, err)
	}
	return tok, nil
}
