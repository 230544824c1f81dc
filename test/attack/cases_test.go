package attack

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
	"github.com/nstance-dev/nstance/pkg/objstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Refusals come at once; a call that has not answered after this long was
// not refused.
const refuseWithin = 10 * time.Second

// cases is the table of the suite, run in order on one stack.
func cases() []attackCase {
	cs := []attackCase{
		// Every Operator and Agent RPC and watch with the wrong identity.
		{name: "operator RPCs and watches with an operator certificate (control)", run: operatorControl},
		{name: "operator RPCs and watches without a client certificate", run: operatorSweep(noCert)},
		{name: "operator RPCs and watches with a stolen agent certificate", run: operatorSweep(stolenAgentCert)},
		{name: "operator RPCs and watches with a foreign-CA operator certificate", run: operatorSweep(foreignCert(pki.RoleOperator))},
		{name: "operator RPCs and watches with an expired operator certificate", run: operatorSweep(expiredCert(pki.RoleOperator))},
		{name: "operator RPCs and watches with a workload (template) certificate", run: operatorSweep(workloadCert)},
		{name: "agent RPCs and streams without a client certificate", run: agentSweep(noCert)},
		{name: "agent RPCs and streams with an operator certificate", run: agentSweep(operatorCert)},
		{name: "agent RPCs and streams with an admin certificate", run: agentSweep(adminCert)},
		{name: "agent RPCs and streams with a foreign-CA agent certificate", run: agentSweep(foreignCert(pki.RoleAgent))},
		{name: "agent RPCs and streams with an expired agent certificate", run: agentSweep(expiredCert(pki.RoleAgent))},
		{name: "agent RPCs and streams with a workload (template) certificate", run: agentSweep(workloadCert)},
		{name: "agent certificate of dev-1 on dev-2's Agent service", run: agentOtherShard},
		{name: "TLS 1.2 ClientHello on every listener", run: tls12},
		// Nonces.
		{name: "nonce with alg none", run: badNonce(algNone)},
		{name: "nonce with alg HS256 keyed by the public nonce key", run: badNonce(hs256)},
		{name: "nonce without exp", run: badNonce(noExp)},
		{name: "nonce with a lifetime over nonce_max_lifetime", run: badNonce(overLong)},
		{name: "50 concurrent uses of one nonce on both shards", run: nonceRace},
		{name: "agent nonce of shard dev-1 on dev-2", run: nonceOtherShard},
		// Workload certificates.
		{name: "group vars with an operator SPIFFE URI", run: badVars("san_uri", "spiffe://"+clusterID+"/tenant/"+tenantA+"/operator/evil")},
		{name: "group vars with a server DNS name", run: badVars("san_dns", "localhost")},
		{name: "group vars with a server IP address", run: badVars("san_ip", "127.0.0.1")},
		{name: "template certificate without usages refused by RefreshConfig", run: noUsagesRefused},
		{name: "issued workload certificate has exactly its template's usages from the workload CA", run: explicitUsages},
		{name: "config with usage any and a literal operator URI refused by RefreshConfig", run: badConfig},
		{name: "RefreshConfig by a non-admin operator", run: refreshNotAdmin},
		{name: "instance certificates presented as a server to a real agent", run: fakeServerToAgent},
		{name: "instance certificates presented as a server to the operator client", run: fakeServerToOperator},
		// Robustness and tenancy.
		{name: "handler panic answers Internal and the server keeps serving", run: handlerPanic},
		{name: "tenant A naming tenant B's ids gets NotFound", run: crossTenantIDs},
		{name: "tenant A's watches see none of tenant B's events", run: crossTenantEvents},
		// Features being built on other branches; enable after the merge.
		{name: "revoked operator: record deleted, next handshake and RenewCertificate refused", run: revokedOperator},
		{name: "revoked agent: instance deleted, its certificate refused", run: revokedAgent},
		{name: "10,000 streams on one connection: refused beyond the limit, RSS bounded", run: manyStreams},
		{name: "10,000 watches from one operator: refused beyond the limit, RSS bounded", run: manyWatches},
		{name: "agent nonce for an instance the shard does not know", run: nonceUnknownInstance},
		{name: "agent nonce of a registered instance minted again", run: nonceRegisteredInstance},
		{name: "agent certificate names come from the instance record", run: namesFromRecord},
	}
	// Issue 29 (trust-2): one table per area, each in its own file.
	cs = append(cs, devToolCases()...)
	cs = append(cs, adminServeCases()...)
	cs = append(cs, limitCases()...)
	cs = append(cs, identityCases()...)
	cs = append(cs, onDemandCases()...)
	cs = append(cs, tenancyCases()...)
	return cs
}

// ---- identities

// credential yields the client certificate a sweep presents (nil: none).
type credential func(e *env) (*tls.Certificate, error)

func noCert(*env) (*tls.Certificate, error)            { return nil, nil }
func stolenAgentCert(e *env) (*tls.Certificate, error) { return &e.agentB, nil }
func operatorCert(e *env) (*tls.Certificate, error)    { return &e.opA, nil }
func adminCert(e *env) (*tls.Certificate, error)       { return &e.adminA, nil }
func workloadCert(e *env) (*tls.Certificate, error)    { return &e.svcB, nil }
func agentIdentity(e *env) (pki.Identity, error)       { return identityOf(e.agentB) }
func operatorIdentity(e *env) (pki.Identity, error)    { return identityOf(e.opA) }
func identityFor(e *env, r pki.Role) (pki.Identity, error) {
	if r == pki.RoleAgent {
		return agentIdentity(e)
	}
	return operatorIdentity(e)
}

// foreignCert is a certificate with a real identity of this cluster signed
// by another CA that claims the same cluster id.
func foreignCert(r pki.Role) credential {
	return func(e *env) (*tls.Certificate, error) {
		id, err := identityFor(e, r)
		if err != nil {
			return nil, err
		}
		other, err := pki.GenerateCA(clusterID, time.Hour, time.Now())
		if err != nil {
			return nil, err
		}
		c, err := mintCert(other, id, time.Now(), time.Hour)
		return &c, err
	}
}

