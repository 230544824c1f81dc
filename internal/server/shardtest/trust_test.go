package shardtest_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/agent/identity"
	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/pkg/objstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// fakeServer serves the Operator and Registration services with cert, as a
// machine that got hold of a certificate would.
func fakeServer(t *testing.T, cert tls.Certificate) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(pki.ServerTLS(cert, nil, false))))
	nstancev1.RegisterOperatorServiceServer(g, &nstancev1.UnimplementedOperatorServiceServer{})
	nstancev1.RegisterRegistrationServiceServer(g, &nstancev1.UnimplementedRegistrationServiceServer{})
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return ln.Addr().String()
}

// clientHandshake connects with tc and reads the server's first bytes: in
// TLS 1.3 a refused client certificate shows up as an alert on that read.
func clientHandshake(t *testing.T, addr string, tc *tls.Config) error {
	t.Helper()
	tc = tc.Clone()
	tc.NextProtos = []string{"h2"}
	conn, err := tls.Dial("tcp", addr, tc)
	if err != nil {
		return err
	}
	defer conn.Close()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = conn.Read(make([]byte, 1))
	return err
}

// call makes one RPC over tc to addr and returns its error.
func call(t *testing.T, addr string, tc *tls.Config) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = nstancev1.NewOperatorServiceClient(conn).GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
	return err
}

// TestInstanceCertificatesAreNoControlPlane takes the certificates a real
// agent holds (its identity and a server_auth template certificate it was
// issued) and uses them as an attacker on the instance would: as a client of
// the Operator port, and as a server that agents and operators dial.
func TestInstanceCertificatesAreNoControlPlane(t *testing.T) {
	a := startAgentShard(t)
	a.upsert(t, 1, "")
	waitGroup(t, a.c, "workers", 1)
	ids := a.ids(t)
	require.Len(t, ids, 1)
	id := ids[0]
	require.Eventually(t, func() bool { return a.file(id, "tls.crt") != "" }, 15*time.Second, 20*time.Millisecond)

	instDir := filepath.Join(a.stateDir, id)
	workload, err := tls.LoadX509KeyPair(filepath.Join(instDir, "files", "tls.crt"), filepath.Join(instDir, "keys", "tls.key"))
	require.NoError(t, err)
	agentID, err := tls.LoadX509KeyPair(filepath.Join(instDir, "identity", identity.CertFile), filepath.Join(instDir, "identity", identity.KeyFile))
	require.NoError(t, err)

	// As a client of the Operator port: the workload certificate is of an
	// unknown CA, the agent certificate of the wrong role. (The attacker
	// presents the certificate whatever CAs the server asks for.)
	asClient := pki.ClientTLS(a.sh.CA.Pool(), nil, "127.0.0.1")
	asClient.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &workload, nil }
	err = call(t, a.sh.OperatorAddr, asClient)
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.ErrorContains(t, clientHandshake(t, a.sh.OperatorAddr, asClient), "unknown certificate authority")
	err = call(t, a.sh.OperatorAddr, pki.ClientTLS(a.sh.CA.Pool(), &agentID, "127.0.0.1"))
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)

	// As a server: the operator's client and the agent's own TLS settings refuse both.
	idDir, err := identity.Open(filepath.Join(instDir, "identity"))
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		cert    tls.Certificate
		wantErr string
	}{
		"workload certificate": {workload, "certificate signed by unknown authority"},
		"agent certificate":    {agentID, "incompatible key usage"},
	} {
		t.Run(name, func(t *testing.T) {
			addr := fakeServer(t, tc.cert)
			host := "127.0.0.1"
			if len(tc.cert.Leaf.DNSNames) > 0 {
				host = tc.cert.Leaf.DNSNames[0]
			}
			opTLS := pki.ClientTLS(a.sh.CA.Pool(), nil, host)
			err := call(t, addr, opTLS)
			require.ErrorContains(t, err, tc.wantErr, "operator client")
			regTLS, err := idDir.RegistrationTLS(host)
			require.NoError(t, err)
			require.ErrorContains(t, call(t, addr, regTLS), tc.wantErr, "agent registration client")
			agTLS, err := idDir.AgentTLS(host)
			require.NoError(t, err)
			require.ErrorContains(t, call(t, addr, agTLS), tc.wantErr, "agent client")
		})
	}
	// The real server passes the same client checks.
	for _, addr := range []string{a.sh.RegistrationAddr, a.sh.AgentAddr} {
		agTLS, err := idDir.AgentTLS("127.0.0.1")
		require.NoError(t, err)
		conn, err := tls.Dial("tcp", addr, agTLS)
		require.NoError(t, err, addr)
		require.NoError(t, conn.Close())
	}
}

