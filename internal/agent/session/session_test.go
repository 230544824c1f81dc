package session

import (
	"context"
	"errors"
	"math"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/agent/files"
	"github.com/nstance-dev/nstance/internal/agent/health"
	"github.com/nstance-dev/nstance/internal/agent/identity"
	"github.com/nstance-dev/nstance/internal/agent/keys"
	"github.com/nstance-dev/nstance/internal/pki"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// errStreamEnd ends every fake stream once its messages are consumed.
var errStreamEnd = errors.New("stream ended")

type fakeStream[T any] struct {
	grpc.ClientStream
	items []*T
}

func (s *fakeStream[T]) Recv() (*T, error) {
	if len(s.items) == 0 {
		return nil, errStreamEnd
	}
	it := s.items[0]
	s.items = s.items[1:]
	return it, nil
}

// fakeClient serves the key requests and deliveries it holds, then ends
// the streams; it records what the session sent.
type fakeClient struct {
	nstancev1.AgentServiceClient

	keyReqs    []*nstancev1.KeyGenRequest
	deliveries []*nstancev1.FileDelivery

	keysOpened  *nstancev1.KeyGenRequestsRequest
	filesOpened *nstancev1.ReceiveFilesRequest
	submitted   []*nstancev1.SubmitPublicKeysRequest
}

func (f *fakeClient) KeyGenRequests(_ context.Context, in *nstancev1.KeyGenRequestsRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[nstancev1.KeyGenRequest], error) {
	f.keysOpened = in
	return &fakeStream[nstancev1.KeyGenRequest]{items: f.keyReqs}, nil
}

func (f *fakeClient) SubmitPublicKeys(_ context.Context, in *nstancev1.SubmitPublicKeysRequest, _ ...grpc.CallOption) (*nstancev1.SubmitPublicKeysResponse, error) {
	f.submitted = append(f.submitted, in)
	return &nstancev1.SubmitPublicKeysResponse{}, nil
}

func (f *fakeClient) ReceiveFiles(_ context.Context, in *nstancev1.ReceiveFilesRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[nstancev1.FileDelivery], error) {
	f.filesOpened = in
	return &fakeStream[nstancev1.FileDelivery]{items: f.deliveries}, nil
}

const cluster = "c1"

func agentID() pki.Identity {
	return pki.Identity{ClusterID: cluster, Tenant: "acme", Role: pki.RoleAgent, ClientID: "i-1", Shard: "s1", Group: "g"}
}

// registered returns an identity directory holding a certificate issued at
// issuedAt for validity, and the CA.
func registered(t *testing.T, issuedAt time.Time, validity time.Duration) (*identity.Dir, *pki.CA) {
	t.Helper()
	ca, err := pki.GenerateCA(cluster, 24*time.Hour, issuedAt.Add(-time.Hour))
	require.NoError(t, err)
	d, err := identity.Open(t.TempDir())
	require.NoError(t, err)
	k, err := d.Key()
	require.NoError(t, err)
	_, certPEM, err := ca.IssueClient(pki.ClientRequest{Identity: agentID(), PublicKey: k.Public(), Validity: validity}, issuedAt)
	require.NoError(t, err)
	require.NoError(t, d.SaveCertificate(string(certPEM), string(ca.CertPEM)))
	return d, ca
}

type fixture struct {
	s        *Session
	id       *identity.Dir
	ca       *pki.CA
	keys     *keys.Store
	filesDir string
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	id, ca := registered(t, time.Now(), time.Hour)
	ks, err := keys.NewStore(filepath.Join(t.TempDir(), "keys"), 0o700)
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "files")
	fw, err := files.New(dir, files.Options{})
	require.NoError(t, err)
	s, err := New(Options{
		Addr: "127.0.0.1:1", Identity: id, Keys: ks, Files: fw, Sampler: health.NewSampler(t.TempDir(), nil),
		Interval: time.Hour, Log: logr.Discard(),
	})
	require.NoError(t, err)
	return fixture{s: s, id: id, ca: ca, keys: ks, filesDir: dir}
}

