package attack

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
	"github.com/nstance-dev/nstance/pkg/objstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// identityCases are the cases of issue 29 about operator identities per tenant, nonce expiry, stolen-certificate renewal (findings 7 and 8).
func identityCases() []attackCase {
	return []attackCase{
		{name: "tenant B registering operator id X does not cut off tenant A's operator X (its renewal still works)", run: twinRegistration},
		{name: "revoking tenant B's operator X leaves tenant A's operator X working", run: twinRevocation},
		{name: "a used operator nonce cannot register a second key after another shard's leader sweeps with a shorter nonce_max_lifetime", run: foreignSweep},
		{name: "a thief renewing a stolen agent certificate first cannot keep the identity: the real agent's renewal cuts both off", run: thiefRenewal},
	}
}

// renewOperator calls RenewCertificate on sv as cert for a fresh key and
// returns the renewed pair.
func (l *loot) renewOperator(ctx context.Context, sv *server, cert *tls.Certificate) (tls.Certificate, *nstancev1.RenewCertificateResponse, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	pubPEM, err := pki.MarshalPublicKeyPEM(pub)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	conn, err := l.dial(sv.operator, cert)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, refuseWithin)
	defer cancel()
	resp, err := nstancev1.NewOperatorServiceClient(conn).RenewCertificate(cctx, &nstancev1.RenewCertificateRequest{PublicKeyPem: string(pubPEM)})
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	c, err := keyPair([]byte(resp.CertificatePem), priv)
	return c, resp, err
}

// operatorWorks checks that cert is served by both shards (a read) and that
// its RenewCertificate succeeds with the same tenant.
func (l *loot) operatorWorks(ctx context.Context, e *env, cert *tls.Certificate, tenant string) error {
	for _, sv := range []*server{e.dev1, e.dev2} {
		conn, err := l.dial(sv.operator, cert)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, refuseWithin)
		_, err = nstancev1.NewOperatorServiceClient(conn).GetConfigStatus(cctx, &nstancev1.GetConfigStatusRequest{})
		cancel()
		conn.Close()
		if err != nil {
			return fmt.Errorf("%s refused tenant %s's operator: %v", sv.shard, tenant, err)
		}
		_, resp, err := l.renewOperator(ctx, sv, cert)
		if err != nil {
			return fmt.Errorf("%s refused the renewal of tenant %s's operator: %v", sv.shard, tenant, err)
		}
		if got := resp.GetIdentity().GetTenant(); got != tenant {
			return fmt.Errorf("%s renewed tenant %s's operator into tenant %q", sv.shard, tenant, got)
		}
	}
	return nil
}

// twinRegistration: tenant A registers operator "twin-reg"; then tenant B
// registers an operator of the same id. A's operator still works and renews
// (before the fix the record cluster/operators/twin-reg.json was
// overwritten with tenant B and A's renewal was refused).
func twinRegistration(ctx context.Context, e *env) error {
	const id = "twin-reg"
	a, b, err := registerTwins(ctx, e, id, e.dev2)
	if err != nil {
		return err
	}
	if err := e.l.operatorWorks(ctx, e, &a.cert, tenantA); err != nil {
		return err
	}
	return e.l.operatorWorks(ctx, e, &b.cert, tenantB)
}

// registerTwins registers operator id for tenant A on dev-1 and for tenant
// B on svB.
func registerTwins(ctx context.Context, e *env, id string, svB *server) (a, b *registration, err error) {
	if a, err = e.l.registerOperator(ctx, e.dev1, nonce.KindOperator, tenantA, id); err != nil {
		return nil, nil, fmt.Errorf("registering tenant A's %s: %w", id, err)
	}
	if b, err = e.l.registerOperator(ctx, svB, nonce.KindOperator, tenantB, id); err != nil {
		return nil, nil, fmt.Errorf("registering tenant B's %s: %w", id, err)
	}
	return a, b, nil
}