// expiredCert is a certificate with a real identity signed by the real
// cluster CA that expired an hour ago.
func expiredCert(r pki.Role) credential {
	return func(e *env) (*tls.Certificate, error) {
		id, err := identityFor(e, r)
		if err != nil {
			return nil, err
		}
		c, err := mintCert(e.l.ca, id, time.Now().Add(-3*time.Hour), 2*time.Hour)
		return &c, err
	}
}

// ---- RPC sweeps

func operatorControl(ctx context.Context, e *env) error {
	for _, sv := range []*server{e.dev1, e.dev2} {
		conn, err := e.l.dial(sv.operator, &e.adminA)
		if err != nil {
			return err
		}
		calls := operatorCalls(ctx, conn, 2*time.Second)
		conn.Close()
		for name, err := range calls {
			// A watch may be accepted and quiet; a unary call must answer.
			if !strings.HasPrefix(name, "Watch") && status.Code(err) == codes.DeadlineExceeded {
				calls[name] = status.Error(codes.Unauthenticated, "no answer: "+err.Error())
			}
		}
		if err := expectAll(calls, passedAuth, sv.shard+": refused the admin"); err != nil {
			return err
		}
	}
	return nil
}

func operatorSweep(cred credential) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		cert, err := cred(e)
		if err != nil {
			return err
		}
		for _, sv := range []*server{e.dev1, e.dev2} {
			conn, err := e.l.dial(sv.operator, cert)
			if err != nil {
				return err
			}
			calls := operatorCalls(ctx, conn, refuseWithin)
			conn.Close()
			if err := expectAll(calls, refusedAuth, sv.shard+": not refused"); err != nil {
				return err
			}
		}
		return nil
	}
}

func agentSweep(cred credential) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		cert, err := cred(e)
		if err != nil {
			return err
		}
		for _, sv := range []*server{e.dev1, e.dev2} {
			conn, err := e.l.dial(sv.agent, cert)
			if err != nil {
				return err
			}
			calls := agentCalls(ctx, conn, refuseWithin)
			conn.Close()
			if err := expectAll(calls, refusedAuth, sv.shard+": not refused"); err != nil {
				return err
			}
		}
		return nil
	}
}

// agentOtherShard: the stolen agent certificate (shard dev-1) passes on
// dev-1 (control) and is refused on every Agent RPC of dev-2.
func agentOtherShard(ctx context.Context, e *env) error {
	conn, err := e.l.dial(e.dev1.agent, &e.agentB)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, refuseWithin)
	_, err = nstancev1.NewAgentServiceClient(conn).SubmitPublicKeys(cctx, &nstancev1.SubmitPublicKeysRequest{})
	cancel()
	conn.Close()
	if !passedAuth(err) {
		return fmt.Errorf("control: dev-1 refused its own agent: %v", err)
	}
	conn, err = e.l.dial(e.dev2.agent, &e.agentB)
	if err != nil {
		return err
	}
	defer conn.Close()
	return expectAll(agentCalls(ctx, conn, refuseWithin), refusedAuth, "dev-2 served a dev-1 agent")
}

// tls12 offers only TLS 1.2 to every listener of both servers (with the
// right client certificate where one is required); a TLS 1.3 handshake with
// the same configuration succeeds.
func tls12(ctx context.Context, e *env) error {
	for _, sv := range []*server{e.dev1, e.dev2} {
		for _, l := range []struct {
			name, addr string
			cert       *tls.Certificate
		}{{"registration", sv.registration, nil}, {"operator", sv.operator, &e.opA}, {"agent", sv.agent, &e.agentB}} {
			for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
				cfg := e.l.clientTLS(l.cert)
				cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS12, v
				d := tls.Dialer{Config: cfg, NetDialer: &net.Dialer{Timeout: refuseWithin}}
				c, err := d.DialContext(ctx, "tcp", l.addr)
				if err == nil {
					c.Close()
				}
				switch {
				case v == tls.VersionTLS12 && err == nil:
					return fmt.Errorf("%s %s accepted a TLS 1.2 handshake", sv.shard, l.name)
				case v == tls.VersionTLS13 && err != nil:
					return fmt.Errorf("control: %s %s refused TLS 1.3: %v", sv.shard, l.name, err)
				}
			}
		}
	}
	return nil
}

// ---- nonces

// operatorClaims are well-formed operator nonce claims of tenant A.
func operatorClaims(subject string) nonce.Claims {
	jti, _ := nonce.NewJTI()
	return nonce.Claims{Kind: nonce.KindOperator, ClusterID: clusterID, Tenant: tenantA,
		RegisteredClaims: jwt.RegisteredClaims{ID: jti, Subject: subject}}
}

func algNone(l *loot) (string, error) {
	c := operatorClaims("none-op")
	now := time.Now()
	c.IssuedAt, c.NotBefore, c.ExpiresAt = jwt.NewNumericDate(now), jwt.NewNumericDate(now), jwt.NewNumericDate(now.Add(time.Hour))
	return jwt.NewWithClaims(jwt.SigningMethodNone, c).SignedString(jwt.UnsafeAllowNoneSignatureType)
}

func hs256(l *loot) (string, error) {
	c := operatorClaims("hs-op")
	now := time.Now()
	c.IssuedAt, c.NotBefore, c.ExpiresAt = jwt.NewNumericDate(now), jwt.NewNumericDate(now), jwt.NewNumericDate(now.Add(time.Hour))
	// The classic confusion: the public key as the HMAC secret.
	return jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte(l.nonceKey.Public().(ed25519.PublicKey)))
}

func noExp(l *loot) (string, error) {
	c := operatorClaims("noexp-op")
	now := time.Now()
	c.IssuedAt, c.NotBefore = jwt.NewNumericDate(now), jwt.NewNumericDate(now)
	return jwt.NewWithClaims(jwt.SigningMethodEdDSA, c).SignedString(l.nonceKey)
}

func overLong(l *loot) (string, error) {
	c := operatorClaims("long-op")
	now := time.Now()
	c.IssuedAt, c.NotBefore, c.ExpiresAt = jwt.NewNumericDate(now), jwt.NewNumericDate(now), jwt.NewNumericDate(now.Add(25*time.Hour))
	return jwt.NewWithClaims(jwt.SigningMethodEdDSA, c).SignedString(l.nonceKey)
}