func TestNewValidatesAndDefaults(t *testing.T) {
	f := newFixture(t)
	o := f.s.o
	_, err := New(Options{Identity: o.Identity, Keys: o.Keys, Files: o.Files, Sampler: o.Sampler, Interval: time.Second})
	require.ErrorContains(t, err, "address")
	_, err = New(Options{Addr: "a:1", Identity: o.Identity, Keys: o.Keys, Files: o.Files, Sampler: o.Sampler})
	require.ErrorContains(t, err, "interval")

	s, err := New(Options{Addr: "a:1", Identity: o.Identity, Keys: o.Keys, Files: o.Files, Sampler: o.Sampler, Interval: time.Second})
	require.NoError(t, err)
	require.Equal(t, wait.Backoff{Duration: 500 * time.Millisecond, Cap: 30 * time.Second, Factor: 2, Jitter: 1, Steps: math.MaxInt32}, s.o.Backoff)
	require.Equal(t, 2*time.Second, s.o.FinalReportTimeout)
	// A cap below the first wait is replaced; given values are kept.
	s, err = New(Options{Addr: "a:1", Identity: o.Identity, Keys: o.Keys, Files: o.Files, Sampler: o.Sampler, Interval: time.Second,
		Backoff: wait.Backoff{Duration: time.Second, Cap: 5 * time.Second, Factor: 3, Jitter: 0.5, Steps: 10}})
	require.NoError(t, err)
	require.Equal(t, wait.Backoff{Duration: time.Second, Cap: 5 * time.Second, Factor: 3, Jitter: 0.5, Steps: 10}, s.o.Backoff)
	s, err = New(Options{Addr: "a:1", Identity: o.Identity, Keys: o.Keys, Files: o.Files, Sampler: o.Sampler, Interval: time.Second,
		Backoff: wait.Backoff{Duration: time.Minute, Cap: time.Second}})
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, s.o.Backoff.Cap)
}

func TestSplitIdentityKey(t *testing.T) {
	app := &nstancev1.KeySpec{Name: "app", Type: nstancev1.KeyType_KEY_TYPE_ED25519}
	idKey := &nstancev1.KeySpec{Name: pki.AgentIdentityKeyName, Type: nstancev1.KeyType_KEY_TYPE_ED25519}
	req := &nstancev1.KeyGenRequest{Keys: []*nstancev1.KeySpec{app, idKey}, ConfigHash: "h"}
	rest, id := splitIdentityKey(req)
	require.Same(t, idKey, id)
	require.Equal(t, []*nstancev1.KeySpec{app}, rest.GetKeys())
	require.Equal(t, "h", rest.GetConfigHash())

	// Without an identity key the request passes unchanged.
	plain := &nstancev1.KeyGenRequest{Keys: []*nstancev1.KeySpec{app}}
	rest, id = splitIdentityKey(plain)
	require.Nil(t, id)
	require.Same(t, plain, rest)

	// A key of that name the template wants certified is an ordinary key.
	certified := &nstancev1.KeySpec{Name: pki.AgentIdentityKeyName, Type: nstancev1.KeyType_KEY_TYPE_ED25519, Certificate: &nstancev1.CertificateSpec{}}
	rest, id = splitIdentityKey(&nstancev1.KeyGenRequest{Keys: []*nstancev1.KeySpec{certified}})
	require.Nil(t, id)
	require.Len(t, rest.GetKeys(), 1)
}

func TestSplitIdentityFile(t *testing.T) {
	conf := &nstancev1.DeliveredFile{Path: "app.conf", Content: []byte("x"), Kind: nstancev1.FileKind_FILE_KIND_STRING}
	idFile := &nstancev1.DeliveredFile{Path: "ignored", Content: []byte("pem"), Kind: nstancev1.FileKind_FILE_KIND_AGENT_IDENTITY}
	d := &nstancev1.FileDelivery{Files: []*nstancev1.DeliveredFile{idFile, conf}, ConfigHash: "h", PendingPaths: []string{"later"}}
	rest, id := splitIdentityFile(d)
	require.Same(t, idFile, id)
	require.Equal(t, []*nstancev1.DeliveredFile{conf}, rest.GetFiles())
	require.Equal(t, "h", rest.GetConfigHash())
	require.Equal(t, []string{"later"}, rest.GetPendingPaths(), "pending paths survive the split (files not yet renderable are kept)")

	plain := &nstancev1.FileDelivery{Files: []*nstancev1.DeliveredFile{conf}}
	rest, id = splitIdentityFile(plain)
	require.Nil(t, id)
	require.Same(t, plain, rest)
}