// twinRevocation: tenants A and B both register operator "twin-rev"; an
// admin revokes tenant B's (RevokeRequest names the tenant). B's
// certificate is refused on both shards once both enforce the entry, and
// A's keeps working and renewing (before the fix the entry named the id
// only, and A's operator was revoked too).
func twinRevocation(ctx context.Context, e *env) error {
	const id = "twin-rev"
	a, b, err := registerTwins(ctx, e, id, e.dev1)
	if err != nil {
		return err
	}
	admin, err := e.l.dial(e.dev1.operator, &e.adminA)
	if err != nil {
		return err
	}
	defer admin.Close()
	resp, err := nstancev1.NewOperatorServiceClient(admin).Revoke(ctx, &nstancev1.RevokeRequest{
		Target: &nstancev1.RevokeRequest_OperatorId{OperatorId: id}, Tenant: tenantB, Reason: "attack suite: tenant B's twin"})
	if err != nil {
		return fmt.Errorf("revoking tenant B's %s: %w", id, err)
	}
	entry := resp.GetRevocation().GetId()
	// Wait until dev-2 enforces the entry too (its next revocation sync).
	admin2, err := e.l.dial(e.dev2.operator, &e.adminA)
	if err != nil {
		return err
	}
	defer admin2.Close()
	if err := proctest.Wait(ctx, "dev-2 enforcing the revocation", 45*time.Second, func() bool {
		r, err := nstancev1.NewOperatorServiceClient(admin2).ListRevocations(ctx, &nstancev1.ListRevocationsRequest{})
		if err != nil {
			return false
		}
		for _, x := range r.GetRevocations() {
			if x.GetId() == entry {
				return true
			}
		}
		return false
	}); err != nil {
		return err
	}
	for _, sv := range []*server{e.dev1, e.dev2} {
		conn, err := e.l.dial(sv.operator, &b.cert)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, refuseWithin)
		_, err = nstancev1.NewOperatorServiceClient(conn).GetConfigStatus(cctx, &nstancev1.GetConfigStatusRequest{})
		cancel()
		conn.Close()
		if !refusedAuth(err) {
			return fmt.Errorf("%s still serves tenant B's revoked %s: %v", sv.shard, id, err)
		}
	}
	return e.l.operatorWorks(ctx, e, &a.cert, tenantA)
}

// clusterLeaderShard is the shard of the server holding the cluster lease.
func clusterLeaderShard(ctx context.Context, e *env) (*server, *server, error) {
	b, err := e.s.get(ctx, e.s.keys.ClusterLeader())
	if err != nil {
		return nil, nil, fmt.Errorf("reading the cluster lease: %w", err)
	}
	var lease struct {
		Holder string `json:"holder"`
	}
	if err := json.Unmarshal(b, &lease); err != nil {
		return nil, nil, err
	}
	for i, sv := range []*server{e.dev1, e.dev2} {
		if strings.HasPrefix(lease.Holder, sv.shard+"-") {
			return sv, []*server{e.dev2, e.dev1}[i], nil
		}
	}
	return nil, nil, fmt.Errorf("cluster lease held by %q, not a server of the stack", lease.Holder)
}

// markerFile is where dev-s3 keeps an object (one file per key).
func (s *stack) markerFile(key string) string {
	return filepath.Join(s.dir, "dev-s3", filepath.FromSlash(key))
}

// foreignSweep: the cluster leader's shard (dev-1) is configured with
// nonce_max_lifetime 1h, the other shard (dev-2, the verifier) with 24h
// (see nonceMaxLifetime in stack_test.go). An
// operator nonce of 20h minted two hours ago registers on the verifier;
// its marker is then dated two hours back (what two hours of waiting would
// do; dev-s3 dates objects by their file's mtime). The leader sweeps every
// 2s (the stack's --nonce-sweep-interval): a sentinel marker of a nonce
// that expired hours ago is dated back too, and once it is gone a sweep has
// run. The used nonce must still be refused for a second key (before the
// fix the leader swept every marker older than its own 1h + allowances).
func foreignSweep(ctx context.Context, e *env) error {
	leader, verifier, err := clusterLeaderShard(ctx, e)
	if err != nil {
		return err
	}
	if nonceMaxLifetime(leader.shard) != "1h" || nonceMaxLifetime(verifier.shard) != "24h" {
		return fmt.Errorf("precondition: the cluster leader is %s, want the shard with the shorter nonce_max_lifetime", leader.shard)
	}

	jti, err := nonce.NewJTI()
	if err != nil {
		return err
	}
	minted := time.Now().Add(-2 * time.Hour)
	tok, err := nonce.Mint(e.l.nonceKey, nonce.Claims{Kind: nonce.KindOperator, ClusterID: clusterID, Tenant: tenantA,
		RegisteredClaims: jwt.RegisteredClaims{ID: jti, Subject: "swept-op"}}, 20*time.Hour, minted)
	if err != nil {
		return err
	}
	if _, err := e.l.registerOperatorWith(ctx, verifier, tok); err != nil {
		return fmt.Errorf("control: %s refused the 20h nonce: %w", verifier.shard, err)
	}
	marker := e.s.keys.ClusterNonce(jti)
	if err := os.Chtimes(e.s.markerFile(marker), minted, minted); err != nil {
		return fmt.Errorf("dating the marker back: %w", err)
	}
	// The sentinel: a marker of a nonce that expired long ago.
	sjti, err := nonce.NewJTI()
	if err != nil {
		return err
	}
	old := time.Now().Add(-4 * time.Hour)
	body, err := json.Marshal(nonce.Marker{JTI: sjti, Kind: nonce.KindOperator, Subject: "sentinel-op", Tenant: tenantA,
		UsedAt: old, ExpiresAt: old.Add(time.Hour), KeySHA256: strings.Repeat("0", 64)})
	if err != nil {
		return err
	}
	sentinel := e.s.keys.ClusterNonce(sjti)
	if _, err := e.s.store.Put(ctx, sentinel, body, putOpts()); err != nil {
		return err
	}
	if err := os.Chtimes(e.s.markerFile(sentinel), old, old); err != nil {
		return fmt.Errorf("dating the sentinel back: %w", err)
	}
	if err := proctest.Wait(ctx, leader.shard+" sweeping the expired sentinel marker", 30*time.Second, func() bool {
		_, err := e.s.get(ctx, sentinel)
		return errors.Is(err, objstore.ErrNotFound)
	}); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, refuseWithin)
	defer cancel()
	_, err = e.l.registerOperatorWith(cctx, verifier, tok)
	switch {
	case err == nil:
		return fmt.Errorf("%s registered a second key with a used nonce after %s's sweep", verifier.shard, leader.shard)
	case status.Code(err) != codes.AlreadyExists:
		return fmt.Errorf("the replay was refused with %v, want AlreadyExists", err)
	}
	return nil
}