// badNonce presents a crafted nonce to both servers: refused, with a
// message that names neither the cluster nor a shard.
func badNonce(mk func(*loot) (string, error)) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		tok, err := mk(e.l)
		if err != nil {
			return err
		}
		for _, sv := range []*server{e.dev1, e.dev2} {
			cctx, cancel := context.WithTimeout(ctx, refuseWithin)
			_, err := e.l.registerOperatorWith(cctx, sv, tok)
			cancel()
			switch {
			case err == nil:
				return fmt.Errorf("%s issued a certificate", sv.shard)
			case status.Code(err) == codes.DeadlineExceeded || status.Code(err) == codes.Unavailable:
				return fmt.Errorf("%s did not answer: %v", sv.shard, err)
			case leaksIDs(err):
				return fmt.Errorf("%s refused, but the message names an id: %v", sv.shard, err)
			}
		}
		return nil
	}
}

// nonceRace presents one valid operator nonce 50 times at once, alternating
// between the two servers: exactly one certificate is issued and every
// other call is refused (not timed out).
func nonceRace(ctx context.Context, e *env) error {
	tok, err := e.l.mintNonce(nonce.KindOperator, tenantA, "race-op", "", time.Hour)
	if err != nil {
		return err
	}
	const n = 50
	errs := make([]error, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sv := e.s.servers[i%2]
			<-gate
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, errs[i] = e.l.registerOperatorWith(cctx, sv, tok)
		}()
	}
	close(gate)
	wg.Wait()
	ok := 0
	var other []string
	for _, err := range errs {
		switch status.Code(err) {
		case codes.OK:
			ok++
		case codes.DeadlineExceeded, codes.Unavailable, codes.Internal, codes.Unknown:
			other = append(other, err.Error())
		}
	}
	if ok != 1 || len(other) > 0 {
		return fmt.Errorf("%d of %d succeeded (want exactly 1); unclear failures: %v", ok, n, other)
	}
	return nil
}

// nonceOtherShard: an agent nonce minted for shard dev-1 (validly signed)
// is refused by dev-2, generically.
func nonceOtherShard(ctx context.Context, e *env) error {
	tok, err := e.l.mintNonce(nonce.KindAgent, tenantB, "svc-0a0b0c0d", e.dev1.shard, 10*time.Minute)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, refuseWithin)
	defer cancel()
	_, err = e.l.registerAgent(cctx, e.dev2, tok, nil, "")
	switch {
	case err == nil:
		return errors.New("dev-2 issued an agent certificate for a dev-1 nonce")
	case status.Code(err) == codes.DeadlineExceeded || status.Code(err) == codes.Unavailable:
		return fmt.Errorf("dev-2 did not answer: %v", err)
	case leaksIDs(err):
		return fmt.Errorf("refused, but the message names an id: %v", err)
	}
	return nil
}

// ---- workload certificates

// badVars sets one certificate var of template "svc" to a control-plane
// name through both tenant paths (UpsertGroup and CreateInstance vars):
// InvalidArgument, and nothing is created.
func badVars(name, value string) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		c := nstancev1.NewOperatorServiceClient(e.connA)
		vars := map[string]string{name: value}
		_, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "evil", Template: "svc", Size: 1, Vars: vars}})
		if status.Code(err) != codes.InvalidArgument {
			_, _ = c.DeleteGroup(ctx, &nstancev1.DeleteGroupRequest{GroupId: "evil"})
			return fmt.Errorf("UpsertGroup: want InvalidArgument, got %v", err)
		}
		if !strings.Contains(status.Convert(err).Message(), value) {
			return fmt.Errorf("UpsertGroup refusal does not name the value %q: %v", value, err)
		}
		groups, err := c.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
		if err != nil {
			return err
		}
		for _, g := range groups.Groups {
			if g.GetSpec().GetGroupId() == "evil" {
				return errors.New("the refused group exists")
			}
		}
		resp, err := c.CreateInstance(ctx, &nstancev1.CreateInstanceRequest{Template: "svc", Vars: vars})
		if status.Code(err) != codes.InvalidArgument {
			if resp.GetInstance() != nil {
				_, _ = c.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: resp.Instance.InstanceId, SkipDrain: true})
			}
			return fmt.Errorf("CreateInstance: want InvalidArgument, got %v", err)
		}
		return nil
	}
}

// explicitUsages: template "svc" names server and client auth; the
// certificate B's instance received has exactly those (never "any", never a
// CA), chains to its tenant's workload CA (its ca_bundle file) and not to the cluster CA.
func explicitUsages(ctx context.Context, e *env) error {
	cert, err := parsePEMCert(e.svcBPEM)
	if err != nil {
		return err
	}
	want := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	got := slices.Clone(cert.ExtKeyUsage)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) || len(cert.UnknownExtKeyUsage) > 0 {
		return fmt.Errorf("extended key usages %v (unknown %v), want server and client auth only", cert.ExtKeyUsage, cert.UnknownExtKeyUsage)
	}
	if cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign != 0 {
		return errors.New("the workload certificate can sign certificates")
	}
	// The workload CA is the instance's: its ca_bundle file (a CA per tenant).
	bundle, err := e.instanceFile(e.instB, "files/ca.crt")
	if err != nil {
		return err
	}
	wpool := x509.NewCertPool()
	wpool.AppendCertsFromPEM(bundle)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: wpool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("does not chain to the workload CA: %v", err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: e.l.roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err == nil {
		return errors.New("chains to the cluster CA")
	}
	for _, u := range cert.URIs {
		if strings.EqualFold(u.Host, clusterID) {
			return fmt.Errorf("carries URI %s of the cluster trust domain", u)
		}
	}
	return nil
}

// badConfig: an admin uploads a config whose template asks for usage "any"
// and a literal operator URI; RefreshConfig answers INVALID naming both,
// and the shard keeps its old config (restored and refreshed afterwards).
func badConfig(ctx context.Context, e *env) error {
	return refusedConfig(ctx, e, func(good string) string {
		bad := strings.Replace(good, svcUsages, `"usages": ["any"],`, 1)
		return strings.Replace(bad, `"{{ .Vars.san_uri }}"`, `"{{ .Vars.san_uri }}", "spiffe://`+clusterID+`/tenant/`+tenantA+`/operator/evil"`, 1)
	}, "usages", "operator/evil")
}