func strFile(path, content string) *nstancev1.DeliveredFile {
	return &nstancev1.DeliveredFile{Path: path, Content: []byte(content), Kind: nstancev1.FileKind_FILE_KIND_STRING}
}

func TestFileLoopAppliesDeliveriesAndResumesFromTheHash(t *testing.T) {
	f := newFixture(t)
	c := &fakeClient{deliveries: []*nstancev1.FileDelivery{{Files: []*nstancev1.DeliveredFile{strFile("app.conf", "v1")}, ConfigHash: "h1"}}}
	kick := make(chan struct{}, 1)
	err := f.s.fileLoop(context.Background(), c, kick)
	require.ErrorIs(t, err, errStreamEnd)
	require.Empty(t, c.filesOpened.GetConfigHash(), "first connection: no hash yet")
	require.Equal(t, "h1", f.s.ConfigHash())
	b, err := os.ReadFile(filepath.Join(f.filesDir, "app.conf"))
	require.NoError(t, err)
	require.Equal(t, "v1", string(b))
	require.Len(t, kick, 1, "an applied delivery triggers a health report at once")

	// The next connection tells the server what it has.
	c2 := &fakeClient{}
	require.ErrorIs(t, f.s.fileLoop(context.Background(), c2, kick), errStreamEnd)
	require.Equal(t, "h1", c2.filesOpened.GetConfigHash())
}

func TestFileLoopKeepsHashWhenRenewedIdentityIsRefused(t *testing.T) {
	f := newFixture(t)
	c := &fakeClient{deliveries: []*nstancev1.FileDelivery{
		{Files: []*nstancev1.DeliveredFile{strFile("app.conf", "v1")}, ConfigHash: "h1"},
		{Files: []*nstancev1.DeliveredFile{
			strFile("app.conf", "v2"),
			{Path: "identity.pem", Content: []byte("not a certificate"), Kind: nstancev1.FileKind_FILE_KIND_AGENT_IDENTITY},
		}, ConfigHash: "h2"},
	}}
	before, err := f.id.Certificate(time.Now())
	require.NoError(t, err)
	err = f.s.fileLoop(context.Background(), c, make(chan struct{}, 1))
	require.ErrorIs(t, err, errStreamEnd, "a refused certificate does not end the connection")
	// The other files were applied, but the hash stays so the server's
	// drift check delivers the certificate again.
	require.Equal(t, "h1", f.s.ConfigHash())
	b, err := os.ReadFile(filepath.Join(f.filesDir, "app.conf"))
	require.NoError(t, err)
	require.Equal(t, "v2", string(b))
	_, err = os.Stat(filepath.Join(f.filesDir, "identity.pem"))
	require.ErrorIs(t, err, os.ErrNotExist, "the identity never lands among the agent's files")
	require.Equal(t, 0, f.s.Renewals())
	after, err := f.id.Certificate(time.Now())
	require.NoError(t, err)
	require.Equal(t, before.Leaf.Raw, after.Leaf.Raw)
}

func TestFileLoopInstallsRenewedIdentityAndReconnects(t *testing.T) {
	f := newFixture(t)
	before, err := f.id.Certificate(time.Now())
	require.NoError(t, err)
	pubPEM, err := f.id.PendingPublicKeyPEM()
	require.NoError(t, err)
	pub, err := pki.ParseEd25519PublicKeyPEM([]byte(pubPEM))
	require.NoError(t, err)
	_, certPEM, err := f.ca.IssueClient(pki.ClientRequest{Identity: agentID(), PublicKey: pub, Validity: 2 * time.Hour}, time.Now())
	require.NoError(t, err)
	c := &fakeClient{deliveries: []*nstancev1.FileDelivery{
		{Files: []*nstancev1.DeliveredFile{
			{Path: "identity.pem", Content: certPEM, Kind: nstancev1.FileKind_FILE_KIND_AGENT_IDENTITY},
			strFile("app.conf", "v1"),
		}, ConfigHash: "h3"},
		{Files: []*nstancev1.DeliveredFile{strFile("app.conf", "never")}, ConfigHash: "h4"},
	}}
	kick := make(chan struct{}, 1)
	err = f.s.fileLoop(context.Background(), c, kick)
	require.ErrorIs(t, err, errRenewed, "the connection ends so the next one presents the new certificate")
	require.Equal(t, 1, f.s.Renewals())
	require.Equal(t, "h3", f.s.ConfigHash())
	require.Empty(t, kick, "no report on the connection being closed")
	after, err := f.id.Certificate(time.Now())
	require.NoError(t, err)
	require.NotEqual(t, before.Leaf.Raw, after.Leaf.Raw)
	b, err := os.ReadFile(filepath.Join(f.filesDir, "app.conf"))
	require.NoError(t, err)
	require.Equal(t, "v1", string(b), "the delivery after the renewal is left for the next connection")
}

