package workload

import (
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParseMode(t *testing.T) {
	//nolint:gocritic // the spaces around " management " are the case: ParseMode trims them
	for in, want := range map[string]Mode{"": InCluster, "in-cluster": InCluster, " management ": Management} {
		got, err := ParseMode(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"auto", "Management", "incluster"} {
		_, err := ParseMode(in)
		require.ErrorContains(t, err, `want in-cluster or management`, in)
	}
}

func TestNodeProviderID(t *testing.T) {
	require.Equal(t, []string{"nstance://c/s/i"}, NodeProviderID(&corev1.Node{Spec: corev1.NodeSpec{ProviderID: "nstance://c/s/i"}}))
	require.Nil(t, NodeProviderID(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "unregistered"}}))
}
