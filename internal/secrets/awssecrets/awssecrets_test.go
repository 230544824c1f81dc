package awssecrets

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/secrets"
)

func rawKey(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

func loader(sm *fakeSM, ps *fakeSSM, regions *[]string) secrets.Loader {
	return secrets.Loader{Remote: New(func(_ context.Context, region string) (SecretsManagerAPI, SSMAPI, error) {
		if regions != nil {
			*regions = append(*regions, region)
		}
		return sm, ps, nil
	})}
}

func smSource(id string) secrets.Source {
	return secrets.Source{Provider: secrets.ProviderAWSSecretsManager, SecretID: id}
}

// A binary secret is the raw key; a string secret its base64 or hex text:
// the same 32 bytes give the same key however they are stored.
func TestSecretsManagerBinaryAndStringSecrets(t *testing.T) {
	sm := newFakeSM()
	sm.put("bin", nil, rawKey(7))
	sm.put("b64", aws.String(base64.StdEncoding.EncodeToString(rawKey(7))), nil)
	sm.put("hex", aws.String(hex.EncodeToString(rawKey(7))+"\n"), nil)
	sm.put("short", aws.String("too short"), nil)
	l := loader(sm, newFakeSSM(), nil)
	ctx := context.Background()
	want, err := secrets.ParseKey(rawKey(7))
	require.NoError(t, err)
	for _, id := range []string{"bin", "b64", "hex"} {
		k, err := l.Load(ctx, smSource(id))
		require.NoError(t, err, id)
		require.Equal(t, want.ID, k.ID, id)
	}
	_, err = l.Load(ctx, smSource("short"))
	require.ErrorContains(t, err, `aws-secrets-manager secret "short"`)
	require.NotContains(t, err.Error(), "too short", "the material is never in errors")

	_, err = l.Load(ctx, smSource("missing"))
	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorContains(t, err, `secret "missing" (AWSCURRENT)`)
}

// Rotating the secret: the new version is AWSCURRENT and seals, the old
// one (AWSPREVIOUS, or named by version id) still opens what it sealed.
func TestSecretsManagerRotation(t *testing.T) {
	sm := newFakeSM()
	v1 := sm.put("nstance/key", nil, rawKey(1))
	l := loader(sm, newFakeSSM(), nil)
	ctx := context.Background()
	ring1, err := l.Keyring(ctx, smSource("nstance/key"), nil)
	require.NoError(t, err)
	sealed, err := ring1.Seal("cluster/secret/ca.key", []byte("ca key"))
	require.NoError(t, err)

	sm.put("nstance/key", nil, rawKey(2))
	prev := smSource("nstance/key")
	prev.VersionStage = "AWSPREVIOUS"
	ring2, err := l.Keyring(ctx, smSource("nstance/key"), []secrets.Source{prev})
	require.NoError(t, err)
	require.NotEqual(t, ring1.CurrentID(), ring2.CurrentID(), "the rotated version seals")
	pt, err := ring2.Open("cluster/secret/ca.key", sealed)
	require.NoError(t, err)
	require.Equal(t, "ca key", string(pt))

	byID := smSource("nstance/key")
	byID.VersionID = v1
	k, err := l.Load(ctx, byID)
	require.NoError(t, err)
	require.Equal(t, ring1.CurrentID(), k.ID)

	// Without the previous key the old envelope no longer opens.
	ring3, err := l.Keyring(ctx, smSource("nstance/key"), nil)
	require.NoError(t, err)
	_, err = ring3.Open("cluster/secret/ca.key", sealed)
	require.Error(t, err)

	gone := smSource("nstance/key")
	gone.VersionStage = "NOSUCHSTAGE"
	_, err = l.Load(ctx, gone)
	require.ErrorIs(t, err, ErrNotFound)
}

func TestSSMParameters(t *testing.T) {
	ps := newFakeSSM()
	ps.put("/nstance/key", base64.StdEncoding.EncodeToString(rawKey(3)), ssmtypes.ParameterTypeSecureString)
	ps.put("/nstance/key", base64.StdEncoding.EncodeToString(rawKey(4)), ssmtypes.ParameterTypeSecureString)
	ps.put("/nstance/list", "a,b", ssmtypes.ParameterTypeStringList)
	var regions []string
	l := loader(newFakeSM(), ps, &regions)
	ctx := context.Background()
	src := func(name string) secrets.Source {
		return secrets.Source{Provider: secrets.ProviderAWSSSM, Parameter: name, Region: "eu-west-1"}
	}
	k4, err := secrets.ParseKey(rawKey(4))
	require.NoError(t, err)
	k3, err := secrets.ParseKey(rawKey(3))
	require.NoError(t, err)
	ring, err := l.Keyring(ctx, src("/nstance/key"), []secrets.Source{src("/nstance/key:1")})
	require.NoError(t, err)
	require.Equal(t, k4.ID, ring.CurrentID(), "the latest version, decrypted")
	old, err := l.Load(ctx, src("/nstance/key:1"))
	require.NoError(t, err)
	require.Equal(t, k3.ID, old.ID)
	require.Equal(t, []string{"eu-west-1"}, regions, "clients are built once per region")

	_, err = l.Load(ctx, src("/nstance/missing"))
	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorContains(t, err, `"/nstance/missing"`)
	_, err = l.Load(ctx, src("/nstance/key:9"))
	require.ErrorIs(t, err, ErrNotFound)
	_, err = l.Load(ctx, src("/nstance/list"))
	require.ErrorContains(t, err, "StringList")
}

func TestLoaderWithoutRemoteRefusesAWS(t *testing.T) {
	_, err := secrets.Loader{}.Load(context.Background(), smSource("k"))
	require.ErrorContains(t, err, "not available")
}

func TestClientErrorsAreReported(t *testing.T) {
	l := secrets.Loader{Remote: New(func(context.Context, string) (SecretsManagerAPI, SSMAPI, error) {
		return nil, nil, errors.New("no credentials")
	})}
	_, err := l.Load(context.Background(), smSource("k"))
	require.ErrorContains(t, err, "no credentials")
}