// noUsagesRefused: a template certificate that names no usages would be
// valid for any purpose; RefreshConfig refuses it and keeps the old config.
func noUsagesRefused(ctx context.Context, e *env) error {
	return refusedConfig(ctx, e, func(good string) string { return strings.Replace(good, svcUsages, "", 1) }, "usages", "required")
}

// refusedConfig uploads mutate(current config) to dev-1, expects
// RefreshConfig to answer INVALID mentioning every want, and checks the
// shard kept its old config (the good one is restored afterwards).
func refusedConfig(ctx context.Context, e *env, mutate func(string) string, wants ...string) error {
	key := e.s.keys.Config(e.dev1.shard)
	good, err := e.s.get(ctx, key)
	if err != nil {
		return err
	}
	bad := mutate(string(good))
	if bad == string(good) {
		return errors.New("could not derive the bad config")
	}
	admin, err := e.l.dial(e.dev1.operator, &e.adminA)
	if err != nil {
		return err
	}
	defer admin.Close()
	c := nstancev1.NewOperatorServiceClient(admin)
	before, err := c.GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
	if err != nil {
		return err
	}
	if _, err := e.s.store.Put(ctx, key, []byte(bad), putOpts()); err != nil {
		return err
	}
	resp, rerr := c.RefreshConfig(ctx, &nstancev1.RefreshConfigRequest{})
	if _, err := e.s.store.Put(ctx, key, good, putOpts()); err != nil {
		return fmt.Errorf("restoring the config: %w", err)
	}
	restored, err := c.RefreshConfig(ctx, &nstancev1.RefreshConfigRequest{})
	if err != nil || restored.Outcome == nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_INVALID {
		return fmt.Errorf("restoring the config: %v %v", restored, err)
	}
	if rerr != nil {
		return fmt.Errorf("RefreshConfig: %v", rerr)
	}
	if resp.Outcome != nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_INVALID {
		return fmt.Errorf("RefreshConfig outcome %v, want INVALID", resp.Outcome)
	}
	all := resp.Message
	for _, v := range resp.ValidationErrors {
		all += " " + v.String()
	}
	for _, want := range wants {
		if !strings.Contains(all, want) {
			return fmt.Errorf("the refusal does not mention %q: %s", want, all)
		}
	}
	after, err := c.GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
	if err != nil {
		return err
	}
	if after.Etag != before.Etag && after.Etag != restored.Etag {
		return fmt.Errorf("config etag %s after the refused refresh, want %s", after.Etag, before.Etag)
	}
	return nil
}

func refreshNotAdmin(ctx context.Context, e *env) error {
	_, err := nstancev1.NewOperatorServiceClient(e.connA).RefreshConfig(ctx, &nstancev1.RefreshConfigRequest{})
	if status.Code(err) != codes.PermissionDenied {
		return fmt.Errorf("want PermissionDenied, got %v", err)
	}
	return nil
}

// fakeServer listens on loopback with cert and reports the outcome of the
// first TLS handshake a client makes.
func fakeServer(cert tls.Certificate) (addr string, first <-chan error, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, nil, err
	}
	ch := make(chan error, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}})
			_ = tc.SetDeadline(time.Now().Add(refuseWithin))
			herr := tc.Handshake()
			if herr == nil {
				// TLS 1.3: the client sends Finished only after verifying
				// the server; a completed handshake means it accepted us.
				herr = errAccepted
			}
			tc.Close()
			select {
			case ch <- herr:
			default:
			}
		}
	}()
	return ln.Addr().String(), ch, func() { ln.Close() }, nil
}

var errAccepted = errors.New("the client completed the handshake")

// clientAlert reports whether a server-side handshake error is the
// client's alert about the certificate (the client refused it).
func clientAlert(err error) bool {
	return err != nil && strings.Contains(err.Error(), "remote error: tls:")
}

// impostor is a certificate presented by a fake server, the name the
// client is configured to expect, and the part of the client's refusal
// that shows which check refused it.
type impostor struct {
	name       string
	cert       tls.Certificate
	serverName string
	refusal    string // empty: the control, the client must accept
}

// workloadDNS is the DNS name every "svc" certificate carries (template
// default var san_dns).
const workloadDNS = "svc.workload.test"

// impostors are the instance certificates an attacker on an instance has or
// could get, each in the situation where only the check under test stands
// between it and the client:
//   - tenant B's workload certificate (stolen from the instance), with the
//     client expecting its DNS name, as if a server were named like it:
//     refused because no client trusts the workload CA;
//   - an agent identity of tenant B's instance, signed by the real cluster
//     CA and carrying the server's IP (what registration signed before it
//     took names from the instance record; minted with the CA key here):
//     refused for its usages (client auth only);
//   - the same identity with server auth as well, which the cluster CA never
//     issues (signed by hand with its key): the chain, usages and host name
//     verify, and the server identity check refuses it.
//
// The control is a genuine server certificate, which the client accepts.
func impostors(e *env) ([]impostor, error) {
	genuine, err := e.l.ca.ServerKeyPair(pki.ServerIdentity{Shard: e.dev1.shard, ServerID: "fake-but-genuine"}, []string{serverName}, time.Hour, time.Now())
	if err != nil {
		return nil, err
	}
	id, err := identityOf(e.agentB)
	if err != nil {
		return nil, err
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	_, agentPEM, err := e.l.ca.IssueClient(pki.ClientRequest{Identity: id, PublicKey: pub, Validity: time.Hour, IPs: []net.IP{net.ParseIP(serverName)}}, time.Now())
	if err != nil {
		return nil, err
	}
	agentCert, err := keyPair(agentPEM, priv)
	if err != nil {
		return nil, err
	}
	// The cluster CA never signs server auth for a client identity; this
	// hand-made one proves the last check (server identity) on its own.
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: id.ClientID, Organization: []string{id.Tenant}},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{id.URI()}, IPAddresses: []net.IP{net.ParseIP(serverName)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, e.l.ca.Cert, pub, e.l.ca.Key)
	if err != nil {
		return nil, err
	}
	forged, err := keyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), priv)
	if err != nil {
		return nil, err
	}
	return []impostor{
		{name: "genuine server certificate (control)", cert: genuine, serverName: serverName},
		{name: "workload certificate", cert: e.svcB, serverName: workloadDNS, refusal: "certificate signed by unknown authority"},
		{name: "agent certificate with the server's IP", cert: agentCert, serverName: serverName, refusal: "incompatible key usage"},
		{name: "cluster-CA certificate of an agent identity with server auth and the server's IP", cert: forged, serverName: serverName, refusal: "is not a server identity"},
	}, nil
}

