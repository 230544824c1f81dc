package identity

import (
	"crypto/ed25519"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/pki"
)

const cluster = "c1"

func agentID() pki.Identity {
	return pki.Identity{ClusterID: cluster, Tenant: "acme", Role: pki.RoleAgent, ClientID: "i-1", Shard: "s1", Group: "g"}
}

// registered returns a directory holding a registered identity, and the CA.
func registered(t *testing.T) (*Dir, *pki.CA) {
	t.Helper()
	ca, err := pki.GenerateCA(cluster, time.Hour, time.Now())
	require.NoError(t, err)
	d, err := Open(t.TempDir())
	require.NoError(t, err)
	k, err := d.Key()
	require.NoError(t, err)
	_, certPEM, err := ca.IssueClient(pki.ClientRequest{Identity: agentID(), PublicKey: k.Public(), Validity: time.Hour}, time.Now())
	require.NoError(t, err)
	require.NoError(t, d.SaveCertificate(string(certPEM), string(ca.CertPEM)))
	return d, ca
}

func issueFor(t *testing.T, ca *pki.CA, id pki.Identity, pubPEM string) []byte {
	t.Helper()
	pub, err := pki.ParseEd25519PublicKeyPEM([]byte(pubPEM))
	require.NoError(t, err)
	_, certPEM, err := ca.IssueClient(pki.ClientRequest{Identity: id, PublicKey: pub, Validity: 2 * time.Hour}, time.Now())
	require.NoError(t, err)
	return certPEM
}

func TestInstallRenewed(t *testing.T) {
	d, ca := registered(t)
	old, err := d.Certificate(time.Now())
	require.NoError(t, err)

	// The pending key is created once and reused until installed.
	pub1, err := d.PendingPublicKeyPEM()
	require.NoError(t, err)
	pub2, err := d.PendingPublicKeyPEM()
	require.NoError(t, err)
	require.Equal(t, pub1, pub2)
	oldPub, err := d.PublicKeyPEM()
	require.NoError(t, err)
	require.NotEqual(t, oldPub, pub1)

	// Refused, and nothing changes: another identity, or a certificate for another key.
	other := agentID()
	other.ClientID = "i-2"
	_, err = d.InstallRenewed(issueFor(t, ca, other, pub1))
	require.ErrorContains(t, err, "names")
	_, err = d.InstallRenewed(issueFor(t, ca, agentID(), oldPub))
	require.ErrorContains(t, err, "does not match the pending renewal key")
	cur, err := d.Certificate(time.Now())
	require.NoError(t, err)
	require.Equal(t, old.Leaf.Raw, cur.Leaf.Raw)

	// The right one is installed with the CA chain; the pair matches and is used at once.
	renewed := issueFor(t, ca, agentID(), pub1)
	ok, err := d.InstallRenewed(append(append([]byte{}, renewed...), ca.CertPEM...))
	require.NoError(t, err)
	require.True(t, ok)
	cur, err = d.Certificate(time.Now())
	require.NoError(t, err)
	require.NotEqual(t, old.Leaf.Raw, cur.Leaf.Raw)
	k, err := d.Key()
	require.NoError(t, err)
	require.True(t, k.Public().(ed25519.PublicKey).Equal(cur.Leaf.PublicKey))
	for _, n := range []string{NextKeyFile, NextCertFile} {
		_, err := os.Stat(d.Path(n))
		require.ErrorIs(t, err, os.ErrNotExist, n)
	}
	// Delivered again: nothing to do.
	ok, err = d.InstallRenewed(renewed)
	require.NoError(t, err)
	require.False(t, ok)
	// The next renewal gets a fresh key.
	pub3, err := d.PendingPublicKeyPEM()
	require.NoError(t, err)
	require.NotEqual(t, pub1, pub3)
}

// TestInterruptedSwapFinishedAtOpen reproduces each state a crash can leave
// during InstallRenewed and checks that Open ends with a matching pair.
func TestInterruptedSwapFinishedAtOpen(t *testing.T) {
	for _, tc := range []struct {
		name string
		// crash leaves the directory as a crash at that step would.
		crash   func(t *testing.T, d *Dir)
		renewed bool
	}{
		{name: "certificate stored, nothing renamed", renewed: true, crash: func(t *testing.T, d *Dir) {}},
		{name: "key renamed, certificate not", renewed: true, crash: func(t *testing.T, d *Dir) {
			require.NoError(t, os.Rename(d.Path(NextKeyFile), d.Path(KeyFile)))
		}},
		{name: "torn next certificate", renewed: false, crash: func(t *testing.T, d *Dir) {
			require.NoError(t, os.WriteFile(d.Path(NextCertFile), []byte("-----BEGIN CERT"), 0o644))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, ca := registered(t)
			old, err := d.Certificate(time.Now())
			require.NoError(t, err)
			pub, err := d.PendingPublicKeyPEM()
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(d.Path(NextCertFile), issueFor(t, ca, agentID(), pub), 0o644))
			tc.crash(t, d)

			d2, err := Open(d.path)
			require.NoError(t, err)
			cur, err := d2.Certificate(time.Now())
			require.NoError(t, err, "the key and certificate on disk must match after Open")
			require.Equal(t, tc.renewed, string(cur.Leaf.Raw) != string(old.Leaf.Raw))
			_, err = os.Stat(d2.Path(NextCertFile))
			require.ErrorIs(t, err, os.ErrNotExist)
		})
	}
}

func TestUnreadablePendingKeyReplaced(t *testing.T) {
	d, _ := registered(t)
	require.NoError(t, os.WriteFile(d.Path(NextKeyFile), []byte("garbage"), 0o600))
	pub, err := d.PendingPublicKeyPEM()
	require.NoError(t, err)
	again, err := d.PendingPublicKeyPEM()
	require.NoError(t, err)
	require.Equal(t, pub, again)
}
