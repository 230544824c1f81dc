package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/testing/kubetest"
	"github.com/nstance-dev/nstance/internal/testing/syncbuf"
)

const widgetCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.demo.nstance.dev
spec:
  group: demo.nstance.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Color, type: string, jsonPath: .spec.color}
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
`

const widgets = `apiVersion: demo.nstance.dev/v1
kind: Widget
metadata: {name: w1, namespace: default, labels: {tier: front}}
spec: {color: red}
---
apiVersion: demo.nstance.dev/v1
kind: Widget
metadata: {name: w2, namespace: default, labels: {tier: back}}
spec: {color: blue}
`

func TestKubectl(t *testing.T) {
	root, err := kubetest.RepoRoot()
	require.NoError(t, err)
	capi, err := kubetest.CAPICRDDir(root)
	require.NoError(t, err)
	d := startDev(t, true, capi)
	tmp := t.TempDir()

	require.Contains(t, d.mustKubectl(t, "version"), "Server Version: v1.36")

	// CRDs, then custom objects, through kubectl apply.
	d.mustKubectl(t, "apply", "-f", writeFile(t, tmp, "crd.yaml", widgetCRD))
	require.Contains(t, d.mustKubectl(t, "api-resources"), "widgets")
	d.mustKubectl(t, "apply", "-f", writeFile(t, tmp, "widgets.yaml", widgets))
	out := d.mustKubectl(t, "get", "widgets")
	require.Contains(t, out, "COLOR")
	require.Regexp(t, `w1\s+red`, out)
	out = d.mustKubectl(t, "get", "wd", "-l", "tier=back", "-o", "name")
	require.Equal(t, "widget.demo.nstance.dev/w2\n", out)
	out = d.mustKubectl(t, "get", "widgets", "--field-selector", "metadata.name=w1", "-o", "name")
	require.Equal(t, "widget.demo.nstance.dev/w1\n", out)
	// Re-applying a changed manifest patches it.
	d.mustKubectl(t, "apply", "-f", writeFile(t, tmp, "widgets2.yaml", strings.Replace(widgets, "color: red", "color: green", 1)))
	require.Equal(t, "green", d.mustKubectl(t, "get", "widget", "w1", "-o", "jsonpath={.spec.color}"))

	// Built-in objects: create, label, annotate, patch three ways.
	d.mustKubectl(t, "create", "configmap", "cfg", "--from-literal=a=1")
	d.mustKubectl(t, "label", "configmap", "cfg", "team=dev")
	d.mustKubectl(t, "annotate", "configmap", "cfg", "note=hello")
	d.mustKubectl(t, "patch", "configmap", "cfg", "--type", "merge", "-p", `{"data":{"m":"2"}}`)
	d.mustKubectl(t, "patch", "configmap", "cfg", "--type", "json", "-p", `[{"op":"add","path":"/data/j","value":"3"}]`)
	d.mustKubectl(t, "patch", "configmap", "cfg", "--type", "strategic", "-p", `{"data":{"s":"4"}}`)
	out = d.mustKubectl(t, "get", "configmap", "cfg", "-o", "json")
	var cm map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &cm))
	require.Equal(t, map[string]any{"a": "1", "m": "2", "j": "3", "s": "4"}, cm["data"])
	md := cm["metadata"].(map[string]any)
	require.Equal(t, "dev", md["labels"].(map[string]any)["team"])
	require.Equal(t, "hello", md["annotations"].(map[string]any)["note"])
	require.Contains(t, d.mustKubectl(t, "get", "configmaps", "-l", "team=dev"), "cfg")

	// get -w shows a hand edit of the JSON file.
	assets, err := kubetest.AssetsDir()
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watchOut := &syncbuf.Buffer{}
	w := exec.CommandContext(ctx, filepath.Join(assets, "kubectl"), "get", "configmaps", "-w", "--output-watch-events")
	w.Env = append(os.Environ(), "KUBECONFIG="+d.kubeconfig)
	w.Stdout, w.Stderr = watchOut, watchOut
	require.NoError(t, w.Start())
	t.Cleanup(func() { cancel(); _ = w.Wait() })
	require.Eventually(t, func() bool { return strings.Contains(watchOut.String(), "cfg") }, 10*time.Second, 50*time.Millisecond)
	path := filepath.Join(d.dir, "configmaps", "default", "handmade.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"data":{"x":"1"}}`), 0o644))
	require.Eventually(t, func() bool { return strings.Contains(watchOut.String(), "handmade") }, 10*time.Second, 50*time.Millisecond, watchOut.String())
	require.Regexp(t, `ADDED\s+handmade`, watchOut.String())
	require.Eventually(t, func() bool {
		data, err := os.ReadFile(path)
		return err == nil && strings.Contains(string(data), "resourceVersion")
	}, 5*time.Second, 20*time.Millisecond)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, bytes.Replace(data, []byte(`"x": "1"`), []byte(`"x": "1", "y": "2"`), 1), 0o644))
	require.Eventually(t, func() bool { return strings.Contains(watchOut.String(), "MODIFIED") }, 10*time.Second, 50*time.Millisecond, watchOut.String())
	require.Equal(t, "2", d.mustKubectl(t, "get", "configmap", "handmade", "-o", "jsonpath={.data.y}"))

	// Delete of an object with a finalizer waits for the finalizer.
	d.mustKubectl(t, "apply", "-f", writeFile(t, tmp, "fin.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: held\n  finalizers: [demo/hold]\n"))
	d.mustKubectl(t, "delete", "configmap", "held", "--wait=false")
	require.NotEmpty(t, d.mustKubectl(t, "get", "configmap", "held", "-o", "jsonpath={.metadata.deletionTimestamp}"))
	d.mustKubectl(t, "patch", "configmap", "held", "--type", "json", "-p", `[{"op":"remove","path":"/metadata/finalizers"}]`)
	out, err = d.kubectl(t, "get", "configmap", "held")
	require.Error(t, err)
	require.Contains(t, out, "NotFound")

	// cordon and drain a node whose pods include one guarded by a PDB.
	d.mustKubectl(t, "apply", "-f", writeFile(t, tmp, "node.yaml", `apiVersion: v1
kind: Node
metadata: {name: worker-1}
---
apiVersion: v1
kind: Pod
metadata: {name: free, namespace: default, labels: {app: free}}
spec: {nodeName: worker-1, terminationGracePeriodSeconds: 1, containers: [{name: c, image: busybox:1.36}]}
---
apiVersion: v1
kind: Pod
metadata: {name: guarded, namespace: default, labels: {app: guarded}}
spec: {nodeName: worker-1, terminationGracePeriodSeconds: 1, containers: [{name: c, image: busybox:1.36}]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: guarded, namespace: default}
spec: {minAvailable: 1, selector: {matchLabels: {app: guarded}}}
`))
	for _, p := range []string{"free", "guarded"} {
		d.mustKubectl(t, "patch", "pod", p, "--subresource=status", "--type", "merge", "-p",
			`{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}`)
	}
	require.Eventually(t, func() bool {
		out, _ := d.kubectl(t, "get", "pdb", "guarded", "-o", "jsonpath={.status.currentHealthy}/{.status.disruptionsAllowed}")
		return out == "1/0"
	}, 10*time.Second, 100*time.Millisecond)
	d.mustKubectl(t, "cordon", "worker-1")
	require.Equal(t, "true", d.mustKubectl(t, "get", "node", "worker-1", "-o", "jsonpath={.spec.unschedulable}"))
	out, err = d.kubectl(t, "drain", "worker-1", "--force", "--ignore-daemonsets", "--timeout=6s")
	require.Error(t, err, out)
	require.Contains(t, out, "Cannot evict pod as it would violate the pod's disruption budget")
	require.Contains(t, out, "evicting pod default/free")
	out, err = d.kubectl(t, "get", "pod", "free")
	require.Error(t, err, "the evicted pod is gone once its grace period ends: %s", out)
	require.Contains(t, d.mustKubectl(t, "get", "pod", "guarded"), "guarded")

	out = d.mustKubectl(t, "api-resources")
	for _, r := range []string{"pods", "nodes", "leases", "poddisruptionbudgets", "customresourcedefinitions", "machines"} {
		require.Contains(t, out, r)
	}
}
