package reconcile

import (
	"context"

	"github.com/nstance-dev/nstance/internal/nonce"
)

// NonceMinter mints the short-lived registration nonce an instance's agent
// presents on first contact (nonce.AgentMinter in production).
type NonceMinter interface {
	MintAgentNonce(ctx context.Context, req AgentNonceRequest) (string, error)
}

// AgentNonceRequest names the instance a nonce is for.
type AgentNonceRequest = nonce.AgentRequest

// KeyMinter is nonce.AgentMinter under the name its callers use.
type KeyMinter = nonce.AgentMinter