// thiefRenewal: tenant B's new instance registers; a thief holds a copy of
// its agent certificate and key. Both copies come due for renewal at the
// same moment; the case presents the certificate as it is then (same
// identity, names and key, issued 20 of its 24 hours ago: minted with the
// CA key the suite holds, standing in for the wait). The thief renews first
// with its own new key and gets a renewed certificate. The real agent's
// renewal from the same certificate then reveals two holders of one
// identity: the server cannot tell which is genuine, so it must not leave
// the thief holding the identity while the real agent is refused (before
// the fix the real agent's renewal was refused as "not due" and the
// thief's renewed certificate kept working). Now, once past the grace the
// server gives the genuine agent's old connection after a renewal (30s),
// the instance's agent certificates, the thief's renewed one included, are
// revoked and the tenant is told; the group replaces the instance.
func thiefRenewal(ctx context.Context, e *env) error {
	b := nstancev1.NewOperatorServiceClient(e.connB)
	ci, err := b.CreateInstance(ctx, &nstancev1.CreateInstanceRequest{Template: "svc", ClientToken: "b-thief"})
	if err != nil {
		return err
	}
	id := ci.Instance.InstanceId
	defer func() {
		_, _ = b.DeleteInstance(context.WithoutCancel(ctx), &nstancev1.DeleteInstanceRequest{InstanceId: id, SkipDrain: true})
	}()
	dir := filepath.Join(e.s.stateDir(e.dev1), id, "identity")
	var stolen tls.Certificate
	if err := proctest.Wait(ctx, "the new agent's certificate", 60*time.Second, func() bool {
		var err error
		stolen, err = tls.LoadX509KeyPair(filepath.Join(dir, "agent.crt"), filepath.Join(dir, "agent.key"))
		return err == nil
	}); err != nil {
		return err
	}
	leaf, err := parseDER(stolen.Certificate[0])
	if err != nil {
		return err
	}
	ident, err := pki.IdentityFromCert(leaf, clusterID)
	if err != nil {
		return err
	}
	// The certificate 20 hours on: same identity, names and key.
	_, duePEM, err := e.l.ca.IssueClient(pki.ClientRequest{Identity: ident, PublicKey: leaf.PublicKey, IPs: leaf.IPAddresses,
		DNSNames: leaf.DNSNames, Validity: 24 * time.Hour}, time.Now().Add(-20*time.Hour))
	if err != nil {
		return err
	}
	due, err := tls.X509KeyPair(duePEM, pemKey(stolen))
	if err != nil {
		return err
	}

	// The thief renews first.
	thiefCert, err := renewAgentIdentity(ctx, e, &due)
	if err != nil {
		return fmt.Errorf("control: the thief's renewal: %w", err)
	}
	if err := agentServed(ctx, e, &thiefCert); err != nil {
		return fmt.Errorf("control: the thief's renewed certificate: %w", err)
	}
	// The real agent renews from the same certificate with its own key,
	// asked again every few seconds as its certificate is due. For
	// TwoHolderGrace (30s) after the thief's renewal the server takes it
	// for the renewing agent's own old connection and only refuses it;
	// after that, whatever the real agent is told, the thief must not keep
	// the identity.
	var realErr error
	if err := proctest.Wait(ctx, "the thief's renewed certificate refused after the real agent's renewal", 50*time.Second, func() bool {
		if _, realErr = renewAgentIdentity(ctx, e, &due); realErr == nil {
			return true // renewed for the real agent: checked below
		}
		return identityRefused(agentServed(ctx, e, &thiefCert))
	}); err != nil {
		return fmt.Errorf("%w (the real agent's renewal got: %v)", err, realErr)
	}
	if err := agentServed(ctx, e, &thiefCert); !identityRefused(err) {
		return fmt.Errorf("the thief's renewed certificate is not refused after the real agent's renewal (answer: %v; the real agent's renewal got: %v)", err, realErr)
	}
	if err := agentServed(ctx, e, &due); !identityRefused(err) {
		return fmt.Errorf("the certificate two holders renewed from is not refused (answer: %v)", err)
	}
	return nil
}

