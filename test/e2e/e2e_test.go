// Package e2e runs the development stack from built binaries (dev-s3, two
// nstance-servers with the tmux provider, dev-k8s, nstance-operator and real
// nstance-agents in tmux windows) and drives it the way a developer does: by
// writing JSON files under dev-k8s's directory.
//
//	go test ./test/e2e/      (make e2e)
//
// Each run uses its own temp directory, free 127.0.0.1 ports and a private
// tmux server (tmux -L nstance-e2e-...), so it never touches a running
// `make dev-tmux-k8s` stack; teardown checks that no process is left.
package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nstance-dev/nstance/internal/testing/proctest"
)

// example loads one of examples/dev-k8s/*.json.
func (s *stack) example(name string) map[string]any {
	s.t.Helper()
	b, err := os.ReadFile(filepath.Join(s.root, "examples", "dev-k8s", name))
	if err != nil {
		s.t.Fatal(err)
	}
	var obj map[string]any
	if err := json.Unmarshal(b, &obj); err != nil {
		s.t.Fatalf("examples/dev-k8s/%s: %v", name, err)
	}
	return obj
}

func strs(v any) []string {
	list, _ := v.([]any)
	var out []string
	for _, x := range list {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// TestPoolLifecycle: an example pool with 2 replicas over dev-1 and dev-2
// gets two registered agents and two Nodes; scaling the MachinePool file to 1
// drains (cordon, evict) and removes one instance; an on-demand pod gets its
// own Machine, NstanceMachine and instance, which go with the pod; deleting
// the pool removes everything. The standalone NstanceMachine example gets
// an instance too.
func TestPoolLifecycle(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test; skipped with -short")
	}
	begin := time.Now()
	s := newStack(t)
	s.up()
	t.Logf("stack up, operator registered after %s", time.Since(begin).Round(100*time.Millisecond))

	const pool = "nstance-test"
	// The example's drainTimeout (30s) stays: scale-down must finish well
	// before it, released by the drain and not by the deadline.
	nmp := s.example("nstancemachinepool.json")
	drainTimeout, err := time.ParseDuration(field(nmp, "spec", "drainTimeout").(string))
	require.NoError(t, err)
	require.GreaterOrEqual(t, drainTimeout, 20*time.Second, "the drain step needs a deadline it cannot hit by accident")
	s.put(resNstancePools, pool, nmp)
	s.put(resPools, pool, s.example("machinepool.json"))
	created := time.Now()

	// Two instances, one per shard: agents in tmux windows register, Nodes appear.
	proctest.Eventually(s.t, "two agent windows", 60*time.Second, func() bool { return len(s.agentWindows()) == 2 })
	proctest.Eventually(s.t, "first agent registered", 60*time.Second, func() bool {
		return slices.ContainsFunc(s.agentWindows(), s.registered)
	})
	t.Logf("first agent registered %s after the pool files were written", time.Since(created).Round(100*time.Millisecond))
	proctest.Eventually(s.t, "both agents registered", 60*time.Second, func() bool {
		ids := s.agentWindows()
		return len(ids) == 2 && s.registered(ids[0]) && s.registered(ids[1])
	})
	ids := s.agentWindows()
	proctest.Eventually(s.t, "two Node files", 30*time.Second, func() bool {
		n := s.nodes()
		slices.Sort(n)
		slices.Sort(ids)
		return slices.Equal(n, ids)
	})
	var providerIDs []string
	for _, id := range ids {
		node, ok := s.get("nodes", "", id)
		if !ok {
			t.Fatalf("Node %s vanished", id)
		}
		pid, _ := field(node, "spec", "providerID").(string)
		if pid == "" {
			t.Fatalf("Node %s has no spec.providerID", id)
		}
		providerIDs = append(providerIDs, pid)
	}
	slices.Sort(providerIDs)
	for _, shard := range []string{"dev-1", "dev-2"} {
		proctest.Eventually(s.t, "shard group "+pool+"--"+shard, 30*time.Second, func() bool {
			_, ok := s.get(resShardGroups, namespace, pool+"--"+shard)
			return ok
		})
	}
	proctest.Eventually(s.t, "pool JSON lists both provider IDs and is ready", 60*time.Second, func() bool {
		obj, ok := s.get(resNstancePools, namespace, pool)
		if !ok {
			return false
		}
		got := strs(field(obj, "spec", "providerIDList"))
		slices.Sort(got)
		return slices.Equal(got, providerIDs) && field(obj, "status", "ready") == true
	})

	// One plain pod on each Node, and the example DaemonSet (applied
	// through the API, as kubectl apply does), whose pods dev-k8s's
	// DaemonSet controller puts on every Node as a cluster's node agents
	// are; a drain leaves those alone. Then scale to 1 by editing the
	// MachinePool file.
	t.Logf("2 replicas: agents %v registered, Nodes and pool status in place after %s", ids, time.Since(created).Round(100*time.Millisecond))
	evicted := s.watchEvictions("app=node-agent")
	for _, id := range ids {
		s.put("pods", "work-"+id, nodePod("work-"+id, id))
	}
	s.create(gvrDaemonSets, s.example("daemonset.json"))
	var agentPods map[string]string
	for _, id := range ids {
		proctest.Eventually(s.t, "pods on "+id+" stored with a uid", 10*time.Second, func() bool {
			w, ok := s.get("pods", namespace, "work-"+id)
			agentPods = s.daemonSetPods("node-agent")
			return ok && field(w, "metadata", "uid") != nil && agentPods[id] != ""
		})
	}
	proctest.Eventually(s.t, "DaemonSet node-agent status counts both Nodes", 10*time.Second, func() bool {
		ds, ok := s.get("daemonsets", namespace, "node-agent")
		return ok && field(ds, "status", "desiredNumberScheduled") == float64(2) && field(ds, "status", "currentNumberScheduled") == float64(2)
	})
	scaled := time.Now()
	mp, ok := s.get(resPools, namespace, pool)
	require.True(t, ok, "MachinePool file vanished")
	mp["spec"].(map[string]any)["replicas"] = 1
	s.put(resPools, pool, mp)

	// Watch until one window is left. Windows are read before pod and Node
	// files in every round, so a window seen gone had its pod evicted first
	// whenever the pod file is gone in the same round.
	cordoned := map[string]bool{}
	var gone, kept string
	proctest.Eventually(s.t, "one agent window left, well before the drain deadline", drainTimeout/2, func() bool {
		windows := s.agentWindows()
		for _, id := range ids {
			if node, ok := s.get("nodes", "", id); ok && field(node, "spec", "unschedulable") == true {
				cordoned[id] = true
			}
			if slices.Contains(windows, id) {
				continue
			}
			_, podLeft := s.get("pods", namespace, "work-"+id)
			require.False(t, podLeft, "instance %s was deleted while its pod work-%s was still on its Node", id, id)
			gone = id
		}
		if len(windows) == 1 {
			kept = windows[0]
		}
		return len(windows) == 1 && gone != ""
	})
	require.Contains(t, ids, kept)
	require.True(t, cordoned[gone], "Node %s was never seen with spec.unschedulable: true before it went", gone)
	require.False(t, cordoned[kept], "the surviving Node %s was cordoned", kept)
	proctest.Eventually(s.t, "a Drained Event on Node "+gone, 10*time.Second, func() bool {
		return slices.Contains(s.nodeEventReasons(gone), "Drained")
	})
	require.NotContains(t, s.nodeEventReasons(gone), "DrainDeadlineExceeded")
	require.Empty(t, evicted(), "the drain evicted DaemonSet pods")
	// The Node is gone, and with it (through the DaemonSet controller, not
	// the drain) its node-agent pod; the surviving Node keeps its own.
	proctest.Eventually(s.t, "node-agent pod only on "+kept, 30*time.Second, func() bool {
		now := s.daemonSetPods("node-agent")
		return len(now) == 1 && now[kept] == agentPods[kept]
	})
	survivor, ok := s.get("pods", namespace, "work-"+kept)
	require.True(t, ok, "the pod on the surviving Node %s was removed", kept)
	require.Nil(t, field(survivor, "metadata", "deletionTimestamp"), "the pod on the surviving Node %s is being deleted", kept)
	node, ok := s.get("nodes", "", kept)
	require.True(t, ok, "the surviving Node %s vanished", kept)
	require.NotEqual(t, true, field(node, "spec", "unschedulable"), "the surviving Node %s is cordoned", kept)

	proctest.Eventually(s.t, "removed instance's Node file and state gone", 30*time.Second, func() bool {
		_, node := s.get("nodes", "", gone)
		_, err := os.Stat(filepath.Join(s.dir, "agents", gone))
		return !node && os.IsNotExist(err)
	})
	proctest.Eventually(s.t, "pool JSON lists one provider ID", 60*time.Second, func() bool {
		obj, ok := s.get(resNstancePools, namespace, pool)
		return ok && len(strs(field(obj, "spec", "providerIDList"))) == 1 && field(obj, "status", "ready") == true
	})

	t.Logf("scaled to 1 (%s removed) in %s", gone, time.Since(scaled).Round(100*time.Millisecond))

	s.onDemand(kept)
	s.single(kept)

	deleted := time.Now()

	// Delete the pool (through the API, as kubectl delete would: finalizers run).
	s.delete(schema.GroupVersionResource{Group: "cluster.x-k8s.io", Version: "v1beta2", Resource: "machinepools"}, pool)
	s.delete(schema.GroupVersionResource{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta1", Resource: "nstancemachinepools"}, pool)
	proctest.Eventually(s.t, "pool, shard groups, agents and Nodes gone", 90*time.Second, func() bool {
		_, p := s.get(resNstancePools, namespace, pool)
		_, g1 := s.get(resShardGroups, namespace, pool+"--dev-1")
		_, g2 := s.get(resShardGroups, namespace, pool+"--dev-2")
		return !p && !g1 && !g2 && len(s.agentWindows()) == 0 && len(s.nodes()) == 0
	})
	t.Logf("pool deleted and cleaned up in %s", time.Since(deleted).Round(100*time.Millisecond))
}

var (
	gvrDaemonSets = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}
	gvrPods       = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
)

// dynamicClient is a client of dev-k8s's Kubernetes API.
func (s *stack) dynamicClient() dynamic.Interface {
	s.t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(s.dir, "operator", "kubeconfig"))
	if err != nil {
		s.t.Fatal(err)
	}
	cfg.ContentType = "application/json"
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	return dyn
}

// delete removes an object through the Kubernetes API of dev-k8s.
func (s *stack) delete(gvr schema.GroupVersionResource, name string) {
	s.t.Helper()
	if err := s.dynamicClient().Resource(gvr).Namespace(namespace).Delete(ctx(s.t), name, metav1.DeleteOptions{}); err != nil {
		s.t.Fatalf("deleting %s %s: %v", gvr.Resource, name, err)
	}
}

// create creates an object through the Kubernetes API of dev-k8s.
func (s *stack) create(gvr schema.GroupVersionResource, obj map[string]any) {
	s.t.Helper()
	if _, err := s.dynamicClient().Resource(gvr).Namespace(namespace).Create(ctx(s.t), &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		s.t.Fatalf("creating %s: %v", gvr.Resource, err)
	}
}

// daemonSetPods maps Node name to the uid of the live pod a DaemonSet
// controls there.
func (s *stack) daemonSetPods(ds string) map[string]string {
	s.t.Helper()
	list, err := s.dynamicClient().Resource(gvrPods).Namespace(namespace).List(ctx(s.t), metav1.ListOptions{})
	if err != nil {
		s.t.Fatalf("listing pods: %v", err)
	}
	out := map[string]string{}
	for _, p := range list.Items {
		ref := metav1.GetControllerOf(&p)
		if ref == nil || ref.Kind != "DaemonSet" || ref.Name != ds || p.GetDeletionTimestamp() != nil {
			continue
		}
		node, _, _ := unstructured.NestedString(p.Object, "spec", "nodeName")
		out[node] = string(p.GetUID())
	}
	return out
}

// watchEvictions watches the pods matching selector until the test ends and
// returns a function listing those the Eviction API evicted so far
// (kube-apiserver, and dev-k8s, mark an evicted pod with a DisruptionTarget
// condition before deleting it). The function first creates a marker pod
// matching selector and waits until the watch delivered it, so every
// earlier event has been seen. After a watch error the pods are listed
// again and watched from there.
func (s *stack) watchEvictions(selector string) func() []string {
	s.t.Helper()
	dyn := s.dynamicClient()
	pods := dyn.Resource(gvrPods).Namespace(namespace)
	wctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	evicted := map[string]bool{}
	seen := map[string]bool{}
	scan := func(u *unstructured.Unstructured) {
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		mu.Lock()
		defer mu.Unlock()
		seen[u.GetName()] = true
		for _, c := range conds {
			if m, _ := c.(map[string]any); m["type"] == "DisruptionTarget" && m["reason"] == "EvictionByEvictionAPI" {
				evicted[u.GetName()] = true
			}
		}
	}
	relist := func() (string, error) {
		list, err := pods.List(wctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return "", err
		}
		for i := range list.Items {
			scan(&list.Items[i])
		}
		return list.GetResourceVersion(), nil
	}
	rv, err := relist()
	if err != nil {
		cancel()
		s.t.Fatalf("listing pods: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for wctx.Err() == nil {
			w, err := pods.Watch(wctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: rv})
			for err == nil {
				ev, open := <-w.ResultChan()
				if !open {
					break
				}
				u, ok := ev.Object.(*unstructured.Unstructured)
				if !ok { // a watch error (410 Gone, say): list again
					err = errors.New("watch error")
					break
				}
				rv = u.GetResourceVersion()
				scan(u)
			}
			if w != nil {
				w.Stop()
			}
			if err != nil {
				select {
				case <-wctx.Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
				if r, lerr := relist(); lerr == nil {
					rv = r
				}
			}
		}
	}()
	s.t.Cleanup(func() {
		cancel()
		<-done
	})
	markers := 0
	return func() []string {
		s.t.Helper()
		markers++
		name := fmt.Sprintf("watch-marker-%d", markers)
		lbls, err := labels.ConvertSelectorToLabelsMap(selector)
		if err != nil {
			s.t.Fatal(err)
		}
		marker := nodePod(name, "")
		md := marker["metadata"].(map[string]any)
		md["labels"] = map[string]any{}
		for k, v := range lbls {
			md["labels"].(map[string]any)[k] = v
		}
		delete(marker["spec"].(map[string]any), "nodeName")
		s.create(gvrPods, marker)
		proctest.Eventually(s.t, "the eviction watch saw "+name, 10*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return seen[name]
		})
		if err := pods.Delete(ctx(s.t), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			s.t.Fatalf("deleting %s: %v", name, err)
		}
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for n := range evicted {
			out = append(out, n)
		}
		slices.Sort(out)
		return out
	}
}

