package secrets

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

const rawKey = "thisisatest32bytekey123456789012"

func mustKey(t *testing.T, m string) *Key {
	t.Helper()
	k, err := ParseKey([]byte(m))
	require.NoError(t, err)
	return k
}

func TestParseKeyForms(t *testing.T) {
	want := mustKey(t, rawKey).ID
	for name, m := range map[string]string{
		"raw":         rawKey,
		"raw newline": rawKey + "\n",
		"hex":         hex.EncodeToString([]byte(rawKey)),
		"base64":      base64.StdEncoding.EncodeToString([]byte(rawKey)),
		"base64 raw":  base64.RawURLEncoding.EncodeToString([]byte(rawKey)) + "\n",
	} {
		k, err := ParseKey([]byte(m))
		require.NoError(t, err, name)
		require.Equal(t, want, k.ID, name)
	}
	for _, bad := range []string{"", "short", rawKey + "x", rawKey[1:], hex.EncodeToString([]byte(rawKey + "x")),
		base64.StdEncoding.EncodeToString([]byte(rawKey[1:])), base64.StdEncoding.EncodeToString([]byte(rawKey + "x")),
		strings.Repeat("k", 44), strings.Repeat("z", 64)} {
		_, err := ParseKey([]byte(bad))
		require.Error(t, err, bad)
		if len(bad) > 4 {
			require.NotContains(t, err.Error(), bad, "the key is never echoed")
		}
	}
}

func TestPrintableKeys(t *testing.T) {
	random := make([]byte, KeySize)
	_, err := rand.Read(random)
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		material  string
		printable bool
	}{
		"raw text (the dev key)": {rawKey, true},
		"base64 of text":         {base64.StdEncoding.EncodeToString([]byte(rawKey)), true},
		"hex of text":            {hex.EncodeToString([]byte(rawKey)), true},
		"base64 of random bytes": {base64.StdEncoding.EncodeToString(random), false},
		"hex of random bytes":    {hex.EncodeToString(random), false},
	} {
		k, err := ParseKey([]byte(tc.material))
		require.NoError(t, err, name)
		require.Equal(t, tc.printable, k.Printable, name)
	}
	text := mustKey(t, rawKey)
	strong := mustKey(t, base64.StdEncoding.EncodeToString(random))
	ring, err := NewKeyring(strong, text)
	require.NoError(t, err)
	require.Equal(t, []string{text.ID}, ring.PrintableIDs())
	ring, err = NewKeyring(strong)
	require.NoError(t, err)
	require.Empty(t, ring.PrintableIDs())
}

func TestSealOpen(t *testing.T) {
	oldKey := mustKey(t, rawKey)
	newKey := mustKey(t, "another-32-byte-key-abcdefghijkl")
	oldRing, err := NewKeyring(oldKey)
	require.NoError(t, err)
	rotated, err := NewKeyring(newKey, oldKey)
	require.NoError(t, err)
	newOnly, err := NewKeyring(newKey)
	require.NoError(t, err)

	secret := []byte("-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----\n")
	env, err := oldRing.Seal("cluster/secret/ca.key", secret)
	require.NoError(t, err)
	require.False(t, bytes.Contains(env, secret))
	require.False(t, bytes.Contains(env, []byte("PRIVATE KEY")))
	require.False(t, bytes.Contains(env, []byte(rawKey)))
	require.Contains(t, string(env), oldKey.ID)

	tests := []struct {
		name    string
		ring    *Keyring
		secName string
		data    []byte
		wantErr string
	}{
		{"same key", oldRing, "cluster/secret/ca.key", env, ""},
		{"rotated keyring opens old envelope", rotated, "cluster/secret/ca.key", env, ""},
		{"new key alone cannot", newOnly, "cluster/secret/ca.key", env, "does not hold"},
		{"renamed envelope", oldRing, "cluster/secret/other.key", env, "decryption failed"},
		{"tampered", oldRing, "cluster/secret/ca.key", bytes.Replace(env, []byte(`"ct":"`), []byte(`"ct":"AAAA`), 1), "decryption failed"},
		{"not an envelope", oldRing, "x", []byte("-----BEGIN"), "not an encrypted envelope"},
		{"wrong version", oldRing, "x", []byte(`{"v":2,"alg":"AES-256-GCM"}`), "unsupported envelope"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pt, err := tc.ring.Open(tc.secName, tc.data)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, secret, pt)
		})
	}
	// Re-sealing with the rotated ring uses the new key.
	env2, err := rotated.Seal("n", secret)
	require.NoError(t, err)
	require.Contains(t, string(env2), newKey.ID)
	_, err = oldRing.Open("n", env2)
	require.ErrorIs(t, err, ErrUnknownKey)
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "key")
	require.NoError(t, os.WriteFile(file, []byte(rawKey+"\n"), 0o600))
	env := map[string]string{"K": rawKey, "BAD": "nope"}
	getenv := func(k string) string { return env[k] }
	want := mustKey(t, rawKey).ID
	tests := []struct {
		name    string
		src     Source
		wantErr string
	}{
		{"env", Source{Provider: "env", Env: "K"}, ""},
		{"file", Source{Provider: "file", File: file}, ""},
		{"env unset", Source{Provider: "env", Env: "MISSING"}, "MISSING is not set"},
		{"env bad", Source{Provider: "env", Env: "BAD"}, "must be 32 raw bytes"},
		{"file missing", Source{Provider: "file", File: filepath.Join(dir, "nope")}, "reading"},
		{"provider", Source{Provider: "kms"}, "unknown provider"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k, err := Load(tc.src, getenv)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, want, k.ID)
		})
	}
	_, err := LoadKeyring(Source{Provider: "env", Env: "K"}, []Source{{Provider: "env", Env: "MISSING"}}, getenv)
	require.ErrorContains(t, err, "previous key 0")
}

func TestStore(t *testing.T) {
	ctx := context.Background()
	ring, err := NewKeyring(mustKey(t, rawKey))
	require.NoError(t, err)
	mem := memstore.New()
	s := &Store{Objects: mem, Ring: ring}
	require.NoError(t, s.Put(ctx, "cluster/secret/a", []byte("hello"), objstore.PutOptions{IfNoneMatch: true}))
	require.ErrorIs(t, s.Put(ctx, "cluster/secret/a", []byte("again"), objstore.PutOptions{IfNoneMatch: true}), objstore.ErrPreconditionFailed)
	got, err := s.Get(ctx, "cluster/secret/a")
	require.NoError(t, err)
	require.Equal(t, []byte("hello"), got)
	raw, err := mem.Get(ctx, "cluster/secret/a")
	require.NoError(t, err)
	require.NotContains(t, string(raw.Body), "hello")
	_, err = s.Get(ctx, "cluster/secret/missing")
	require.ErrorIs(t, err, objstore.ErrNotFound)
}
