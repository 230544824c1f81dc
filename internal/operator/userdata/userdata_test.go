package userdata

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func TestRead(t *testing.T) {
	ctx := context.Background()
	secret := func(name string, data map[string][]byte) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Data: data}
	}
	cl := fake.NewClientBuilder().WithObjects(
		secret("plain", map[string][]byte{KeyValue: []byte("#cloud-config\n")}),
		secret("ign", map[string][]byte{KeyValue: []byte(`{"ignition":{}}`), KeyFormat: []byte("ignition")}),
		secret("no-value", map[string][]byte{KeyFormat: []byte("cloud-config")}),
		secret("empty-value", map[string][]byte{KeyValue: {}}),
		secret("odd-format", map[string][]byte{KeyValue: []byte("x"), KeyFormat: []byte("shell")}),
	).Build()

	d, err := Read(ctx, cl, "ns", "plain")
	require.NoError(t, err)
	require.Equal(t, Data{Secret: "plain", Value: []byte("#cloud-config\n"), Format: FormatCloudConfig}, d, "format defaults to cloud-config")
	d, err = Read(ctx, cl, "ns", "ign")
	require.NoError(t, err)
	require.Equal(t, FormatIgnition, d.Format)

	d, err = Read(ctx, cl, "ns", "")
	require.NoError(t, err)
	require.True(t, d.Empty(), "no name: the template's userdata")
	require.Empty(t, d.Hash())

	for _, name := range []string{"no-value", "empty-value", "odd-format"} {
		_, err := Read(ctx, cl, "ns", name)
		var invalid *InvalidError
		require.ErrorAs(t, err, &invalid, name)
		require.Contains(t, err.Error(), "ns/"+name)
	}
	_, err = Read(ctx, cl, "ns", "odd-format")
	require.NotContains(t, err.Error(), `"x"`, "the value never appears in errors")

	_, err = Read(ctx, cl, "ns", "missing")
	var nf *NotFoundError
	require.True(t, errors.As(err, &nf))
}

func TestHash(t *testing.T) {
	sum := sha256.Sum256([]byte("abc"))
	require.Equal(t, hex.EncodeToString(sum[:]), Hash([]byte("abc")))
	require.Equal(t, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", Data{Value: []byte("abc")}.Hash())
	require.Empty(t, Hash(nil))
}

func TestSecretName(t *testing.T) {
	_, ready := SecretName(nil)
	require.False(t, ready, "nil: the bootstrap provider is not done")
	name, ready := SecretName(ptr.To(""))
	require.True(t, ready)
	require.Empty(t, name, "empty: no bootstrap data on purpose")
	name, ready = SecretName(ptr.To("boot"))
	require.True(t, ready)
	require.Equal(t, "boot", name)
}
