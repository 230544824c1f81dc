package leaderaddr

import (
	"context"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

func TestLeaderLabelPatch(t *testing.T) {
	for _, tc := range []struct {
		leading bool
		want    string
	}{
		{true, `{"metadata":{"labels":{"nstance.dev/shard-leader":"true"}}}`},
		{false, `{"metadata":{"labels":{"nstance.dev/shard-leader":null}}}`},
	} {
		require.JSONEq(t, tc.want, string(leaderLabelPatch(tc.leading)))
	}
}

func TestParsePodRef(t *testing.T) {
	for _, tc := range []struct {
		ref, ns, name, err string
	}{
		{ref: "nstance-system/nstance-server-a-7d9f-x2", ns: "nstance-system", name: "nstance-server-a-7d9f-x2"},
		{ref: "pod", err: "want namespace/name"},
		{ref: "/pod", err: "want namespace/name"},
		{ref: "ns/", err: "want namespace/name"},
		{ref: "Bad_NS/pod", err: "namespace"},
		{ref: "ns/Bad_Pod", err: "name"},
		// Unexpanded $(POD_NAMESPACE)/$(POD_NAME): the variables were not set.
		{ref: "$(POD_NAMESPACE)/$(POD_NAME)", err: "namespace"},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			ns, name, err := ParsePodRef(tc.ref)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.ns, ns)
			require.Equal(t, tc.name, name)
		})
	}
}

// TestPodLabelAgainstAPIServer runs the holder against a real kube-apiserver
// (envtest) as the shard's pods would: acquire labels only this pod, release
// removes the label and is a no-op when repeated, a deleted pod holds
// nothing, and a pod that does not exist cannot be acquired.
func TestPodLabelAgainstAPIServer(t *testing.T) {
	ctx := context.Background()
	env := kubetest.Start(t)
	const ns = "default"
	for _, name := range []string{"server-a", "server-b"} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "nstance-server"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "server", Image: "nstance-server"}}},
		}
		require.NoError(t, env.Client.Create(ctx, pod))
	}
	holder := func(name string) *PodLabel {
		h, err := NewPodLabel(rest.CopyConfig(env.Config), ns+"/"+name, logr.Discard())
		require.NoError(t, err)
		return h
	}
	labels := func(name string) map[string]string {
		var pod corev1.Pod
		require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pod))
		return pod.Labels
	}

	a, b := holder("server-a"), holder("server-b")
	require.NoError(t, a.Release(ctx), "release at start without a label")
	require.NoError(t, a.Acquire(ctx))
	require.Equal(t, map[string]string{"app": "nstance-server", LeaderLabel: "true"}, labels("server-a"))
	require.Equal(t, map[string]string{"app": "nstance-server"}, labels("server-b"), "only the leader's pod")

	// Hand-over: the old leader releases, the new one acquires.
	require.NoError(t, a.Release(ctx))
	require.NoError(t, b.Acquire(ctx))
	require.Equal(t, map[string]string{"app": "nstance-server"}, labels("server-a"))
	require.Equal(t, "true", labels("server-b")[LeaderLabel])
	require.NoError(t, a.Release(ctx), "release twice")

	require.NoError(t, env.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "server-b", Namespace: ns}}))
	require.NoError(t, b.Release(ctx), "a deleted pod holds nothing")
	err := b.Acquire(ctx)
	require.ErrorContains(t, err, "label pod default/server-b")
	require.ErrorContains(t, err, "not found")
}
