package chaos

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/localagent"
	"github.com/nstance-dev/nstance/internal/server/provider/process"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/s3store"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// noting remembers the nonce the server handed each instance, so the test
// can replay it.
type noting struct {
	provider.Provider
	mu     sync.Mutex
	nonces map[string][]string
}

func (n *noting) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	n.mu.Lock()
	n.nonces[req.InstanceID] = append(n.nonces[req.InstanceID], req.AgentNonce)
	n.mu.Unlock()
	return n.Provider.Create(ctx, req)
}

// noncesOf are the nonces every Create of id carried, in order: a create
// retried under load mints a new nonce while the agent keeps the one its
// process was started with.
func (n *noting) noncesOf(id string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.nonces[id]...)
}

// TestAgentRegistersThroughALostMarkerReply: a proxy between the shard
// server and dev-s3 resets the connection right after forwarding the
// nonce-marker PUT (dev-s3 committed it). With one reset the S3 SDK retries
// the create and gets 412 for its own marker; with three the SDK gives up,
// the agent is told to retry and retries with the same key. Either way the
// real agent registers, with the certificate stored with the nonce. Then the
// nonce with another key, or asking for another instance's name, is
// refused, and with the agent's own key returns the same certificate.
func TestAgentRegistersThroughALostMarkerReply(t *testing.T) {
	bin := agentBinary(t)
	for _, tc := range []struct {
		name   string
		resets int
	}{{"the SDK retries", 1}, {"the agent retries", 3}} {
		t.Run(tc.name, func(t *testing.T) {
			s3 := devs3test.Start(t, "")
			proxy := startResetProxy(t, s3.URL, "/nonces/", tc.resets)
			store, err := s3store.NewWithClient(devs3test.Client(proxy.URL), devs3test.Bucket, "")
			require.NoError(t, err)
			direct, err := s3store.NewWithClient(devs3test.Client(s3.URL), devs3test.Bucket, "")
			require.NoError(t, err)

			stateDir := t.TempDir()
			proc, err := process.New(process.Config{
				Command: []string{bin}, StateDir: stateDir, StopTimeout: time.Second,
				Env: []string{"NSTANCE_METRICS_INTERVAL=200ms", "NSTANCE_RECONNECT_MIN=100ms", "NSTANCE_RECONNECT_MAX=1s"},
			})
			require.NoError(t, err)
			t.Cleanup(func() {
				list, _ := proc.List(context.Background())
				for _, inst := range list {
					_ = proc.Delete(context.Background(), inst.InstanceID)
				}
			})
			prov := &noting{Provider: proc, nonces: map[string][]string{}}
			cfg := strings.Replace(shardtest.Config("test-cluster", "test-1", "process"), `"groups": {},`,
				`"groups": { "acme": { "workers": { "template": "worker", "size": 1 } } },`, 1)
			cfg = strings.Replace(cfg, `"default_drain_timeout": "30s",`,
				`"default_drain_timeout": "30s", "health_check_interval": "200ms", "health_misses": 15, "agent_startup_grace": "1m",`, 1)
			sh := shardtest.Start(t, shardtest.Options{ConfigJSONC: cfg, Store: store, Provider: prov})

			var rec *instances.Record
			require.Eventually(t, func() bool {
				for _, r := range sh.Assembly.Instances.List(nil) {
					if r.Agent != nil {
						rec = r
						return true
					}
				}
				return false
			}, 60*time.Second, 50*time.Millisecond, "the agent never registered")
			require.Equal(t, int32(tc.resets), proxy.resets.Load(), "every planned reset happened")
			require.GreaterOrEqual(t, proxy.conflicts.Load(), int32(1), "a retried marker create met its own marker")

			idDir := localagent.IdentityDir(stateDir, rec.ID)
			var agentCert []byte
			require.Eventually(t, func() bool {
				agentCert, err = os.ReadFile(filepath.Join(idDir, "agent.crt"))
				return err == nil
			}, 30*time.Second, 50*time.Millisecond)
			// The agent holds exactly the certificate stored with its nonce.
			// The nonce the agent used is the one with a marker.
			var tok string
			var obj *objstore.Object
			for _, cand := range prov.noncesOf(rec.ID) {
				claims, err := (&nonce.Verifier{Key: sh.NonceKey.Public().(ed25519.PublicKey), ClusterID: sh.ClusterID, Shard: sh.ShardID}).Verify(cand, nonce.KindAgent)
				require.NoError(t, err)
				if o, err := direct.Get(context.Background(), sh.Keys.ShardNonce(sh.ShardID, claims.ID)); err == nil {
					tok, obj = cand, o
				}
			}
			require.NotNil(t, obj, "a marker for one of the instance's nonces")
			var marker nonce.Marker
			require.NoError(t, json.Unmarshal(obj.Body, &marker))
			require.Equal(t, marker.CertificatePEM, string(agentCert))
			cert, err := pki.ParseCertificatePEM(agentCert)
			require.NoError(t, err)
			require.Equal(t, []string{rec.ID}, cert.DNSNames, "the certificate names what the record knows")
			require.Equal(t, "127.0.0.1", cert.IPAddresses[0].String())

			conn, err := grpc.NewClient(sh.RegistrationAddr, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientTLS(sh.CA.Pool(), nil, "127.0.0.1"))))
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close() })
			reg := nstancev1.NewRegistrationServiceClient(conn)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// Another key: the nonce is used.
			otherPub, _, err := ed25519.GenerateKey(rand.Reader)
			require.NoError(t, err)
			otherPEM, err := pki.MarshalPublicKeyPEM(otherPub)
			require.NoError(t, err)
			_, err = reg.RegisterAgent(ctx, &nstancev1.RegisterAgentRequest{Nonce: tok, PublicKeyPem: string(otherPEM)})
			require.Equal(t, codes.AlreadyExists, status.Code(err), "%v", err)
			// The agent's own key, asking to be another instance: refused.
			keyPEM, err := os.ReadFile(filepath.Join(idDir, "agent.key"))
			require.NoError(t, err)
			priv, err := pki.ParsePrivateKeyPEM(keyPEM)
			require.NoError(t, err)
			ownPEM, err := pki.MarshalPublicKeyPEM(priv.Public())
			require.NoError(t, err)
			_, err = reg.RegisterAgent(ctx, &nstancev1.RegisterAgentRequest{Nonce: tok, PublicKeyPem: string(ownPEM), Hostname: "workers-other"})
			require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
			// The agent's own key: the same certificate again.
			resp, err := reg.RegisterAgent(ctx, &nstancev1.RegisterAgentRequest{Nonce: tok, PublicKeyPem: string(ownPEM)})
			require.NoError(t, err)
			require.Equal(t, string(agentCert), resp.GetCertificatePem())
		})
	}
}
