package workloadca

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

const rawKey = "thisisatest32bytekey123456789012"

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newStore(t *testing.T, objs objstore.Store, clk *clock) *Store {
	t.Helper()
	k, err := secrets.ParseKey([]byte(rawKey))
	require.NoError(t, err)
	ring, err := secrets.NewKeyring(k)
	require.NoError(t, err)
	return &Store{Objects: objs, Secrets: &secrets.Store{Objects: objs, Ring: ring}, Keys: layout.New(""), ClusterID: "c1",
		Validity: 24 * time.Hour, Now: clk.now, Log: logr.Discard(),
		TransitionGrace: func(context.Context) (time.Duration, error) { return 2 * time.Hour, nil }}
}

func workloadCert(t *testing.T, ca *pki.CA, dns string, now time.Time) *x509.Certificate {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	cert, _, err := ca.IssueWorkload(pki.WorkloadRequest{CommonName: "i-1", DNSNames: []string{dns}, PublicKey: pub, Validity: time.Hour},
		pki.WorkloadPolicy{TrustDomain: "c1"}, now)
	require.NoError(t, err)
	return cert
}

func pool(t *testing.T, bundle []byte) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	require.True(t, p.AppendCertsFromPEM(bundle))
	return p
}

// The attack this package exists for: tenant A's certificate for tenant
// B's service name does not verify against tenant B's bundle.
func TestTenantsDoNotTrustEachOther(t *testing.T) {
	ctx := context.Background()
	objs := memstore.New()
	clk := &clock{t: time.Now()}
	s := newStore(t, objs, clk)
	caA, err := s.CA(ctx, "acme")
	require.NoError(t, err)
	caB, err := s.CA(ctx, "globex")
	require.NoError(t, err)
	require.False(t, caA.Cert.Equal(caB.Cert), "a CA per tenant")
	require.Equal(t, pki.TenantWorkloadCACommonName("c1", "globex"), caB.Cert.Subject.CommonName)
	require.Empty(t, caB.TrustDomain())

	bundleB, err := s.Bundle(ctx, "globex")
	require.NoError(t, err)
	opts := x509.VerifyOptions{Roots: pool(t, bundleB), DNSName: "svc.globex.test", CurrentTime: clk.now()}
	_, err = workloadCert(t, caB, "svc.globex.test", clk.now()).Verify(opts)
	require.NoError(t, err, "tenant B's own certificate")
	_, err = workloadCert(t, caA, "svc.globex.test", clk.now()).Verify(opts)
	require.Error(t, err, "tenant A's certificate for tenant B's name")

	// Stored: the certificate plain, the key sealed, at tenant-scoped keys.
	obj, err := objs.Get(ctx, "cluster/tenants/globex/workload-ca.crt")
	require.NoError(t, err)
	require.Equal(t, caB.CertPEM, obj.Body)
	key, err := objs.Get(ctx, "cluster/secret/tenants/globex/workload-ca.key")
	require.NoError(t, err)
	require.False(t, bytes.Contains(key.Body, []byte("PRIVATE KEY")), "the key is sealed")
}

func TestCreateOnceAndReload(t *testing.T) {
	ctx := context.Background()
	objs := memstore.New()
	clk := &clock{t: time.Now()}
	// Two servers racing for the same tenant end with one CA.
	var wg sync.WaitGroup
	got := make([]*pki.CA, 4)
	errs := make([]error, len(got))
	stores := make([]*Store, len(got))
	for i := range got {
		stores[i] = newStore(t, objs, clk) // newStore may fail t: in this goroutine
	}
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = stores[i].CA(ctx, "acme")
		}()
	}
	wg.Wait()
	for i := range got {
		require.NoError(t, errs[i], "server %d", i)
	}
	for _, ca := range got[1:] {
		require.True(t, got[0].Cert.Equal(ca.Cert))
	}
	// A fresh server loads it.
	again, err := newStore(t, objs, clk).CA(ctx, "acme")
	require.NoError(t, err)
	require.True(t, got[0].Cert.Equal(again.Cert))
}

