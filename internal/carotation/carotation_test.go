package carotation_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/carotation"
	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/internal/server/bootstrap"
	"github.com/nstance-dev/nstance/internal/workloadca"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/s3store"
)

const encKey = "thisisatest32bytekey123456789012"

const shardCfg = `{
  "cluster": {"id": "c1"},
  "shard": {"id": "s1", "infra": {"provider": "mock", "region": "r", "zone": "z"},
    "bind": {"health_addr": "127.0.0.1:0", "election_addr": "127.0.0.1:0", "registration_addr": "127.0.0.1:0", "operator_addr": "127.0.0.1:0", "agent_addr": "127.0.0.1:0"}},
  "certificates": {"agent_validity": "2h", "operator_validity": "3h", "ca_validity": "100h"}
}`

type env struct {
	store objstore.Store
	boot  bootstrap.Options
	r     *carotation.Rotator
	now   atomic.Pointer[time.Time]
}

// setup runs dev-s3, lets a cluster leader create the cluster material and
// returns a rotator with a clock the test moves.
func setup(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	s3 := devs3test.Start(t, "")
	store, err := s3store.NewWithClient(devs3test.Client(s3.URL), devs3test.Bucket, "")
	require.NoError(t, err)
	_, err = store.Put(ctx, "config/s1.jsonc", []byte(shardCfg), objstore.PutOptions{})
	require.NoError(t, err)
	k, err := secrets.ParseKey([]byte(encKey))
	require.NoError(t, err)
	ring, err := secrets.NewKeyring(k)
	require.NoError(t, err)
	sec := &secrets.Store{Objects: store, Ring: ring}
	e := &env{store: store}
	e.boot = bootstrap.Options{ClusterID: "c1", Objects: store, Secrets: sec, Keys: layout.New(""), CAValidity: 100 * time.Hour,
		IsLeader: func() bool { return true }, Log: logr.Discard()}
	_, err = bootstrap.Once(ctx, e.boot)
	require.NoError(t, err)
	e.boot.IsLeader = nil
	start := time.Now().UTC()
	e.now.Store(&start)
	e.r = &carotation.Rotator{Objects: store, Secrets: sec, Keys: layout.New(""), ClusterID: "c1", Now: func() time.Time { return *e.now.Load() }}
	return e
}

func (e *env) advance(d time.Duration) {
	n := e.now.Load().Add(d)
	e.now.Store(&n)
}

func (e *env) trust(t *testing.T) (*pki.CA, []string) {
	t.Helper()
	ca, bundle, err := bootstrap.LoadTrust(context.Background(), e.boot)
	require.NoError(t, err)
	tr, err := pki.NewTrust(ca, bundle)
	require.NoError(t, err)
	return ca, tr.Fingerprints()
}

func (e *env) exists(t *testing.T, key string) bool {
	t.Helper()
	_, err := e.store.Head(context.Background(), key)
	if err == nil {
		return true
	}
	require.ErrorIs(t, err, objstore.ErrNotFound)
	return false
}