// fakeServerToAgent points a real nstance-agent (fresh identity directory
// with the cluster CA and a nonce) at a TLS server presenting each impostor
// certificate: the agent aborts the handshake for the reason expected, so
// its nonce never leaves it; it completes the handshake with the control.
func fakeServerToAgent(ctx context.Context, e *env) error {
	imps, err := impostors(e)
	if err != nil {
		return err
	}
	caPEM, err := e.s.get(ctx, e.s.keys.CACert())
	if err != nil {
		return err
	}
	for _, imp := range imps {
		if err := victimAgent(ctx, e, imp, caPEM); err != nil {
			return fmt.Errorf("%s: %w", imp.name, err)
		}
	}
	return nil
}

func victimAgent(ctx context.Context, e *env, imp impostor, caPEM []byte) error {
	addr, first, stop, err := fakeServer(imp.cert)
	if err != nil {
		return err
	}
	defer stop()
	dir, err := os.MkdirTemp(e.s.dir, "victim-agent-")
	if err != nil {
		return err
	}
	tok, err := e.l.mintNonce(nonce.KindAgent, tenantB, "svc-0f0f0f0f", e.dev1.shard, 10*time.Minute)
	if err != nil {
		return err
	}
	id := filepath.Join(dir, "identity")
	if err := os.MkdirAll(id, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(id, "nonce.jwt"), []byte(tok), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(id, "ca.crt"), caPEM, 0o644); err != nil {
		return err
	}
	p := e.s.procs.MustStart(filepath.Base(dir), "nstance-agent", []string{
		"NSTANCE_INSTANCE_ID=svc-0f0f0f0f", "NSTANCE_PROVIDER_ID=nstance://" + clusterID + "/dev-1/svc-0f0f0f0f", "NSTANCE_SHARD=dev-1",
		"NSTANCE_IDENTITY_DIR=" + id, "NSTANCE_REGISTRATION_ADDR=" + addr, "NSTANCE_AGENT_ADDR=" + addr,
		"NSTANCE_SERVER_NAME=" + imp.serverName,
	})
	defer p.Stop(stopGrace)
	select {
	case err := <-first:
		if imp.refusal == "" {
			if !errors.Is(err, errAccepted) {
				return fmt.Errorf("the agent refused it: %v", err)
			}
			return nil
		}
		if errors.Is(err, errAccepted) {
			return errors.New("the agent accepted it as its server")
		}
		if !clientAlert(err) {
			return fmt.Errorf("the handshake failed without the agent refusing the certificate: %v", err)
		}
	case <-p.Done:
		return fmt.Errorf("the agent exited before connecting:\n%s", proctest.Tail(p.Log, 10))
	case <-ctx.Done():
		return errors.New("the agent never connected to the fake server")
	}
	// The agent logs why it refused; it must be the check under test.
	if err := proctest.Wait(ctx, "the agent's refusal in its log", refuseWithin, func() bool {
		b, _ := os.ReadFile(p.Log)
		return strings.Contains(string(b), imp.refusal)
	}); err != nil {
		return fmt.Errorf("%v:\n%s", err, proctest.Tail(p.Log, 5))
	}
	if _, err := os.Stat(filepath.Join(id, "nonce.jwt")); err != nil {
		return fmt.Errorf("the agent's nonce: %v", err)
	}
	return nil
}

// fakeServerToOperator dials a TLS server presenting each impostor with
// the client configuration of the operator and nstance-admin
// (pki.ClientTLS): refused for the reason expected, the control accepted.
func fakeServerToOperator(ctx context.Context, e *env) error {
	imps, err := impostors(e)
	if err != nil {
		return err
	}
	for _, imp := range imps {
		addr, first, stop, err := fakeServer(imp.cert)
		if err != nil {
			return err
		}
		d := tls.Dialer{Config: pki.ClientTLS(e.l.roots, &e.opA, imp.serverName), NetDialer: &net.Dialer{Timeout: refuseWithin}}
		c, derr := d.DialContext(ctx, "tcp", addr)
		if derr == nil {
			c.Close()
		}
		serr := <-first
		stop()
		switch {
		case imp.refusal == "":
			if derr != nil || !errors.Is(serr, errAccepted) {
				return fmt.Errorf("%s: refused: %v / %v", imp.name, derr, serr)
			}
		case derr == nil || errors.Is(serr, errAccepted):
			return fmt.Errorf("%s: accepted as a server", imp.name)
		case !strings.Contains(derr.Error(), imp.refusal) || !clientAlert(serr):
			return fmt.Errorf("%s: refused for another reason: %v / %v", imp.name, derr, serr)
		}
	}
	return nil
}

// ---- robustness and tenancy

// handlerPanic uses the servers' test-only panic hook (PanicHookEnv, set
// by this suite alone): the call answers Internal without the panic text,
// and the same connection, the same server and its health keep working.
func handlerPanic(ctx context.Context, e *env) error {
	for _, sv := range []*server{e.dev1, e.dev2} {
		conn, err := e.l.dial(sv.operator, &e.opA)
		if err != nil {
			return err
		}
		c := nstancev1.NewOperatorServiceClient(conn)
		pctx := metadata.AppendToOutgoingContext(ctx, grpcserve.PanicHookHeader, "1")
		_, err = c.GetConfigStatus(pctx, &nstancev1.GetConfigStatusRequest{})
		if status.Code(err) != codes.Internal {
			conn.Close()
			return fmt.Errorf("%s: want Internal, got %v", sv.shard, err)
		}
		if strings.Contains(status.Convert(err).Message(), "panic") {
			conn.Close()
			return fmt.Errorf("%s: the answer reveals the panic: %v", sv.shard, err)
		}
		resp, err := c.GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
		conn.Close()
		if err != nil || resp.Shard != sv.shard {
			return fmt.Errorf("%s: not serving after the panic: %v %v", sv.shard, resp, err)
		}
		select {
		case <-sv.proc.Done:
			return fmt.Errorf("%s exited", sv.shard)
		default:
		}
		if !proctest.HTTPOK("http://" + sv.health + "/health") {
			return fmt.Errorf("%s: /health not 200 after the panic", sv.shard)
		}
	}
	return nil
}

