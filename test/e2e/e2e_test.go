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
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
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
// removes one instance; deleting the pool removes everything.
func TestPoolLifecycle(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test; skipped with -short")
	}
	begin := time.Now()
	s := newStack(t)
	s.up()
	t.Logf("stack up, operator registered after %s", time.Since(begin).Round(100*time.Millisecond))

	const pool = "nstance-test"
	nmp := s.example("nstancemachinepool.json")
	nmp["spec"].(map[string]any)["drainTimeout"] = "1s"
	s.put(resNstancePools, pool, nmp)
	s.put(resPools, pool, s.example("machinepool.json"))
	created := time.Now()

	// Two instances, one per shard: agents in tmux windows register, Nodes appear.
	s.eventually("two agent windows", 60*time.Second, func() bool { return len(s.agentWindows()) == 2 })
	s.eventually("first agent registered", 60*time.Second, func() bool {
		return slices.ContainsFunc(s.agentWindows(), s.registered)
	})
	t.Logf("first agent registered %s after the pool files were written", time.Since(created).Round(100*time.Millisecond))
	s.eventually("both agents registered", 60*time.Second, func() bool {
		ids := s.agentWindows()
		return len(ids) == 2 && s.registered(ids[0]) && s.registered(ids[1])
	})
	ids := s.agentWindows()
	s.eventually("two Node files", 30*time.Second, func() bool {
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
		s.eventually("shard group "+pool+"--"+shard, 30*time.Second, func() bool {
			_, ok := s.get(resShardGroups, namespace, pool+"--"+shard)
			return ok
		})
	}
	s.eventually("pool JSON lists both provider IDs and is ready", 60*time.Second, func() bool {
		obj, ok := s.get(resNstancePools, namespace, pool)
		if !ok {
			return false
		}
		got := strs(field(obj, "spec", "providerIDList"))
		slices.Sort(got)
		return slices.Equal(got, providerIDs) && field(obj, "status", "ready") == true
	})

	// Scale to 1 by editing the MachinePool file.
	t.Logf("2 replicas: agents %v registered, Nodes and pool status in place after %s", ids, time.Since(created).Round(100*time.Millisecond))
	scaled := time.Now()
	mp, ok := s.get(resPools, namespace, pool)
	if !ok {
		t.Fatal("MachinePool file vanished")
	}
	mp["spec"].(map[string]any)["replicas"] = 1
	s.put(resPools, pool, mp)
	s.eventually("one agent window left", 90*time.Second, func() bool { return len(s.agentWindows()) == 1 })
	kept := s.agentWindows()[0]
	var gone string
	for _, id := range ids {
		if id != kept {
			gone = id
		}
	}
	s.eventually("removed instance's Node file and state gone", 30*time.Second, func() bool {
		_, node := s.get("nodes", "", gone)
		_, err := os.Stat(filepath.Join(s.dir, "agents", gone))
		return !node && os.IsNotExist(err)
	})
	s.eventually("pool JSON lists one provider ID", 60*time.Second, func() bool {
		obj, ok := s.get(resNstancePools, namespace, pool)
		return ok && len(strs(field(obj, "spec", "providerIDList"))) == 1 && field(obj, "status", "ready") == true
	})

	t.Logf("scaled to 1 (%s removed) in %s", gone, time.Since(scaled).Round(100*time.Millisecond))
	deleted := time.Now()

	// Delete the pool (through the API, as kubectl delete would: finalizers run).
	s.delete(schema.GroupVersionResource{Group: "cluster.x-k8s.io", Version: "v1beta2", Resource: "machinepools"}, pool)
	s.delete(schema.GroupVersionResource{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta1", Resource: "nstancemachinepools"}, pool)
	s.eventually("pool, shard groups, agents and Nodes gone", 90*time.Second, func() bool {
		_, p := s.get(resNstancePools, namespace, pool)
		_, g1 := s.get(resShardGroups, namespace, pool+"--dev-1")
		_, g2 := s.get(resShardGroups, namespace, pool+"--dev-2")
		return !p && !g1 && !g2 && len(s.agentWindows()) == 0 && len(s.nodes()) == 0
	})
	t.Logf("pool deleted and cleaned up in %s", time.Since(deleted).Round(100*time.Millisecond))
}

// delete removes an object through the Kubernetes API of dev-k8s.
func (s *stack) delete(gvr schema.GroupVersionResource, name string) {
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
	if err := dyn.Resource(gvr).Namespace(namespace).Delete(ctx(s.t), name, metav1.DeleteOptions{}); err != nil {
		s.t.Fatalf("deleting %s %s: %v", gvr.Resource, name, err)
	}
}
