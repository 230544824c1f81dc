package agentapi

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/authz"
)

// Two holders of one agent identity. An agent certificate and its key,
// copied off an instance, let a thief renew the identity for a key of its
// own, and the real agent, whose copy is then superseded, could no longer
// renew: it was locked out when its certificate expired while the thief
// kept renewing. The server cannot tell which holder is genuine (both hold
// the same key), so it does not pick one: once the identity was renewed,
// any sign of a second holder of the superseded certificate cuts the
// instance off and tells its tenant, and the instance is replaced like any
// other whose agent stops reporting. A caller presenting a superseded
// certificate is asked to renew on that certificate's own schedule (not the
// renewed one's), so the second holder speaks up when its renewal comes
// due. The signs:
//
//   - a renewal submitted from a superseded certificate for a key other than
//     the one the identity was renewed for, more than TwoHolderGrace after
//     that renewal (both holders renewing; within the grace it is the
//     genuine agent's old connection, refused without consequence), or
//   - a call presenting a superseded certificate more than TwoHolderGrace
//     after the renewed one was first presented (the genuine agent
//     switches to its renewed certificate and reconnects, never going
//     back; the grace covers calls of its old connection still in flight).
//
// The instance's agent certificates issued so far, the renewed one
// included, are revoked (Options.RevokeInstance) and the caller is refused.
// What the server knows about renewals lives with the key store (the
// leader's memory): after a leader change a superseded certificate is
// simply valid until it expires, as before.

// errTwoHolders is the refusal of a caller once two holders were seen.
var errTwoHolders = errors.New("the agent identity of this instance is held twice (a copied certificate and key); its certificates are revoked")

// holders remembers, per instance, the renewed identity certificate
// (serial) once a caller presented it, and when that was first.
type holders struct {
	mu    sync.Mutex
	inUse map[string]inUse // instance id -> renewed certificate in use
}

type inUse struct {
	serial string
	since  time.Time
}

func (h *holders) markInUse(id, serial string, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inUse == nil {
		h.inUse = map[string]inUse{}
	}
	if h.inUse[id].serial != serial {
		h.inUse[id] = inUse{serial: serial, since: now}
	}
}

// inUseSince is when the renewed certificate serial was first presented
// (ok false: not yet).
func (h *holders) inUseSince(id, serial string) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	u, ok := h.inUse[id]
	return u.since, ok && u.serial == serial
}

func (h *holders) forget(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.inUse, id)
}

// renewedIdentity is the identity certificate renewed for an instance, if
// any.
func (s *Server) renewedIdentity(ctx context.Context, ref Ref) *x509.Certificate {
	stored, err := s.o.Keys.Keys(ctx, ref)
	if err != nil {
		return nil
	}
	sk, ok := stored[pki.AgentIdentityKeyName]
	if !ok || len(sk.CertPEM) == 0 {
		return nil
	}
	c, err := pki.ParseCertificatePEM(sk.CertPEM)
	if err != nil {
		return nil
	}
	return c
}

func sameKey(a, b *x509.Certificate) bool {
	ka, ok := a.PublicKey.(ed25519.PublicKey)
	kb, ok2 := b.PublicKey.(ed25519.PublicKey)
	return ok && ok2 && ka.Equal(kb)
}

// superseded reports whether leaf is an identity certificate of the
// instance older than its renewed one, for another key.
func superseded(leaf, renewed *x509.Certificate) bool {
	return leaf != nil && renewed != nil && !sameKey(leaf, renewed) && leaf.NotBefore.Before(renewed.NotBefore)
}

// checkHolder is run at the start of every call: it records that the
// renewed certificate is in use, and cuts the instance off when a
// superseded one shows up after that.
func (s *Server) checkHolder(ctx context.Context, ref Ref) error {
	if s.o.RenewIdentity == nil {
		return nil
	}
	leaf, ok := authz.PeerCertificate(ctx)
	if !ok {
		return nil
	}
	renewed := s.renewedIdentity(ctx, ref)
	now := s.o.Now()
	switch {
	case renewed == nil:
		return nil
	case sameKey(leaf, renewed):
		s.holders.markInUse(ref.InstanceID, renewed.SerialNumber.String(), now)
		return nil
	case superseded(leaf, renewed):
		since, ok := s.holders.inUseSince(ref.InstanceID, renewed.SerialNumber.String())
		if ok && now.Sub(since) > s.o.TwoHolderGrace {
			return s.twoHolders(ctx, ref, fmt.Sprintf("a call presented the superseded identity certificate %s %s after the renewed one %s was in use",
				leaf.SerialNumber, now.Sub(since).Round(time.Second), renewed.SerialNumber))
		}
	}
	return nil
}

// twoHolders revokes the instance's agent certificates, tells the tenant
// and returns the caller's refusal.
func (s *Server) twoHolders(ctx context.Context, ref Ref, why string) error {
	err := fmt.Errorf("%w: %s", errTwoHolders, why)
	s.o.Log.Error(err, "!!! two holders of one agent identity: revoking the instance's agent certificates; the instance will be replaced",
		"instance", ref.InstanceID, "tenant", ref.Tenant, "group", ref.Group)
	if s.o.RevokeInstance != nil {
		if rerr := s.o.RevokeInstance(context.WithoutCancel(ctx), ref.InstanceID, "two holders of one agent identity: "+why); rerr != nil {
			s.o.Log.Error(rerr, "revoking the agent certificates of an instance with two holders", "instance", ref.InstanceID)
		}
	}
	s.holders.forget(ref.InstanceID)
	if s.o.Refusals != nil {
		s.o.Refusals.ReportInstanceError(ref.Tenant, ref.Group, ref.InstanceID, err)
	}
	return status.Error(codes.PermissionDenied, errTwoHolders.Error())
}