// crossTenantIDs: tenant A names tenant B's group and instance in every
// call that takes an id: NotFound (or empty lists), and B's objects are
// untouched.
func crossTenantIDs(ctx context.Context, e *env) error {
	a := nstancev1.NewOperatorServiceClient(e.connA)
	notFound := map[string]error{}
	_, notFound["GetInstanceStatus"] = a.GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: e.instB}})
	_, notFound["DeleteInstance"] = a.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: e.instB, SkipDrain: true})
	_, notFound["AcknowledgeDrained"] = a.AcknowledgeDrained(ctx, &nstancev1.AcknowledgeDrainedRequest{InstanceId: e.instB})
	_, notFound["DeleteGroup"] = a.DeleteGroup(ctx, &nstancev1.DeleteGroupRequest{GroupId: groupB})
	if err := expectAll(notFound, func(err error) bool { return status.Code(err) == codes.NotFound }, "want NotFound"); err != nil {
		return err
	}
	list, err := a.ListInstances(ctx, &nstancev1.ListInstancesRequest{GroupIds: []string{groupB}})
	if err != nil {
		return err
	}
	for _, in := range list.Instances {
		return fmt.Errorf("ListInstances of group %s shows %s", groupB, in.InstanceId)
	}
	all, err := a.ListInstances(ctx, &nstancev1.ListInstancesRequest{})
	if err != nil {
		return err
	}
	for _, in := range all.Instances {
		if in.InstanceId == e.instB {
			return fmt.Errorf("ListInstances shows tenant B's %s", e.instB)
		}
	}
	groups, err := a.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
	if err != nil {
		return err
	}
	for _, g := range groups.Groups {
		if g.GetSpec().GetGroupId() == groupB {
			return fmt.Errorf("ListGroups shows tenant B's group %s", groupB)
		}
	}
	b := nstancev1.NewOperatorServiceClient(e.connB)
	st, err := b.GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: e.instB}})
	if err != nil || st.Instance.State != nstancev1.InstanceState_INSTANCE_STATE_RUNNING {
		return fmt.Errorf("tenant B's instance after the attempts: %v %v", st, err)
	}
	return nil
}

// collector records every message of a stream until its context ends.
type collector[T any] struct {
	mu   sync.Mutex
	msgs []T
	err  error
}

func collect[T any](s interface{ Recv() (T, error) }, err error) *collector[T] {
	c := &collector[T]{err: err}
	if err != nil {
		return c
	}
	go func() {
		for {
			m, err := s.Recv()
			c.mu.Lock()
			if err != nil {
				c.err = err
				c.mu.Unlock()
				return
			}
			c.msgs = append(c.msgs, m)
			c.mu.Unlock()
		}
	}()
	return c
}

func (c *collector[T]) snapshot() ([]T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.msgs), c.err
}

// waitSeen waits until a collected message satisfies match.
func waitSeen[T any](ctx context.Context, c *collector[T], what string, match func(T) bool) error {
	return proctest.Wait(ctx, what, 30*time.Second, func() bool {
		msgs, _ := c.snapshot()
		return slices.ContainsFunc(msgs, match)
	})
}

// crossTenantEvents: tenant A watches groups, instances and errors (all,
// and filtered by B's group id) while B changes its group and creates and
// deletes an instance. After B's own watches saw those events, A makes its
// own changes; once A's watches saw them, they must hold none of B's.
func crossTenantEvents(ctx context.Context, e *env) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a := nstancev1.NewOperatorServiceClient(e.connA)
	b := nstancev1.NewOperatorServiceClient(e.connB)
	aGroups := collect(a.WatchGroups(wctx, &nstancev1.WatchGroupsRequest{}))
	aGroupsB := collect(a.WatchGroups(wctx, &nstancev1.WatchGroupsRequest{GroupIds: []string{groupB}}))
	aInst := collect(a.WatchInstances(wctx, &nstancev1.WatchInstancesRequest{}))
	aInstB := collect(a.WatchInstances(wctx, &nstancev1.WatchInstancesRequest{GroupIds: []string{groupB}}))
	aErrs := collect(a.WatchErrors(wctx, &nstancev1.WatchErrorsRequest{}))
	bGroups := collect(b.WatchGroups(wctx, &nstancev1.WatchGroupsRequest{}))
	bInst := collect(b.WatchInstances(wctx, &nstancev1.WatchInstancesRequest{}))

	// B acts.
	if _, err := b.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: groupB, Template: "svc", Size: 1,
		Labels: map[string]string{"touched": "yes"}}}); err != nil {
		return fmt.Errorf("tenant B updating its group: %w", err)
	}
	bi, err := b.CreateInstance(ctx, &nstancev1.CreateInstanceRequest{Template: "svc", ClientToken: "b-ondemand"})
	if err != nil {
		return fmt.Errorf("tenant B creating an instance: %w", err)
	}
	bID := bi.Instance.InstanceId
	if _, err := b.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: bID, SkipDrain: true}); err != nil {
		return fmt.Errorf("tenant B deleting %s: %w", bID, err)
	}
	if err := waitSeen(ctx, bGroups, "tenant B's group event", func(m *nstancev1.GroupEvent) bool {
		return m.GroupId == groupB && m.GetGroup().GetSpec().GetLabels()["touched"] == "yes"
	}); err != nil {
		return err
	}
	if err := waitSeen(ctx, bInst, "tenant B's instance event", func(m *nstancev1.InstanceEvent) bool { return m.InstanceId == bID }); err != nil {
		return err
	}

	// A acts; its watches see A's events after B's would have arrived.
	if _, err := a.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "amark", Template: "svc", Size: 0}}); err != nil {
		return fmt.Errorf("tenant A creating its marker group: %w", err)
	}
	ai, err := a.CreateInstance(ctx, &nstancev1.CreateInstanceRequest{Template: "svc", ClientToken: "a-ondemand"})
	if err != nil {
		return fmt.Errorf("tenant A creating an instance: %w", err)
	}
	aID := ai.Instance.InstanceId
	if _, err := a.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: aID, SkipDrain: true}); err != nil {
		return fmt.Errorf("tenant A deleting %s: %w", aID, err)
	}
	if err := waitSeen(ctx, aGroups, "tenant A's marker group event", func(m *nstancev1.GroupEvent) bool { return m.GroupId == "amark" }); err != nil {
		return err
	}
	if err := waitSeen(ctx, aInst, "tenant A's instance event", func(m *nstancev1.InstanceEvent) bool { return m.InstanceId == aID }); err != nil {
		return err
	}

	var leaks []string
	for _, c := range []*collector[*nstancev1.GroupEvent]{aGroups, aGroupsB} {
		msgs, err := c.snapshot()
		if err != nil && status.Code(err) != codes.Canceled {
			leaks = append(leaks, "group watch ended: "+err.Error())
		}
		for _, m := range msgs {
			if m.GroupId == groupB {
				leaks = append(leaks, "group event of "+groupB)
			}
		}
	}
	for _, c := range []*collector[*nstancev1.InstanceEvent]{aInst, aInstB} {
		msgs, err := c.snapshot()
		if err != nil && status.Code(err) != codes.Canceled {
			leaks = append(leaks, "instance watch ended: "+err.Error())
		}
		for _, m := range msgs {
			if m.InstanceId == bID || m.InstanceId == e.instB || m.GroupId == groupB {
				leaks = append(leaks, "instance event of "+m.InstanceId)
			}
		}
	}
	msgs, err := aErrs.snapshot()
	if err != nil && status.Code(err) != codes.Canceled {
		leaks = append(leaks, "error watch ended: "+err.Error())
	}
	for _, m := range msgs {
		if m.GroupId == groupB || m.InstanceId == bID || m.InstanceId == e.instB {
			leaks = append(leaks, "error event of "+m.GroupId+"/"+m.InstanceId)
		}
	}
	_, _ = a.DeleteGroup(ctx, &nstancev1.DeleteGroupRequest{GroupId: "amark"})
	if len(leaks) > 0 {
		return fmt.Errorf("tenant A saw: %s", strings.Join(leaks, "; "))
	}
	return nil
}