// nodePod is a pod bound to a Node, with a short grace period so that its
// eviction takes a moment (dev-k8s finishes it as a kubelet would).
func nodePod(name, node string) map[string]any {
	md := map[string]any{"name": name, "namespace": namespace}
	return map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": md,
		"spec": map[string]any{"nodeName": node, "terminationGracePeriodSeconds": 2,
			"containers": []any{map[string]any{"name": "c", "image": "busybox"}}}}
}

// nodeEventReasons lists the reasons of the core/v1 Events about a Node.
func (s *stack) nodeEventReasons(node string) []string {
	dir := filepath.Join(s.k8sDir, "events", namespace)
	entries, _ := os.ReadDir(dir)
	var reasons []string
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(name, ".") {
			continue
		}
		ev, ok := s.get("events", namespace, name)
		if ok && field(ev, "involvedObject", "kind") == "Node" && field(ev, "involvedObject", "name") == node {
			reasons = append(reasons, field(ev, "reason").(string))
		}
	}
	return reasons
}

// onDemand writes examples/dev-k8s/pod-on-demand.json (group nstance-test)
// and follows it to a Machine, an NstanceMachine and an agent with its Node;
// deleting the pod file removes all of them. poolInstance is the pool's
// instance, which must stay.
func (s *stack) onDemand(poolInstance string) {
	t := s.t
	t.Helper()
	begin := time.Now()
	pod := s.example("pod-on-demand.json")
	name := field(pod, "metadata", "name").(string)
	require.Equal(t, namespace, field(pod, "metadata", "namespace"))
	require.Equal(t, "nstance-test", field(pod, "metadata", "annotations", "on-demand.nstance.dev/group"))
	s.put("pods", name, pod)

	var uid string
	proctest.Eventually(s.t, "pod "+name+" stored with a uid", 10*time.Second, func() bool {
		obj, ok := s.get("pods", namespace, name)
		uid, _ = field(obj, "metadata", "uid").(string)
		return ok && uid != ""
	})
	od := "od-" + uid
	proctest.Eventually(s.t, "Machine and NstanceMachine "+od, 30*time.Second, func() bool {
		_, m := s.get(resMachines, namespace, od)
		_, nm := s.get(resNstanceMachines, namespace, od)
		return m && nm
	})
	m, _ := s.get(resMachines, namespace, od)
	require.Equal(t, clusterID, field(m, "spec", "clusterName"))
	require.Equal(t, "NstanceMachine", field(m, "spec", "infrastructureRef", "kind"))
	require.Equal(t, od, field(m, "spec", "infrastructureRef", "name"))

	var id string
	proctest.Eventually(s.t, "an agent window for the on-demand instance", 60*time.Second, func() bool {
		for _, w := range s.agentWindows() {
			if w != poolInstance {
				id = w
			}
		}
		return id != ""
	})
	proctest.Eventually(s.t, "on-demand agent "+id+" registered and its Node file", 60*time.Second, func() bool {
		_, ok := s.get("nodes", "", id)
		return ok && s.registered(id)
	})
	node, _ := s.get("nodes", "", id)
	providerID, _ := field(node, "spec", "providerID").(string)
	require.NotEmpty(t, providerID, "Node %s has no spec.providerID", id)
	proctest.Eventually(s.t, "NstanceMachine "+od+" has the Node's providerID and is ready", 30*time.Second, func() bool {
		nm, ok := s.get(resNstanceMachines, namespace, od)
		return ok && field(nm, "spec", "providerID") == providerID && field(nm, "status", "ready") == true
	})
	nm, _ := s.get(resNstanceMachines, namespace, od)
	require.Equal(t, id, field(nm, "status", "instanceID"))
	t.Logf("on-demand pod: instance %s ready, NstanceMachine %s carries its providerID, after %s", id, od, time.Since(begin).Round(100*time.Millisecond))

	removed := time.Now()
	require.NoError(t, os.Remove(s.path("pods", namespace, name)))
	proctest.Eventually(s.t, "on-demand Machine, NstanceMachine, agent window and Node gone", 30*time.Second, func() bool {
		_, m := s.get(resMachines, namespace, od)
		_, nm := s.get(resNstanceMachines, namespace, od)
		_, n := s.get("nodes", "", id)
		return !m && !nm && !n && !slices.Contains(s.agentWindows(), id)
	})
	require.Contains(t, s.agentWindows(), poolInstance, "the pool's instance went with the on-demand one")
	t.Logf("on-demand pod deleted: its instance %s cleaned up in %s", id, time.Since(removed).Round(100*time.Millisecond))
}