func TestRefusedCAs(t *testing.T) {
	ctx := context.Background()
	objs := memstore.New()
	clk := &clock{t: time.Now()}
	s := newStore(t, objs, clk)
	_, err := s.CA(ctx, "../x")
	require.ErrorContains(t, err, "invalid tenant")

	// plant stores ca (certificate and sealed key) as tenant's workload CA.
	plant := func(tenant string, ca *pki.CA) {
		key, err := pki.MarshalPrivateKeyPEM(ca.Key)
		require.NoError(t, err)
		require.NoError(t, s.Secrets.Put(ctx, "cluster/secret/tenants/"+tenant+"/workload-ca.key", key, objstore.PutOptions{}))
		_, err = objs.Put(ctx, "cluster/tenants/"+tenant+"/workload-ca.crt", ca.CertPEM, objstore.PutOptions{})
		require.NoError(t, err)
	}

	// Tenant A's CA copied over tenant B's is refused.
	caA, err := s.CA(ctx, "acme")
	require.NoError(t, err)
	plant("globex", caA)
	_, err = newStore(t, objs, clk).CA(ctx, "globex")
	require.ErrorContains(t, err, "another tenant's or cluster's CA")

	// The cluster CA is never a workload CA.
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	cluster, err := pki.SelfSignCA("c1", priv, time.Hour, clk.now())
	require.NoError(t, err)
	plant("initech", cluster)
	_, err = newStore(t, objs, clk).CA(ctx, "initech")
	require.ErrorContains(t, err, "names trust domain")
}

// Upgrade: the shared workload CA of an older cluster signs nothing, stays
// in every tenant's bundle (its certificates keep verifying) until the
// recorded transition ends, then leaves the bundles.
func TestSharedCATransition(t *testing.T) {
	ctx := context.Background()
	objs := memstore.New()
	clk := &clock{t: time.Now()}
	shared, err := pki.GenerateWorkloadCA("c1", 48*time.Hour, clk.now())
	require.NoError(t, err)
	_, err = objs.Put(ctx, "cluster/workload-ca.crt", shared.CertPEM, objstore.PutOptions{})
	require.NoError(t, err)
	old := workloadCert(t, shared, "svc.globex.test", clk.now())

	s := newStore(t, objs, clk)
	bundle, err := s.Bundle(ctx, "globex")
	require.NoError(t, err)
	_, err = old.Verify(x509.VerifyOptions{Roots: pool(t, bundle), DNSName: "svc.globex.test", CurrentTime: clk.now()})
	require.NoError(t, err, "a certificate of the shared CA still verifies during the transition")
	ca, err := s.CA(ctx, "globex")
	require.NoError(t, err)
	require.False(t, ca.Cert.Equal(shared.Cert), "the shared CA signs nothing any more")

	obj, err := objs.Get(ctx, "cluster/workload-ca-transition.json")
	require.NoError(t, err)
	var tr Transition
	require.NoError(t, json.Unmarshal(obj.Body, &tr))
	require.Equal(t, pki.Fingerprint(shared.Cert), tr.Fingerprint)
	require.Equal(t, 2*time.Hour, tr.TrustedUntil.Sub(tr.StartedAt), "the grace: longest validity plus margin")

	// Another server, later, keeps the recorded end (create-only).
	clk.add(time.Hour)
	other := newStore(t, objs, clk)
	bundle, err = other.Bundle(ctx, "acme")
	require.NoError(t, err)
	require.Len(t, certs(t, bundle), 2)

	clk.add(time.Hour + time.Second)
	bundle, err = other.Bundle(ctx, "acme")
	require.NoError(t, err)
	require.Len(t, certs(t, bundle), 1, "the transition is over")
	_, err = old.Verify(x509.VerifyOptions{Roots: pool(t, bundle), DNSName: "svc.globex.test", CurrentTime: clk.now().Add(-time.Hour)})
	require.Error(t, err)
}

func certs(t *testing.T, b []byte) []*x509.Certificate {
	t.Helper()
	cs, err := pki.ParseCertificatesPEM(b)
	require.NoError(t, err)
	return cs
}
