package keys

import (
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/keytype"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func spec(name string, t nstancev1.KeyType) *nstancev1.KeySpec {
	return &nstancev1.KeySpec{Name: name, Type: t}
}

func TestApplyEveryKeyType(t *testing.T) {
	dir := t.TempDir()
	s, err := NewStore(dir, 0o640)
	require.NoError(t, err)
	var req nstancev1.KeyGenRequest
	for v, name := range nstancev1.KeyType_name {
		if v == 0 {
			continue
		}
		req.Keys = append(req.Keys, spec("k-"+name, nstancev1.KeyType(v)))
	}
	require.Len(t, req.Keys, 5, "every key type in the proto is covered")
	pubs, err := s.Apply(&req)
	require.NoError(t, err)
	require.Len(t, pubs, len(req.Keys))
	for i, p := range pubs {
		require.Equal(t, req.Keys[i].Name, p.Name)
		require.Equal(t, req.Keys[i].Type, p.Type)
		pub, err := ParsePublicPEM(p.PublicKeyPem)
		require.NoError(t, err)
		require.Equal(t, p.Type, keytype.Of(pub))
		priv, err := s.Load(p.Name)
		require.NoError(t, err)
		require.True(t, priv.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(pub))
		// The private key really signs for the public key handed out.
		digest := sha256.Sum256([]byte("x"))
		var opts crypto.SignerOpts = crypto.SHA256
		msg := digest[:]
		if p.Type == nstancev1.KeyType_KEY_TYPE_ED25519 {
			opts, msg = crypto.Hash(0), []byte("x")
		}
		_, err = priv.Sign(rand.Reader, msg, opts)
		require.NoError(t, err)
		fi, err := os.Stat(s.Path(p.Name))
		require.NoError(t, err)
		require.Equal(t, fs.FileMode(0o640), fi.Mode().Perm())
	}
}

func TestApplyKeepsReplacesAndRemoves(t *testing.T) {
	dir := t.TempDir()
	s, err := NewStore(dir, 0)
	require.NoError(t, err)
	first, err := s.Apply(&nstancev1.KeyGenRequest{Keys: []*nstancev1.KeySpec{
		spec("a", nstancev1.KeyType_KEY_TYPE_ED25519), spec("b", nstancev1.KeyType_KEY_TYPE_ECDSA_P256),
	}})
	require.NoError(t, err)
	fi, err := os.Stat(s.Path("a"))
	require.NoError(t, err)
	require.Equal(t, DefaultMode, fi.Mode().Perm())

	// Same request again: nothing regenerated.
	again, err := s.Apply(&nstancev1.KeyGenRequest{Keys: []*nstancev1.KeySpec{
		spec("a", nstancev1.KeyType_KEY_TYPE_ED25519), spec("b", nstancev1.KeyType_KEY_TYPE_ECDSA_P256),
	}})
	require.NoError(t, err)
	require.Equal(t, first[0].PublicKeyPem, again[0].PublicKeyPem)
	require.Equal(t, first[1].PublicKeyPem, again[1].PublicKeyPem)

	// Type change regenerates, dropped key is removed, a corrupt key is replaced.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "c.key"), []byte("garbage"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "unrelated.txt"), []byte("keep"), 0o600))
	next, err := s.Apply(&nstancev1.KeyGenRequest{Keys: []*nstancev1.KeySpec{
		spec("a", nstancev1.KeyType_KEY_TYPE_ECDSA_P384), spec("c", nstancev1.KeyType_KEY_TYPE_ED25519),
	}})
	require.NoError(t, err)
	require.NotEqual(t, first[0].PublicKeyPem, next[0].PublicKeyPem)
	require.Equal(t, nstancev1.KeyType_KEY_TYPE_ECDSA_P384, next[0].Type)
	names, err := s.Names()
	require.NoError(t, err)
	require.Equal(t, []string{"a", "c"}, names)
	_, err = os.Stat(filepath.Join(dir, "unrelated.txt"))
	require.NoError(t, err)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 3, "no temporary files left")
}

func TestApplyRejectsBadSpecs(t *testing.T) {
	for _, tc := range []struct {
		name string
		keys []*nstancev1.KeySpec
		err  string
	}{
		{"path in name", []*nstancev1.KeySpec{spec("../x", nstancev1.KeyType_KEY_TYPE_ED25519)}, "invalid key name"},
		{"slash", []*nstancev1.KeySpec{spec("a/b", nstancev1.KeyType_KEY_TYPE_ED25519)}, "invalid key name"},
		{"empty", []*nstancev1.KeySpec{spec("", nstancev1.KeyType_KEY_TYPE_ED25519)}, "invalid key name"},
		{"hidden", []*nstancev1.KeySpec{spec(".x", nstancev1.KeyType_KEY_TYPE_ED25519)}, "invalid key name"},
		{"unspecified type", []*nstancev1.KeySpec{spec("a", nstancev1.KeyType_KEY_TYPE_UNSPECIFIED)}, "unsupported key type"},
		{"unknown type", []*nstancev1.KeySpec{spec("a", nstancev1.KeyType(99))}, "unsupported key type"},
		{"duplicate", []*nstancev1.KeySpec{spec("a", nstancev1.KeyType_KEY_TYPE_ED25519), spec("a", nstancev1.KeyType_KEY_TYPE_ED25519)}, "twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, err := NewStore(dir, 0)
			require.NoError(t, err)
			_, err = s.Apply(&nstancev1.KeyGenRequest{Keys: []*nstancev1.KeySpec{spec("keep", nstancev1.KeyType_KEY_TYPE_ED25519)}})
			require.NoError(t, err)
			_, err = s.Apply(&nstancev1.KeyGenRequest{Keys: tc.keys})
			require.ErrorContains(t, err, tc.err)
			names, err := s.Names()
			require.NoError(t, err)
			require.Equal(t, []string{"keep"}, names, "a rejected request changes nothing")
		})
	}
}

func TestNewStoreRejectsBadMode(t *testing.T) {
	_, err := NewStore(t.TempDir(), 0o200)
	require.ErrorContains(t, err, "invalid key file mode")
	_, err = NewStore("", 0)
	require.ErrorContains(t, err, "directory is required")
}

func BenchmarkGenerate(b *testing.B) {
	for _, t := range []nstancev1.KeyType{nstancev1.KeyType_KEY_TYPE_ED25519, nstancev1.KeyType_KEY_TYPE_ECDSA_P256, nstancev1.KeyType_KEY_TYPE_RSA_2048} {
		b.Run(t.String(), func(b *testing.B) {
			for b.Loop() {
				if _, err := Generate(t); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