// ---- cases that need features of other branches

// revokedOperator: a registered operator works, its record is deleted from
// storage (what `nstance-admin` revoke does), and its next handshake and its
// RenewCertificate are refused.
func revokedOperator(ctx context.Context, e *env) error {
	reg, err := e.l.registerOperator(ctx, e.dev1, nonce.KindOperator, tenantA, "doomed-op")
	if err != nil {
		return err
	}
	conn, err := e.l.dial(e.dev1.operator, &reg.cert)
	if err != nil {
		return err
	}
	_, err = nstancev1.NewOperatorServiceClient(conn).GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
	conn.Close()
	if err != nil {
		return fmt.Errorf("control: the new operator was refused: %v", err)
	}
	if err := e.s.store.Delete(ctx, e.s.keys.Operator(tenantA, "doomed-op")); err != nil {
		return err
	}
	for _, sv := range []*server{e.dev1, e.dev2} {
		conn, err := e.l.dial(sv.operator, &reg.cert)
		if err != nil {
			return err
		}
		calls := operatorCalls(ctx, conn, refuseWithin)
		conn.Close()
		if err := expectAll(calls, refusedAuth, sv.shard+": revoked operator served"); err != nil {
			return err
		}
	}
	return nil
}

// revokedAgent: tenant B's new instance registers, is deleted, and its
// agent certificate is refused by the Agent service afterwards.
func revokedAgent(ctx context.Context, e *env) error {
	b := nstancev1.NewOperatorServiceClient(e.connB)
	ci, err := b.CreateInstance(ctx, &nstancev1.CreateInstanceRequest{Template: "svc", ClientToken: "b-revoke"})
	if err != nil {
		return err
	}
	id := ci.Instance.InstanceId
	dir := filepath.Join(e.s.stateDir(e.dev1), id, "identity")
	if err := proctest.Wait(ctx, "the new agent's certificate", 60*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(dir, "agent.crt"))
		return err == nil
	}); err != nil {
		return err
	}
	stolen, err := tls.LoadX509KeyPair(filepath.Join(dir, "agent.crt"), filepath.Join(dir, "agent.key"))
	if err != nil {
		return err
	}
	if _, err := b.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: id, SkipDrain: true}); err != nil {
		return err
	}
	if err := proctest.Wait(ctx, "the instance deleted", 60*time.Second, func() bool {
		_, err := b.GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: id}})
		return status.Code(err) == codes.NotFound
	}); err != nil {
		return err
	}
	conn, err := e.l.dial(e.dev1.agent, &stolen)
	if err != nil {
		return err
	}
	defer conn.Close()
	return expectAll(agentCalls(ctx, conn, refuseWithin), refusedAuth, "the deleted instance's certificate was served")
}

// limitResult counts how the streams of a limitRun ended.
type limitResult struct {
	served  int // a first message arrived
	refused int // ResourceExhausted
	waited  int // not admitted within 20s (e.g. waiting for HTTP/2 stream quota)
	other   []string
	grew    int64 // server RSS growth at the peak, bytes
}