// namesConfig has a template whose certificate names come from vars, and a
// shard that advertises nstance.example.com.
func namesConfig() string {
	return strings.Replace(strings.Replace(shardtest.Config("test-cluster", "test-1", "mock"),
		`"worker": { "kind": "worker", "arch": "amd64", "instance_type": "test.small", "subnet_pool": "default", "vars": { "role": "worker" } },`,
		`"worker": { "kind": "worker", "arch": "amd64", "instance_type": "test.small", "subnet_pool": "default", "vars": { "role": "worker" } },
    "web": { "kind": "worker", "instance_type": "test.small", "subnet_pool": "default",
      "vars": { "dns": "web.example.com", "ip": "10.1.0.1", "uri": "spiffe://apps/web" },
      "keys": { "tls": { "type": "ed25519", "certificate": {
        "common_name": "{{ .InstanceID }}", "dns_names": ["{{ .Vars.dns }}"], "ip_addresses": ["{{ .Vars.ip }}"], "uris": ["{{ .Vars.uri }}"], "usages": ["server_auth"] } } } },`, 1),
		`"default_drain_timeout": "30s",`, `"default_drain_timeout": "30s", "advertise": { "hosts": ["nstance.example.com"] },`, 1)
}

func TestTemplateCertificateNamesAreRefused(t *testing.T) {
	sh := shardtest.Start(t, shardtest.Options{ConfigJSONC: namesConfig()})
	c := sh.Client(t, "acme")
	spec := func(vars map[string]string) *nstancev1.UpsertGroupRequest {
		return &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "web", Template: "web", Size: 0, Vars: vars}}
	}
	_, err := c.UpsertGroup(ctxT(t), spec(nil))
	require.NoError(t, err, "the template's own vars are fine")

	for name, tc := range map[string]struct {
		vars map[string]string
		want string
	}{
		"operator URI": {map[string]string{"uri": "spiffe://test-cluster/tenant/acme/operator/op-1"}, `uris[0] is "spiffe://test-cluster/tenant/acme/operator/op-1"`},
		"server URI":   {map[string]string{"uri": "spiffe://test-cluster/shard/test-1/server/x"}, "trust domain"},
		"server DNS":   {map[string]string{"dns": "nstance.example.com"}, `dns_names[0] is "nstance.example.com"`},
		"server IP":    {map[string]string{"ip": "127.0.0.1"}, `ip_addresses[0] is "127.0.0.1"`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := c.UpsertGroup(ctxT(t), spec(tc.vars))
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			require.Contains(t, err.Error(), "vars: with these vars, templates.web.keys.tls.certificate.")
			require.Contains(t, err.Error(), tc.want)

			_, err = c.CreateInstance(ctxT(t), &nstancev1.CreateInstanceRequest{Template: "web", Vars: tc.vars})
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			require.Contains(t, err.Error(), tc.want)
		})
	}

	// A static group in the config is checked when the config is loaded.
	bad := strings.Replace(namesConfig(), `"groups": {},`,
		`"groups": { "acme": { "bad": { "template": "web", "vars": { "uri": "spiffe://test-cluster/tenant/acme/operator/op-1" } } } },`, 1)
	_, err = sh.Store.Put(ctxT(t), sh.Keys.Config(sh.ShardID), []byte(bad), objstore.PutOptions{})
	require.NoError(t, err)
	res, err := sh.AdminClient(t, "acme").RefreshConfig(ctxT(t), &nstancev1.RefreshConfigRequest{})
	require.NoError(t, err)
	require.Equal(t, nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_INVALID, res.GetOutcome(), res.GetMessage())
	require.Len(t, res.GetValidationErrors(), 1)
	require.Equal(t, "groups.acme.bad.vars", res.GetValidationErrors()[0].GetKey())
	require.Contains(t, res.GetValidationErrors()[0].GetReason(), "trust domain")
}

