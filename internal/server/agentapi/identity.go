package agentapi

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"time"

	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/keytype"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/authz"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Identity renewal: an agent's cluster-CA certificate is renewed through the
// Agent streams. Once IdentityRenewAfter of the presented certificate's
// lifetime has passed, KeyGenRequests also lists the reserved key
// pki.AgentIdentityKeyName (Ed25519); the agent submits its public key with
// SubmitPublicKeys; the server issues a certificate of the same identity
// (RenewIdentity) and delivers it on ReceiveFiles as a file of kind
// FILE_KIND_AGENT_IDENTITY. Until the agent submits, the request is sent
// again every IdentityRetry.

// RenewIdentityFunc issues a new identity certificate for the agent that
// presented leaf, for public key pub; chainPEM is the CA chain to trust.
type RenewIdentityFunc func(ctx context.Context, leaf *x509.Certificate, pub crypto.PublicKey) (certPEM, chainPEM []byte, err error)

// identityStatus is what the server knows about a caller's identity.
type identityStatus struct {
	// leaf is the certificate the caller presented on this connection.
	leaf *x509.Certificate
	// issued is a renewed certificate stored for the instance, when newer
	// than leaf (or leaf is unknown).
	issued *StoredKey
	// renewAt of the newest of the two; zero when renewal is off.
	renewAt time.Time
}

func (st identityStatus) due(now time.Time) bool {
	return !st.renewAt.IsZero() && !now.Before(st.renewAt)
}

func (s *Server) identityStatus(ctx context.Context, ref Ref) identityStatus {
	var st identityStatus
	if leaf, ok := authz.PeerCertificate(ctx); ok {
		st.leaf = leaf
	}
	newest := st.leaf
	if stored, err := s.o.Keys.Keys(ctx, ref); err == nil {
		if sk, ok := stored[pki.AgentIdentityKeyName]; ok && len(sk.CertPEM) > 0 {
			if c, err := pki.ParseCertificatePEM(sk.CertPEM); err == nil && (newest == nil || !c.NotAfter.Before(newest.NotAfter)) {
				st.issued, newest = &sk, c
			}
		}
	}
	if s.o.RenewIdentity != nil && st.leaf != nil && newest != nil {
		st.renewAt = pki.RenewAt(newest, s.o.IdentityRenewAfter)
		if st.issued != nil && superseded(st.leaf, newest) {
			// The identity was renewed for another key, yet this caller
			// presents the certificate it superseded: it is asked on that
			// certificate's own schedule, so a second holder (the real
			// agent, when a thief renewed first) is heard from rather than
			// left to expire (holders.go).
			st.renewAt = pki.RenewAt(st.leaf, s.o.IdentityRenewAfter)
		}
	}
	return st
}

func identityKeySpec() *nstancev1.KeySpec {
	return &nstancev1.KeySpec{Name: pki.AgentIdentityKeyName, Type: nstancev1.KeyType_KEY_TYPE_ED25519}
}

// identityRetry is how long to wait before asking again for an identity key
// the agent has not submitted: a twentieth of the lifetime, within IdentityRetry.
func (s *Server) identityRetry(st identityStatus) time.Duration {
	d := s.o.IdentityRetry
	if st.leaf != nil {
		if l := pki.Lifetime(st.leaf) / 20; l < d {
			d = l
		}
	}
	return max(d, 200*time.Millisecond)
}

// renewIdentity handles a submitted identity key: it reports whether the
// key was accepted, or why not.
func (s *Server) renewIdentity(ctx context.Context, ref Ref, k *nstancev1.PublicKey) (bool, string) {
	if s.o.RenewIdentity == nil {
		return false, "identity renewal is not offered by this server"
	}
	if k.GetType() != nstancev1.KeyType_KEY_TYPE_ED25519 {
		return false, "identity keys are Ed25519"
	}
	if len(k.GetPublicKeyPem()) > maxPublicKeyPEM {
		return false, "public key PEM too long"
	}
	pub, err := parsePublicKey(k.GetPublicKeyPem())
	if err != nil {
		return false, err.Error()
	}
	if keytype.Of(pub) != nstancev1.KeyType_KEY_TYPE_ED25519 {
		return false, "identity keys are Ed25519"
	}
	now := s.o.Now()
	st := s.identityStatus(ctx, ref)
	if st.issued != nil && st.issued.PublicKeyPEM == k.GetPublicKeyPem() {
		return true, "" // already issued for this key (a repeated submission)
	}
	if renewed := s.renewedIdentity(ctx, ref); superseded(st.leaf, renewed) {
		if age := now.Sub(pki.IssuedAt(renewed)); age <= s.o.TwoHolderGrace {
			// The agent's old connection, moments after its own renewal.
			return false, "the identity was just renewed for another key; present the renewed certificate"
		}
		// The identity was renewed for another key, and the holder of the
		// certificate it superseded renews too: two holders (holders.go).
		err := s.twoHolders(ctx, ref, fmt.Sprintf("a renewal was submitted from the superseded identity certificate %s for another key than the renewed one %s",
			st.leaf.SerialNumber, renewed.SerialNumber))
		return false, status.Convert(err).Message()
	}
	if st.leaf == nil || !st.due(now) {
		return false, "identity renewal is not due"
	}
	certPEM, chainPEM, err := s.o.RenewIdentity(ctx, st.leaf, pub)
	if err != nil {
		s.o.Log.Error(err, "renewing agent identity failed; the agent will be asked again", "instance", ref.InstanceID,
			"tenant", ref.Tenant, "current_not_after", st.leaf.NotAfter)
		return false, "renewal failed on the server; it will be requested again"
	}
	cert, err := pki.ParseCertificatePEM(certPEM)
	if err != nil {
		s.o.Log.Error(err, "renewed agent identity unusable", "instance", ref.InstanceID)
		return false, "renewal failed on the server; it will be requested again"
	}
	if err := s.o.Keys.PutKey(ctx, ref, pki.AgentIdentityKeyName, StoredKey{Type: k.GetType(), PublicKeyPEM: k.GetPublicKeyPem()}); err != nil {
		s.o.Log.Error(err, "storing renewed agent identity", "instance", ref.InstanceID)
		return false, "renewal failed on the server; it will be requested again"
	}
	content := append(append([]byte{}, certPEM...), chainPEM...)
	ok, err := s.o.Keys.PutCertificate(ctx, ref, pki.AgentIdentityKeyName, k.GetPublicKeyPem(), content, "", cert.NotBefore, cert.NotAfter)
	if err != nil || !ok {
		s.o.Log.Error(err, "storing renewed agent identity", "instance", ref.InstanceID, "stored", ok)
		return false, "renewal failed on the server; it will be requested again"
	}
	s.o.Log.Info("agent identity renewed", "instance", ref.InstanceID, "tenant", ref.Tenant, "serial", cert.SerialNumber.String(),
		"not_after", cert.NotAfter, "previous_not_after", st.leaf.NotAfter)
	s.hub.notify(ref.InstanceID, false)
	return true, ""
}

// identityFile is the delivery of a renewed identity certificate the caller
// does not present yet (nil when there is none).
func identityFile(st identityStatus) *nstancev1.DeliveredFile {
	if st.issued == nil {
		return nil
	}
	sum := sha256.Sum256(st.issued.CertPEM)
	return &nstancev1.DeliveredFile{Path: pki.AgentIdentityKeyName, Content: st.issued.CertPEM, Mode: 0o600,
		Kind: nstancev1.FileKind_FILE_KIND_AGENT_IDENTITY, Sha256: hex.EncodeToString(sum[:])}
}