// identityRefused reports whether err (from agentServed) refuses the
// client's identity: Unauthenticated, PermissionDenied, or a connection the
// server closed in the handshake over the certificate (TLS 1.3: the client
// sees a TLS alert or a broken pipe). A listener that cannot be reached
// (connection refused) or a timeout is not a refusal.
func identityRefused(err error) bool {
	switch status.Code(err) {
	case codes.Unauthenticated, codes.PermissionDenied:
		return true
	case codes.Unavailable:
		return !strings.Contains(status.Convert(err).Message(), "connection refused")
	}
	return false
}

// pemKey is the PEM of a TLS pair's Ed25519 key.
func pemKey(c tls.Certificate) []byte {
	b, _ := pki.MarshalPrivateKeyPEM(c.PrivateKey.(ed25519.PrivateKey))
	return b
}

// agentServed reports nil when dev-1's Agent service serves cert.
func agentServed(ctx context.Context, e *env, cert *tls.Certificate) error {
	conn, err := e.l.dial(e.dev1.agent, cert)
	if err != nil {
		return err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, refuseWithin)
	defer cancel()
	_, err = nstancev1.NewAgentServiceClient(conn).SubmitPublicKeys(cctx, &nstancev1.SubmitPublicKeysRequest{})
	if refusedAuth(err) {
		return err
	}
	return nil
}

// renewAgentIdentity submits a fresh identity key as cert's holder and
// collects the renewed certificate from ReceiveFiles.
func renewAgentIdentity(ctx context.Context, e *env, cert *tls.Certificate) (tls.Certificate, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	pubPEM, err := pki.MarshalPublicKeyPEM(pub)
	if err != nil {
		return tls.Certificate{}, err
	}
	conn, err := e.l.dial(e.dev1.agent, cert)
	if err != nil {
		return tls.Certificate{}, err
	}
	defer conn.Close()
	c := nstancev1.NewAgentServiceClient(conn)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	resp, err := c.SubmitPublicKeys(cctx, &nstancev1.SubmitPublicKeysRequest{Keys: []*nstancev1.PublicKey{{
		Name: pki.AgentIdentityKeyName, Type: nstancev1.KeyType_KEY_TYPE_ED25519, PublicKeyPem: string(pubPEM)}}})
	if err != nil {
		return tls.Certificate{}, err
	}
	for _, r := range resp.GetRejected() {
		return tls.Certificate{}, fmt.Errorf("identity key rejected: %s", r.GetReason())
	}
	files, err := c.ReceiveFiles(cctx, &nstancev1.ReceiveFilesRequest{})
	if err != nil {
		return tls.Certificate{}, err
	}
	for {
		d, err := files.Recv()
		if err != nil {
			return tls.Certificate{}, fmt.Errorf("waiting for the renewed identity: %w", err)
		}
		for _, f := range d.GetFiles() {
			if f.GetKind() != nstancev1.FileKind_FILE_KIND_AGENT_IDENTITY {
				continue
			}
			kp, err := pki.MarshalPrivateKeyPEM(priv)
			if err != nil {
				return tls.Certificate{}, err
			}
			if got, err := tls.X509KeyPair(f.GetContent(), kp); err == nil {
				return got, nil
			}
		}
	}
}