func TestKeyLoopSubmitsIdentityKeyApart(t *testing.T) {
	f := newFixture(t)
	app := &nstancev1.KeySpec{Name: "app", Type: nstancev1.KeyType_KEY_TYPE_ED25519}
	idKey := &nstancev1.KeySpec{Name: pki.AgentIdentityKeyName, Type: nstancev1.KeyType_KEY_TYPE_ED25519}
	bad := &nstancev1.KeySpec{Name: "bad", Type: nstancev1.KeyType_KEY_TYPE_UNSPECIFIED}
	c := &fakeClient{keyReqs: []*nstancev1.KeyGenRequest{
		{Keys: []*nstancev1.KeySpec{app, idKey}, ConfigHash: "k1"},
		// Unusable, without an identity key: nothing is submitted.
		{Keys: []*nstancev1.KeySpec{app, bad}, ConfigHash: "k2"},
		// Unusable, with an identity key: the renewal goes ahead alone.
		{Keys: []*nstancev1.KeySpec{bad, idKey}, ConfigHash: "k3"},
	}}
	err := f.s.keyLoop(context.Background(), c)
	require.ErrorIs(t, err, errStreamEnd)
	require.Empty(t, c.keysOpened.GetExistingKeyNames())

	pending, err := f.id.PendingPublicKeyPEM()
	require.NoError(t, err)
	require.Len(t, c.submitted, 2)
	first := c.submitted[0].GetKeys()
	require.Len(t, first, 2)
	require.Equal(t, "app", first[0].GetName())
	require.Equal(t, pki.AgentIdentityKeyName, first[1].GetName())
	require.Equal(t, pending, first[1].GetPublicKeyPem(), "the identity key is the pending renewal key")
	second := c.submitted[1].GetKeys()
	require.Len(t, second, 1)
	require.Equal(t, pending, second[0].GetPublicKeyPem())

	names, err := f.keys.Names()
	require.NoError(t, err)
	require.Equal(t, []string{"app"}, names, "the identity key never enters the key store")

	// The next connection names the keys it holds.
	c2 := &fakeClient{}
	require.ErrorIs(t, f.s.keyLoop(context.Background(), c2), errStreamEnd)
	require.Equal(t, []string{"app"}, c2.keysOpened.GetExistingKeyNames())
}

func TestRunStopsWithoutUsableIdentity(t *testing.T) {
	// A certificate that expired: Run gives up at once instead of retrying.
	id, _ := registered(t, time.Now().Add(-3*time.Hour), time.Hour)
	f := newFixture(t)
	o := f.s.o
	o.Identity = id
	o.Backoff = wait.Backoff{Duration: time.Hour, Cap: time.Hour}
	s, err := New(o)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = s.Run(ctx)
	require.ErrorIs(t, err, identity.ErrNotRegistered)
	require.NoError(t, ctx.Err(), "returned without waiting for a backoff")
	require.Equal(t, 0, s.Lost())
}

func TestRunCountsLostConnectionsAndStopsWithContext(t *testing.T) {
	// A loopback port nobody listens on: every connection fails at once.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	f := newFixture(t)
	o := f.s.o
	o.Addr = addr
	// The wait after the first loss outlasts the test: exactly one attempt.
	o.Backoff = wait.Backoff{Duration: time.Hour, Cap: time.Hour}
	s, err := New(o)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	require.Eventually(t, func() bool { return s.Lost() == 1 }, 30*time.Second, 5*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err, "Run ends without error when its context ends")
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not stop with its context")
	}
	require.Equal(t, 1, s.Lost())
	require.Equal(t, 0, s.Renewals())
}