// TestAgentServiceChecksTheShard: a valid agent certificate of another
// shard of the same cluster is refused by the Agent service.
func TestAgentServiceChecksTheShard(t *testing.T) {
	sh := shardtest.Start(t, shardtest.Options{})
	agentOf := func(shard string) *tls.Config {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		cert, _, err := sh.CA.IssueClient(pki.ClientRequest{Identity: pki.Identity{ClusterID: sh.ClusterID, Tenant: "acme", Role: pki.RoleAgent,
			ClientID: "i-1", Shard: shard, Group: "g"}, PublicKey: pub, Validity: time.Hour}, time.Now())
		require.NoError(t, err)
		return pki.ClientTLS(sh.CA.Pool(), &tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: priv}, "127.0.0.1")
	}
	submit := func(tc *tls.Config) error {
		conn, err := grpc.NewClient(sh.AgentAddr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		require.NoError(t, err)
		defer conn.Close()
		_, err = nstancev1.NewAgentServiceClient(conn).SubmitPublicKeys(ctxT(t), &nstancev1.SubmitPublicKeysRequest{})
		return err
	}
	err := submit(agentOf("test-2"))
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	require.Contains(t, err.Error(), "not issued for this shard")
	// The right shard gets past the check (and then finds no such instance).
	err = submit(agentOf(sh.ShardID))
	require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
}

// TestRegistrationRefusalsOverTLS: anonymous callers of the Registration
// port get generic refusals for nonces that are too long-lived, of another
// shard, or forged, and exactly one of many concurrent uses of a nonce wins.
func TestRegistrationRefusalsOverTLS(t *testing.T) {
	sh := shardtest.Start(t, shardtest.Options{})
	conn, err := grpc.NewClient(sh.RegistrationAddr, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientTLS(sh.CA.Pool(), nil, "127.0.0.1"))))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	reg := nstancev1.NewRegistrationServiceClient(conn)
	pubPEM := func() string {
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		p, err := pki.MarshalPublicKeyPEM(pub)
		require.NoError(t, err)
		return string(p)
	}
	_, foreignKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	mint := func(key ed25519.PrivateKey, shard string, ttl time.Duration) string {
		tok, err := nonce.Mint(key, nonce.Claims{Kind: nonce.KindAgent, ClusterID: sh.ClusterID, Tenant: "acme", Shard: shard,
			RegisteredClaims: jwt.RegisteredClaims{Subject: "i-1"}}, ttl, time.Now())
		require.NoError(t, err)
		return tok
	}
	for name, tok := range map[string]string{
		"lifetime over the maximum": mint(sh.NonceKey, sh.ShardID, 25*time.Hour),
		"nonce of another shard":    mint(sh.NonceKey, "test-2", time.Minute),
		"foreign signing key":       mint(foreignKey, sh.ShardID, time.Minute),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := reg.RegisterAgent(ctxT(t), &nstancev1.RegisterAgentRequest{Nonce: tok, PublicKeyPem: pubPEM()})
			require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
			msg := status.Convert(err).Message()
			require.Equal(t, "registration refused: the nonce is not valid here", msg)
			for _, id := range []string{sh.ClusterID, sh.ShardID, "test-2", "acme"} {
				require.NotContains(t, msg, id)
			}
		})
	}

	// The nonce's instance exists at the provider and has a record; the
	// caller comes from its address. (A record alone is an instance whose
	// VM is gone: a resync pass in between marked it and refused the
	// registrations, about one run in twenty.)
	_, err = sh.Provider.Create(ctxT(t), provider.CreateRequest{InstanceID: "i-1", ProviderID: provider.ID(sh.ClusterID, sh.ShardID, "i-1"),
		Cluster: sh.ClusterID, Shard: sh.ShardID, Tenant: "acme"})
	require.NoError(t, err)
	require.NoError(t, sh.Assembly.Instances.Create(ctxT(t), &instances.Record{ID: "i-1", Tenant: "acme", Shard: sh.ShardID,
		State: instances.StateRunning, Addresses: []string{"127.0.0.1"}, CreatedAt: time.Now().UTC()}))
	tok := mint(sh.NonceKey, sh.ShardID, time.Minute)
	var ok, used atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := reg.RegisterAgent(context.Background(), &nstancev1.RegisterAgentRequest{Nonce: tok, PublicKeyPem: pubPEM()})
			switch status.Code(err) {
			case codes.OK:
				ok.Add(1)
			case codes.AlreadyExists:
				used.Add(1)
			default:
				t.Errorf("unexpected: %v", err)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int32(1), ok.Load())
	require.Equal(t, int32(49), used.Load())
}
