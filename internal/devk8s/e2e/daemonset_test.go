package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// TestDaemonSetController drives dev-k8s's DaemonSet controller through
// the cases a real cluster meets: node selection and taints, template
// rollouts, Nodes joining, leaving and changing labels, status counts, and
// deletion with and without orphaning. Expected values are what
// kube-controller-manager's controller (plus the scheduler's binding)
// produces.
func TestDaemonSetController(t *testing.T) {
	d := startDev(t, true) // kubectl sends the token over TLS only
	cs, err := kubernetes.NewForConfig(d.config)
	require.NoError(t, err)
	ctx := context.Background()
	const ns = "default"
	pods := cs.CoreV1().Pods(ns)
	dss := cs.AppsV1().DaemonSets(ns)

	// Nodes as a node lifecycle controller leaves them once Ready: the
	// not-ready taint dev-k8s adds on create is replaced by the test's.
	node := func(name string, lbls map[string]string, taints ...corev1.Taint) {
		n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}}, metav1.CreateOptions{})
		require.NoError(t, err)
		n.Spec.Taints = taints
		_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	edge := map[string]string{"role": "edge"}
	node("n1", edge)
	node("n2", edge, corev1.Taint{Key: "dedicated", Value: "x", Effect: corev1.TaintEffectNoSchedule})
	node("n3", nil)
	// A PreferNoSchedule taint does not keep DaemonSet pods away.
	node("n4", edge, corev1.Taint{Key: "soft", Effect: corev1.TaintEffectPreferNoSchedule})
	// A Node still carrying the not-ready NoSchedule taint gets no pod
	// either (the controller's own not-ready toleration is NoExecute).
	_, err = cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n5", Labels: edge}}, metav1.CreateOptions{})
	require.NoError(t, err)

	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "agent"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "agent"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "agent"}},
				Spec: corev1.PodSpec{
					NodeSelector:                  edge,
					TerminationGracePeriodSeconds: ptr.To[int64](0),
					Containers:                    []corev1.Container{{Name: "c", Image: "busybox:1.36"}},
				},
			},
		},
	}
	ds, err = dss.Create(ctx, ds, metav1.CreateOptions{})
	require.NoError(t, err)

	// podsByNode lists the DaemonSet's live pods per Node.
	podsByNode := func(owner *appsv1.DaemonSet) map[string]corev1.Pod {
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "app=agent"})
		require.NoError(t, err)
		out := map[string]corev1.Pod{}
		for _, p := range list.Items {
			if ref := metav1.GetControllerOf(&p); ref != nil && ref.UID == owner.UID && p.DeletionTimestamp == nil {
				out[p.Spec.NodeName] = p
			}
		}
		return out
	}
	nodesOf := func(m map[string]corev1.Pod) string {
		var out []string
		for n := range m {
			out = append(out, n)
		}
		sort.Strings(out)
		return strings.Join(out, ",")
	}
	waitNodes := func(want string) map[string]corev1.Pod {
		t.Helper()
		var got map[string]corev1.Pod
		if !assert.Eventually(t, func() bool {
			got = podsByNode(ds)
			return nodesOf(got) == want
		}, 10*time.Second, 20*time.Millisecond) {
			t.Fatalf("DaemonSet pods on Nodes %q, want %q", nodesOf(got), want)
		}
		return got
	}
	status := func() string {
		cur, err := dss.Get(ctx, ds.Name, metav1.GetOptions{})
		require.NoError(t, err)
		s := cur.Status
		return fmt.Sprintf("gen=%d observed=%d desired=%d current=%d misscheduled=%d ready=%d available=%d unavailable=%d updated=%d",
			cur.Generation, s.ObservedGeneration, s.DesiredNumberScheduled, s.CurrentNumberScheduled, s.NumberMisscheduled,
			s.NumberReady, s.NumberAvailable, s.NumberUnavailable, s.UpdatedNumberScheduled)
	}
	waitStatus := func(want string) {
		t.Helper()
		var got string
		if !assert.Eventually(t, func() bool { got = status(); return got == want }, 10*time.Second, 20*time.Millisecond) {
			t.Fatalf("status %q, want %q", got, want)
		}
	}
	setReady := func(p corev1.Pod) {
		t.Helper()
		require.Eventually(t, func() bool {
			cur, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			cur.Status.Phase = corev1.PodRunning
			cur.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
			_, err = pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
			return err == nil
		}, 10*time.Second, 20*time.Millisecond)
	}

	// One pod, on the only edge Node without an untolerated hard taint.
	got := waitNodes("n1,n4")
	p := got["n1"]
	ref := metav1.GetControllerOf(&p)
	require.NotNil(t, ref)
	require.Equal(t, metav1.OwnerReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "agent", UID: ds.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}, *ref)
	require.True(t, strings.HasPrefix(p.Name, "agent-"), p.Name)
	require.Equal(t, "1", p.Labels["pod-template-generation"])
	require.NotEmpty(t, p.Labels["controller-revision-hash"])
	require.Equal(t, &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
		{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}}}}},
		p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution)
	var tolerated []string
	for _, tol := range p.Spec.Tolerations {
		tolerated = append(tolerated, tol.Key+":"+string(tol.Effect))
	}
	require.ElementsMatch(t, []string{"node.kubernetes.io/not-ready:NoExecute", "node.kubernetes.io/unreachable:NoExecute",
		"node.kubernetes.io/disk-pressure:NoSchedule", "node.kubernetes.io/memory-pressure:NoSchedule",
		"node.kubernetes.io/pid-pressure:NoSchedule", "node.kubernetes.io/unschedulable:NoSchedule"}, tolerated)
	waitStatus("gen=1 observed=1 desired=2 current=2 misscheduled=0 ready=0 available=0 unavailable=2 updated=2")
	setReady(got["n1"])
	setReady(got["n4"])
	waitStatus("gen=1 observed=1 desired=2 current=2 misscheduled=0 ready=2 available=2 unavailable=0 updated=2")

	// A cordoned Node keeps its pod (the controller tolerates unschedulable).
	n1, err := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	require.NoError(t, err)
	n1.Spec.Unschedulable = true
	_, err = cs.CoreV1().Nodes().Update(ctx, n1, metav1.UpdateOptions{})
	require.NoError(t, err)

	// Tolerating the dedicated taint is a template change: generation 2,
	// a pod on n2, and the older pods replaced one at a time
	// (maxUnavailable 1), each once the Nodes' new pods are ready.
	cur, err := dss.Get(ctx, ds.Name, metav1.GetOptions{})
	require.NoError(t, err)
	cur.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	cur, err = dss.Update(ctx, cur, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Equal(t, int64(2), cur.Generation)
	require.Equal(t, "2", cur.Annotations[appsv1.DeprecatedTemplateGeneration])
	got = waitNodes("n1,n2,n4")
	require.Equal(t, "2", got["n2"].Labels["pod-template-generation"])
	require.Equal(t, p.UID, got["n1"].UID, "no old pod is replaced while the new one is unavailable")
	waitStatus("gen=2 observed=2 desired=3 current=3 misscheduled=0 ready=2 available=2 unavailable=1 updated=1")
	setReady(got["n2"])
	for round := 0; round < 2; round++ {
		var fresh map[string]corev1.Pod
		require.Eventually(t, func() bool {
			fresh = podsByNode(ds)
			updated := 0
			for _, fp := range fresh {
				if fp.Labels["pod-template-generation"] == "2" {
					updated++
				}
			}
			return len(fresh) == 3 && updated == 2+round
		}, 10*time.Second, 20*time.Millisecond)
		for _, fp := range fresh {
			if fp.Labels["pod-template-generation"] == "2" && !podIsReady(fp) {
				setReady(fp)
			}
		}
	}
	got = waitNodes("n1,n2,n4")
	require.NotEqual(t, p.UID, got["n1"].UID, "the old pod on n1 was replaced")
	waitStatus("gen=2 observed=2 desired=3 current=3 misscheduled=0 ready=3 available=3 unavailable=0 updated=3")

	// Labels change: n3 joins, n1 leaves (its pod is deleted); n4 goes away.
	n3, err := cs.CoreV1().Nodes().Get(ctx, "n3", metav1.GetOptions{})
	require.NoError(t, err)
	n3.Labels = edge
	_, err = cs.CoreV1().Nodes().Update(ctx, n3, metav1.UpdateOptions{})
	require.NoError(t, err)
	n1, err = cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	require.NoError(t, err)
	n1.Labels = map[string]string{"role": "core"}
	_, err = cs.CoreV1().Nodes().Update(ctx, n1, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, cs.CoreV1().Nodes().Delete(ctx, "n4", metav1.DeleteOptions{}))
	waitNodes("n2,n3")
	waitStatus("gen=2 observed=2 desired=2 current=2 misscheduled=0 ready=1 available=1 unavailable=1 updated=2")

	// kubectl sees the kind by its short name, with the controller's counts.
	out := d.mustKubectl(t, "get", "ds", "-n", ns)
	require.Regexp(t, `(?m)^NAME\s+DESIRED\s+CURRENT\s+READY\s+UP-TO-DATE\s+AVAILABLE\s+NODE SELECTOR\s+AGE$`, out)
	require.Regexp(t, `(?m)^agent\s+2\s+2\s+1\s+2\s+1\s+role=edge\s+`, out)
	out = d.mustKubectl(t, "api-resources", "--api-group=apps")
	for _, want := range []string{`daemonsets\s+ds\s+apps/v1\s+true\s+DaemonSet`, `deployments\s+deploy\s+apps/v1\s+true\s+Deployment`,
		`replicasets\s+rs\s+apps/v1\s+true\s+ReplicaSet`, `statefulsets\s+sts\s+apps/v1\s+true\s+StatefulSet`} {
		require.Regexp(t, want, out)
	}

	// Deleting with propagationPolicy Orphan keeps the pods, without the
	// owner reference.
	require.NoError(t, dss.Delete(ctx, ds.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationOrphan)}))
	require.Eventually(t, func() bool {
		_, err := dss.Get(ctx, ds.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "app=agent"})
		if err != nil || len(list.Items) != 2 {
			return false
		}
		for _, lp := range list.Items {
			if len(lp.OwnerReferences) > 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond)

	// A new DaemonSet makes its own pods beside the orphans (no adoption),
	// and deleting it (background propagation) removes them.
	ds2 := cur.DeepCopy() // with the dedicated toleration
	ds2.ObjectMeta = metav1.ObjectMeta{Name: "agent2"}
	ds2.Status = appsv1.DaemonSetStatus{}
	ds, err = dss.Create(ctx, ds2, metav1.CreateOptions{})
	require.NoError(t, err)
	waitNodes("n2,n3")
	require.NoError(t, dss.Delete(ctx, ds.Name, metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return len(podsByNode(ds)) == 0 }, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "app=agent"})
		return err == nil && len(list.Items) == 2
	}, 10*time.Second, 20*time.Millisecond, "the orphans stay")
}

func podIsReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// TestDaemonSetFile: a DaemonSet written as a JSON file, the way a
// developer adds one, is served defaulted as one created through the API,
// gets its pods, and a hand edit of its template bumps generation and
// template generation.
func TestDaemonSetFile(t *testing.T) {
	d := startDev(t, false)
	cs, err := kubernetes.NewForConfig(d.config)
	require.NoError(t, err)
	ctx := context.Background()
	n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	n.Spec.Taints = nil
	_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	require.NoError(t, err)

	file := func(image string) string {
		return `{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "edited", "namespace": "default"},
  "spec": {"selector": {"matchLabels": {"app": "edited"}},
    "template": {"metadata": {"labels": {"app": "edited"}},
      "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "c", "image": "` + image + `"}]}}}}`
	}
	require.NoError(t, os.MkdirAll(filepath.Join(d.dir, "daemonsets", "default"), 0o755))
	writeFile(t, d.dir, "daemonsets/default/edited.json", file("busybox:1.36"))
	var ds *appsv1.DaemonSet
	require.Eventually(t, func() bool {
		ds, err = cs.AppsV1().DaemonSets("default").Get(ctx, "edited", metav1.GetOptions{})
		return err == nil
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, int64(1), ds.Generation)
	require.Equal(t, "1", ds.Annotations[appsv1.DeprecatedTemplateGeneration])
	require.Equal(t, appsv1.RollingUpdateDaemonSetStrategyType, ds.Spec.UpdateStrategy.Type)
	require.Equal(t, ptr.To[int32](10), ds.Spec.RevisionHistoryLimit)
	require.Equal(t, corev1.RestartPolicyAlways, ds.Spec.Template.Spec.RestartPolicy)
	require.Equal(t, corev1.PullIfNotPresent, ds.Spec.Template.Spec.Containers[0].ImagePullPolicy)
	require.Eventually(t, func() bool {
		list, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=edited"})
		return err == nil && len(list.Items) == 1 && list.Items[0].Spec.NodeName == "n1"
	}, 10*time.Second, 20*time.Millisecond)
	// The controller's status writes rewrite the file too: edit it once they
	// are done, as a developer editing it concurrently could lose the edit.
	require.Eventually(t, func() bool {
		ds, err = cs.AppsV1().DaemonSets("default").Get(ctx, "edited", metav1.GetOptions{})
		return err == nil && ds.Status.ObservedGeneration == 1 && ds.Status.CurrentNumberScheduled == 1
	}, 10*time.Second, 20*time.Millisecond)

	tmp := writeFile(t, d.dir, "daemonsets/default/.edited.json.tmp", file("busybox:1.37"))
	require.NoError(t, os.Rename(tmp, filepath.Join(d.dir, "daemonsets/default/edited.json")))
	require.Eventually(t, func() bool {
		ds, err = cs.AppsV1().DaemonSets("default").Get(ctx, "edited", metav1.GetOptions{})
		return err == nil && ds.Spec.Template.Spec.Containers[0].Image == "busybox:1.37"
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, int64(2), ds.Generation)
	require.Equal(t, "2", ds.Annotations[appsv1.DeprecatedTemplateGeneration])
	require.Eventually(t, func() bool {
		list, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=edited"})
		return err == nil && len(list.Items) == 1 && list.Items[0].Labels["pod-template-generation"] == "2"
	}, 10*time.Second, 20*time.Millisecond, "the RollingUpdate replaces the unavailable pod at once")
}