func TestPhases(t *testing.T) {
	ctx := context.Background()
	e := setup(t)
	keys := layout.New("")
	old, fps := e.trust(t)
	oldFP := pki.Fingerprint(old.Cert)
	require.Equal(t, []string{oldFP}, fps)

	st, err := e.r.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, carotation.PhaseNone, st.State.Phase)
	require.Equal(t, "rotate-ca introduce", st.NextStep)
	_, err = e.r.Switch(ctx, true)
	require.ErrorContains(t, err, "introduce` first")
	_, err = e.r.Retire(ctx, true)
	require.ErrorContains(t, err, "switch` first")

	lim, err := carotation.LimitsFromConfigs(ctx, e.store, keys)
	require.NoError(t, err)
	require.Equal(t, carotation.Limits{ClientValidity: 3 * time.Hour, CAValidity: 100 * time.Hour}, lim)

	// introduce: both trusted, still signing with the old CA.
	s1, err := e.r.Introduce(ctx, lim)
	require.NoError(t, err)
	require.Equal(t, carotation.PhaseIntroduced, s1.Phase)
	require.Equal(t, oldFP, s1.OldFingerprint)
	require.Equal(t, s1.IntroducedAt.Add(3*time.Hour), s1.SwitchAfter)
	signer, fps := e.trust(t)
	require.Equal(t, oldFP, pki.Fingerprint(signer.Cert))
	require.Equal(t, []string{oldFP, s1.NewFingerprint}, fps)
	again, err := e.r.Introduce(ctx, lim)
	require.NoError(t, err)
	require.Equal(t, s1.NewFingerprint, again.NewFingerprint, "introduce is idempotent")

	// switch: gated until every client renewed once.
	_, err = e.r.Switch(ctx, false)
	require.ErrorIs(t, err, carotation.ErrGate)
	st, err = e.r.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, "rotate-ca switch", st.NextStep)
	require.Contains(t, st.Waiting, "old CA")
	require.Len(t, st.Bundle, 2)
	e.advance(3*time.Hour + time.Second)
	st, err = e.r.Status(ctx)
	require.NoError(t, err)
	require.Empty(t, st.Waiting)
	s2, err := e.r.Switch(ctx, false)
	require.NoError(t, err)
	require.Equal(t, carotation.PhaseSwitched, s2.Phase)
	signer, fps = e.trust(t)
	require.Equal(t, s1.NewFingerprint, pki.Fingerprint(signer.Cert))
	require.ElementsMatch(t, []string{oldFP, s1.NewFingerprint}, fps)
	require.False(t, e.exists(t, keys.NextCACert()))
	require.False(t, e.exists(t, keys.NextCAKey()))
	require.True(t, e.exists(t, keys.PreviousCACert()))
	_, err = e.r.Switch(ctx, false)
	require.NoError(t, err, "switch is idempotent")
	_, err = e.r.Introduce(ctx, lim)
	require.ErrorContains(t, err, "retire")
	// A new server (bootstrap) loads the new CA too.
	cl, err := bootstrap.Once(ctx, e.boot)
	require.NoError(t, err)
	require.True(t, cl.CA.Cert.Equal(signer.Cert))

	// retire: gated until every old certificate expired.
	_, err = e.r.Retire(ctx, false)
	require.ErrorIs(t, err, carotation.ErrGate)
	e.advance(3*time.Hour + carotation.RefreshGrace + time.Second)
	s3, err := e.r.Retire(ctx, false)
	require.NoError(t, err)
	require.Equal(t, carotation.PhaseRetired, s3.Phase)
	_, fps = e.trust(t)
	require.Equal(t, []string{s1.NewFingerprint}, fps)
	require.False(t, e.exists(t, keys.PreviousCACert()))
	st, err = e.r.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, "rotate-ca introduce", st.NextStep)
	require.Len(t, st.Bundle, 1)

	// A second rotation starts from the retired state.
	s4, err := e.r.Introduce(ctx, lim)
	require.NoError(t, err)
	require.Equal(t, s1.NewFingerprint, s4.OldFingerprint)
	require.NotEqual(t, s1.NewFingerprint, s4.NewFingerprint)
}

// A switch interrupted between writing the new key and the new certificate
// leaves servers on what they had (the pair does not match, LoadTrust fails
// and WatchTrust keeps the current trust); running it again finishes it.
func TestSwitchResumes(t *testing.T) {
	ctx := context.Background()
	e := setup(t)
	keys := layout.New("")
	st, err := e.r.Introduce(ctx, carotation.Limits{ClientValidity: time.Hour, CAValidity: time.Hour})
	require.NoError(t, err)
	nextKey, err := e.r.Secrets.Get(ctx, keys.NextCAKey())
	require.NoError(t, err)
	// The crash: the key is installed, the certificate is not.
	require.NoError(t, e.r.Secrets.Put(ctx, keys.CAKey(), nextKey, objstore.PutOptions{}))
	_, _, err = bootstrap.LoadTrust(ctx, e.boot)
	require.ErrorContains(t, err, "does not match")

	_, err = e.r.Switch(ctx, true)
	require.NoError(t, err)
	signer, _ := e.trust(t)
	require.Equal(t, st.NewFingerprint, pki.Fingerprint(signer.Cert))
	prev, err := e.store.Get(ctx, keys.PreviousCACert())
	require.NoError(t, err)
	pc, err := pki.ParseCertificatePEM(prev.Body)
	require.NoError(t, err)
	require.Equal(t, st.OldFingerprint, pki.Fingerprint(pc))
}