// single writes examples/dev-k8s/nstancemachine.json and machine.json (one
// instance outside any pool) and waits for the instance, its Node and a ready
// NstanceMachine; deleting the NstanceMachine through the API (its finalizer
// runs) deletes the instance.
func (s *stack) single(poolInstance string) {
	t := s.t
	t.Helper()
	begin := time.Now()
	nm := s.example("nstancemachine.json")
	name := field(nm, "metadata", "name").(string)
	s.put(resNstanceMachines, name, nm)
	s.put(resMachines, name, s.example("machine.json"))
	var id string
	proctest.Eventually(s.t, "NstanceMachine "+name+" ready with the providerID of its Node", 60*time.Second, func() bool {
		obj, ok := s.get(resNstanceMachines, namespace, name)
		id, _ = field(obj, "status", "instanceID").(string)
		if !ok || id == "" || field(obj, "status", "ready") != true {
			return false
		}
		node, ok := s.get("nodes", "", id)
		return ok && field(obj, "spec", "providerID") == field(node, "spec", "providerID")
	})
	require.Contains(t, s.agentWindows(), id)
	t.Logf("NstanceMachine %s: instance %s ready after %s", name, id, time.Since(begin).Round(100*time.Millisecond))

	s.delete(schema.GroupVersionResource{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta1", Resource: "nstancemachines"}, name)
	s.delete(schema.GroupVersionResource{Group: "cluster.x-k8s.io", Version: "v1beta2", Resource: "machines"}, name)
	proctest.Eventually(s.t, "NstanceMachine "+name+", its agent window and Node gone", 30*time.Second, func() bool {
		_, obj := s.get(resNstanceMachines, namespace, name)
		_, node := s.get("nodes", "", id)
		return !obj && !node && !slices.Contains(s.agentWindows(), id)
	})
	require.Contains(t, s.agentWindows(), poolInstance, "the pool's instance went with %s", name)
}
