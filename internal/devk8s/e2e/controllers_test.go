package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func TestTLSKubeconfigAndRestart(t *testing.T) {
	dir := t.TempDir()
	var firstCA []byte
	var firstUID string
	for round := 0; round < 2; round++ {
		func() {
			ctx, cancel := context.WithCancel(context.Background())
			d, wait := launch(t, ctx, dir, true)
			defer func() {
				cancel()
				require.NoError(t, wait())
			}()
			raw, err := clientcmd.LoadFromFile(d.kubeconfig)
			require.NoError(t, err)
			ca := raw.Clusters[raw.Contexts[raw.CurrentContext].Cluster].CertificateAuthorityData
			require.NotEmpty(t, ca)
			require.Equal(t, "https", d.url[:5])
			cs, err := kubernetes.NewForConfig(d.config)
			require.NoError(t, err)
			if round == 0 {
				firstCA = ca
				cm, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kept"}}, metav1.CreateOptions{})
				require.NoError(t, err)
				firstUID = string(cm.UID)
				return
			}
			require.Equal(t, firstCA, ca, "the CA survives a restart so kubeconfigs stay valid")
			cm, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "kept", metav1.GetOptions{})
			require.NoError(t, err)
			require.Equal(t, firstUID, string(cm.UID))
		}()
	}
}

func TestControllers(t *testing.T) {
	d := startDev(t, false)
	cs, err := kubernetes.NewForConfig(d.config)
	require.NoError(t, err)
	ctx := context.Background()
	cms := cs.CoreV1().ConfigMaps("default")
	gone := func(name string) func() bool {
		return func() bool {
			_, err := cms.Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		}
	}
	owned := func(name string, owner *corev1.ConfigMap) {
		_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID,
		}}}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}

	cases := []struct {
		name   string
		policy metav1.DeletionPropagation
		// dependentGone tells whether the dependent is deleted.
		dependentGone bool
	}{
		{name: "background", policy: metav1.DeletePropagationBackground, dependentGone: true},
		{name: "foreground", policy: metav1.DeletePropagationForeground, dependentGone: true},
		{name: "orphan", policy: metav1.DeletePropagationOrphan, dependentGone: false},
	}
	for _, tc := range cases {
		t.Run("gc-"+tc.name, func(t *testing.T) {
			owner, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner-" + tc.name}}, metav1.CreateOptions{})
			require.NoError(t, err)
			owned("dep-"+tc.name, owner)
			policy := tc.policy
			require.NoError(t, cms.Delete(ctx, owner.Name, metav1.DeleteOptions{PropagationPolicy: &policy}))
			require.Eventually(t, gone(owner.Name), 10*time.Second, 50*time.Millisecond)
			if tc.dependentGone {
				require.Eventually(t, gone("dep-"+tc.name), 10*time.Second, 50*time.Millisecond)
				return
			}
			dep, err := cms.Get(ctx, "dep-"+tc.name, metav1.GetOptions{})
			require.NoError(t, err)
			require.Empty(t, dep.OwnerReferences)
		})
	}

	t.Run("gc-unserved-owner-kind", func(t *testing.T) {
		// A dependent of a missing ConfigMap goes; one owned by a kind dev-k8s
		// does not serve stays, as with kube-apiserver's collector.
		_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "dep-unserved", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "batch/v1", Kind: "Job", Name: "job", UID: "00000000-0000-0000-0000-0000000000d5",
		}}}}, metav1.CreateOptions{})
		require.NoError(t, err)
		owned("dep-missing-owner", &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "never-created", UID: "00000000-0000-0000-0000-00000000dead"}})
		require.Eventually(t, gone("dep-missing-owner"), 10*time.Second, 50*time.Millisecond)
		_, err = cms.Get(ctx, "dep-unserved", metav1.GetOptions{})
		require.NoError(t, err)
	})

	t.Run("namespace-deletion", func(t *testing.T) {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "doomed"}}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = cs.CoreV1().ConfigMaps("doomed").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
		require.NoError(t, err)
		require.NoError(t, cs.CoreV1().Namespaces().Delete(ctx, "doomed", metav1.DeleteOptions{}))
		require.Eventually(t, func() bool {
			_, err := cs.CoreV1().Namespaces().Get(ctx, "doomed", metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		}, 10*time.Second, 50*time.Millisecond)
		_, err = cs.CoreV1().ConfigMaps("doomed").Get(ctx, "x", metav1.GetOptions{})
		require.True(t, apierrors.IsNotFound(err))
	})

	t.Run("pod-termination-and-pdb-status", func(t *testing.T) {
		pods := cs.CoreV1().Pods("default")
		grace := int64(1)
		for _, n := range []string{"p1", "p2"} {
			_, err := pods.Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"app": "pdb"}},
				Spec:       corev1.PodSpec{NodeName: "n1", TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{{Name: "c", Image: "busybox:1.36"}}},
			}, metav1.CreateOptions{})
			require.NoError(t, err)
			p, err := pods.Get(ctx, n, metav1.GetOptions{})
			require.NoError(t, err)
			p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
			_, err = pods.UpdateStatus(ctx, p, metav1.UpdateOptions{})
			require.NoError(t, err)
		}
		one := intstr.FromInt32(1)
		_, err := cs.PolicyV1().PodDisruptionBudgets("default").Create(ctx, &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Name: "pdb"},
			Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "pdb"}}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			b, err := cs.PolicyV1().PodDisruptionBudgets("default").Get(ctx, "pdb", metav1.GetOptions{})
			return err == nil && b.Status.DisruptionsAllowed == 1 && b.Status.ObservedGeneration == b.Generation
		}, 10*time.Second, 50*time.Millisecond)
		ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "p1", Namespace: "default"}}
		require.NoError(t, pods.EvictV1(ctx, ev))
		// The first eviction used the budget; the second is refused.
		err = pods.EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "p2", Namespace: "default"}})
		require.True(t, apierrors.IsTooManyRequests(err), "%v", err)
		p, err := pods.Get(ctx, "p1", metav1.GetOptions{})
		require.NoError(t, err)
		require.NotNil(t, p.DeletionTimestamp, "a pod on a node terminates gracefully")
		require.Eventually(t, func() bool {
			_, err := pods.Get(ctx, "p1", metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		}, 10*time.Second, 50*time.Millisecond)
	})
}