// An introduce interrupted after the new key was stored reuses that key.
func TestIntroduceResumes(t *testing.T) {
	ctx := context.Background()
	e := setup(t)
	keys := layout.New("")
	lim := carotation.Limits{ClientValidity: time.Hour, CAValidity: time.Hour}
	_, err := e.r.Introduce(ctx, lim)
	require.NoError(t, err)
	key1, err := e.r.Secrets.Get(ctx, keys.NextCAKey())
	require.NoError(t, err)
	// Undo the steps after the key: certificate, bundle, state.
	for _, k := range []string{keys.NextCACert(), keys.CABundle(), keys.CARotation()} {
		require.NoError(t, e.store.Delete(ctx, k))
	}
	st, err := e.r.Introduce(ctx, lim)
	require.NoError(t, err)
	key2, err := e.r.Secrets.Get(ctx, keys.NextCAKey())
	require.NoError(t, err)
	require.Equal(t, key1, key2)
	obj, err := e.store.Get(ctx, keys.NextCACert())
	require.NoError(t, err)
	ca, err := pki.LoadCA(obj.Body, key2)
	require.NoError(t, err)
	require.Equal(t, st.NewFingerprint, pki.Fingerprint(ca.Cert))
}

// Two rotate-ca runs at once: the state write is conditional, so only one
// moves the phase.
func TestStateWritesAreConditional(t *testing.T) {
	ctx := context.Background()
	e := setup(t)
	keys := layout.New("")
	_, err := e.store.Put(ctx, keys.CARotation(), []byte(`{"phase":"bogus"}`), objstore.PutOptions{})
	require.NoError(t, err)
	_, err = e.r.Status(ctx)
	require.ErrorContains(t, err, "unknown phase")
	require.NoError(t, e.store.Delete(ctx, keys.CARotation()))

	r2 := *e.r
	lim := carotation.Limits{ClientValidity: time.Hour, CAValidity: time.Hour}
	errs := make(chan error, 2)
	for _, r := range []*carotation.Rotator{e.r, &r2} {
		go func() { _, err := r.Introduce(ctx, lim); errs <- err }()
	}
	var ok int
	for range 2 {
		if err := <-errs; err == nil {
			ok++
		} else {
			require.ErrorContains(t, err, "changed meanwhile")
		}
	}
	require.GreaterOrEqual(t, ok, 1)
	st, err := e.r.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, carotation.PhaseIntroduced, st.State.Phase)
	_, fps := e.trust(t)
	require.Len(t, fps, 2)
	require.Equal(t, st.State.NewFingerprint, fps[1], "the bundle holds the CA the state names")
}

// Rotating the cluster CA leaves every tenant's workload CA alone: no
// Nstance listener trusts a workload CA and no workload CA signs a
// control-plane identity, so the two never depend on each other (workload
// CAs are not rotated by rotate-ca; see the package doc).
func TestRotationLeavesTenantWorkloadCAs(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	wcas := &workloadca.Store{Objects: e.store, Secrets: e.boot.Secrets, Keys: layout.New(""), ClusterID: "c1", Validity: 100 * time.Hour, Log: logr.Discard()}
	before, err := wcas.CA(ctx, "acme")
	require.NoError(t, err)
	lim, err := carotation.LimitsFromConfigs(ctx, e.store, layout.New(""))
	require.NoError(t, err)
	_, err = e.r.Introduce(ctx, lim)
	require.NoError(t, err)
	_, err = e.r.Switch(ctx, true)
	require.NoError(t, err)
	_, err = e.r.Retire(ctx, true)
	require.NoError(t, err)
	after, err := (&workloadca.Store{Objects: e.store, Secrets: e.boot.Secrets, Keys: layout.New(""), ClusterID: "c1", Log: logr.Discard()}).CA(ctx, "acme")
	require.NoError(t, err)
	require.True(t, before.Cert.Equal(after.Cert), "the tenant's workload CA is unchanged")
	// No control-plane trust bundle, after the rotation, holds it.
	_, fps := e.trust(t)
	require.NotEmpty(t, fps)
	require.NotContains(t, fps, pki.Fingerprint(before.Cert))
	_, _, err = before.IssueClient(pki.ClientRequest{Identity: pki.Identity{ClusterID: "c1", Tenant: "acme", Role: pki.RoleOperator, ClientID: "x"},
		PublicKey: before.Key.Public(), Validity: time.Hour}, time.Now())
	require.ErrorContains(t, err, "issues no control-plane identities")
}
