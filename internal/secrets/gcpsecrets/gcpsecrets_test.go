package gcpsecrets

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/secrets"
)

const secretID = "projects/p1/secrets/nstance-key"

func key(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

func TestFetch(t *testing.T) {
	ctx := context.Background()
	fake := newFake()
	fake.add(secretID, key(1))                             // version 1: the previous key, raw bytes
	fake.add(secretID, []byte(hex.EncodeToString(key(2)))) // version 2: the current key, hex text
	v3 := fake.add(secretID, key(3))
	fake.disable(secretID, v3) // a version being prepared: latest skips it
	f := New(func(context.Context) (AccessAPI, error) { return fake, nil })
	src := func(version string) secrets.Source {
		return secrets.Source{Provider: secrets.ProviderGCPSecretManager, SecretID: secretID, VersionID: version}
	}
	tests := []struct {
		name    string
		src     secrets.Source
		want    []byte
		wantErr string
		notFnd  bool
	}{
		{"latest", src(""), []byte(hex.EncodeToString(key(2))), "", false},
		{"explicit latest", src("latest"), []byte(hex.EncodeToString(key(2))), "", false},
		{"version 1", src("1"), key(1), "", false},
		{"disabled version", src("3"), nil, "DISABLED", false},
		{"missing version", src("9"), nil, "not found", true},
		{"missing secret", secrets.Source{Provider: secrets.ProviderGCPSecretManager, SecretID: "projects/p1/secrets/nope"}, nil, "not found", true},
		{"short secret id", secrets.Source{Provider: secrets.ProviderGCPSecretManager, SecretID: "nstance-key"}, nil, "projects/PROJECT/secrets/NAME", false},
		{"other provider", secrets.Source{Provider: secrets.ProviderAWSSSM, Parameter: "/k"}, nil, "is not gcp-secret-manager", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := f.Fetch(ctx, tc.src)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				require.Equal(t, tc.notFnd, errors.Is(err, ErrNotFound))
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	require.NotContains(t, fake.calls, "nstance-key/versions/latest", "an invalid secret id is refused before any call")

	fake.corrupt = true
	_, err := f.Fetch(ctx, src("1"))
	require.ErrorContains(t, err, "CRC32C")
}

// Through secrets.Loader and ByProvider, a keyring's current and previous
// keys come from two versions of one secret.
func TestKeyringFromVersions(t *testing.T) {
	fake := newFake()
	fake.add(secretID, key(1))
	fake.add(secretID, []byte(hex.EncodeToString(key(2))))
	built := 0
	remote := secrets.ByProvider{secrets.ProviderGCPSecretManager: New(func(context.Context) (AccessAPI, error) { built++; return fake, nil })}
	ring, err := secrets.Loader{Remote: remote}.Keyring(context.Background(),
		secrets.Source{Provider: secrets.ProviderGCPSecretManager, SecretID: secretID},
		[]secrets.Source{{Provider: secrets.ProviderGCPSecretManager, SecretID: secretID, VersionID: "1"}})
	require.NoError(t, err)
	require.Equal(t, 1, built, "one client for every key")
	k2, err := secrets.ParseKey(key(2))
	require.NoError(t, err)
	require.Equal(t, k2.ID, ring.CurrentID(), "latest is the current key")
	// What the previous key (version 1) sealed still opens.
	old, err := secrets.Loader{Remote: remote}.Keyring(context.Background(),
		secrets.Source{Provider: secrets.ProviderGCPSecretManager, SecretID: secretID, VersionID: "1"}, nil)
	require.NoError(t, err)
	sealed, err := old.Seal("k", []byte("x"))
	require.NoError(t, err)
	pt, err := ring.Open("k", sealed)
	require.NoError(t, err)
	require.Equal(t, "x", string(pt))
	_, err = secrets.Loader{Remote: remote}.Load(context.Background(), secrets.Source{Provider: secrets.ProviderAWSSSM, Parameter: "/k"})
	require.ErrorContains(t, err, "aws-ssm is not available here")
}