// limitRun opens total WatchGroups streams over conns (round robin) and
// holds every admitted one open until all have an outcome, sampling the
// server's RSS meanwhile.
func limitRun(ctx context.Context, sv *server, conns []*grpc.ClientConn, total int) (limitResult, error) {
	var r limitResult
	before, err := rss(sv.proc.Cmd.Process.Pid)
	if err != nil {
		return r, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	release := make(chan struct{})
	var mu sync.Mutex
	var recorded, done sync.WaitGroup
	for i := range total {
		recorded.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			c := nstancev1.NewOperatorServiceClient(conns[i%len(conns)])
			cctx, ccancel := context.WithCancel(sctx)
			defer ccancel()
			// Admission (stream creation and the first message) gets 20s;
			// an admitted stream stays open until release.
			admitted := make(chan struct{})
			go func() {
				t := time.NewTimer(20 * time.Second)
				defer t.Stop()
				select {
				case <-admitted:
				case <-t.C:
					ccancel()
				}
			}()
			s, err := c.WatchGroups(cctx, &nstancev1.WatchGroupsRequest{})
			if err == nil {
				_, err = s.Recv()
			}
			close(admitted)
			mu.Lock()
			switch code := status.Code(err); {
			case err == nil:
				r.served++
			case code == codes.ResourceExhausted:
				r.refused++
			case code == codes.Canceled || code == codes.DeadlineExceeded:
				r.waited++
			default:
				if len(r.other) < 5 {
					r.other = append(r.other, err.Error())
				}
			}
			mu.Unlock()
			recorded.Done()
			<-release
		}()
	}
	all := make(chan struct{})
	go func() { recorded.Wait(); close(all) }()
	peak := before
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for waiting := true; waiting; {
		select {
		case <-all:
			waiting = false
		case <-tick.C:
			if v, err := rss(sv.proc.Cmd.Process.Pid); err == nil && v > peak {
				peak = v
			}
		}
	}
	if v, err := rss(sv.proc.Cmd.Process.Pid); err == nil && v > peak {
		peak = v
	}
	close(release)
	cancel()
	done.Wait()
	r.grew = peak - before
	return r, nil
}

// rssBound is how much a server may grow under 10,000 streams or watches.
const rssBound = 256 << 20

func markerGroup(ctx context.Context, e *env) error {
	// A group of tenant A makes every watch's snapshot non-empty.
	a := nstancev1.NewOperatorServiceClient(e.connA)
	_, err := a.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "amark", Template: "svc", Size: 0}})
	return err
}

// manyStreams: one connection, 10,000 watches. Beyond the per-connection
// stream limit they are refused (ResourceExhausted) or never admitted
// (HTTP/2 MAX_CONCURRENT_STREAMS), the server's RSS stays bounded, and it
// serves the next call.
func manyStreams(ctx context.Context, e *env) error {
	if err := markerGroup(ctx, e); err != nil {
		return err
	}
	conn, err := e.l.dial(e.dev1.operator, &e.opA)
	if err != nil {
		return err
	}
	defer conn.Close()
	r, err := limitRun(ctx, e.dev1, []*grpc.ClientConn{conn}, 10000)
	if err != nil {
		return err
	}
	if r.served == 0 || r.served >= 10000 || len(r.other) > 0 || r.grew > rssBound {
		return fmt.Errorf("%d streams served, %d refused, %d never admitted, other %v; RSS grew %d MiB", r.served, r.refused, r.waited, r.other, r.grew>>20)
	}
	_, err = nstancev1.NewOperatorServiceClient(e.connA).GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
	if err != nil {
		return fmt.Errorf("not serving afterwards: %v", err)
	}
	return nil
}

// manyWatches: one operator, 100 connections, 10,000 watches: beyond the
// per-operator watch limit they are refused with ResourceExhausted, RSS
// stays bounded, and the server serves the next call.
func manyWatches(ctx context.Context, e *env) error {
	if err := markerGroup(ctx, e); err != nil {
		return err
	}
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 100 {
		c, err := e.l.dial(e.dev1.operator, &e.opA)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	r, err := limitRun(ctx, e.dev1, conns, 10000)
	if err != nil {
		return err
	}
	if r.served == 0 || r.refused == 0 || r.served+r.refused != 10000 || r.grew > rssBound {
		return fmt.Errorf("%d watches served, %d refused, %d never admitted, other %v; RSS grew %d MiB", r.served, r.refused, r.waited, r.other, r.grew>>20)
	}
	_, err = nstancev1.NewOperatorServiceClient(e.connA).GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
	if err != nil {
		return fmt.Errorf("not serving afterwards: %v", err)
	}
	return nil
}

// nonceUnknownInstance: a validly signed agent nonce of dev-1 for an
// instance id dev-1 never created is refused.
func nonceUnknownInstance(ctx context.Context, e *env) error {
	tok, err := e.l.mintNonce(nonce.KindAgent, tenantB, "svc-0badc0de", e.dev1.shard, 10*time.Minute)
	if err != nil {
		return err
	}
	if _, err := e.l.registerAgent(ctx, e.dev1, tok, nil, ""); err == nil {
		return errors.New("dev-1 issued a certificate for an instance it does not know")
	}
	return nil
}

// nonceRegisteredInstance: a second, validly signed nonce for tenant B's
// already registered instance is refused (the nonce was not minted for it).
func nonceRegisteredInstance(ctx context.Context, e *env) error {
	tok, err := e.l.mintNonce(nonce.KindAgent, tenantB, e.instB, e.dev1.shard, 10*time.Minute)
	if err != nil {
		return err
	}
	if _, err := e.l.registerAgent(ctx, e.dev1, tok, []string{"10.66.66.66"}, "evil.example"); err == nil {
		return errors.New("dev-1 issued a second certificate for a registered instance")
	}
	return nil
}

// namesFromRecord: the addresses in tenant B's agent certificate are the
// ones the provider reported for the instance (the server's record), not
// whatever the agent asked for.
func namesFromRecord(ctx context.Context, e *env) error {
	b := nstancev1.NewOperatorServiceClient(e.connB)
	st, err := b.GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: e.instB}})
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, a := range st.Instance.Addresses {
		known[a.Address] = true
	}
	leaf, err := parseDER(e.agentB.Certificate[0])
	if err != nil {
		return err
	}
	for _, ip := range leaf.IPAddresses {
		if !known[ip.String()] {
			return fmt.Errorf("certificate IP %s is not in the record's addresses %v", ip, st.Instance.Addresses)
		}
	}
	for _, d := range leaf.DNSNames {
		if !known[d] {
			return fmt.Errorf("certificate DNS name %s is not in the record's addresses %v", d, st.Instance.Addresses)
		}
	}
	return nil
}

func parseDER(der []byte) (*x509.Certificate, error) { return x509.ParseCertificate(der) }

func putOpts() objstore.PutOptions { return objstore.PutOptions{} }
