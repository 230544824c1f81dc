package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

const machineYAML = `apiVersion: infrastructure.cluster.x-k8s.io/v1beta1
kind: NstanceMachine
metadata: {name: m1, namespace: default}
spec: {group: workers, shard: %s}
`

// TestKubectlCustomResourceErrors runs the same kubectl commands against
// dev-k8s and a real kube-apiserver (envtest) with the project's CRDs:
// applying an invalid custom resource and an immutable-field change fail
// with the same text on both, and the object keeps its valid state. (One
// schema error per object: kube-apiserver lists several in map order.)
func TestKubectlCustomResourceErrors(t *testing.T) {
	root, err := kubetest.RepoRoot()
	require.NoError(t, err)
	env := kubetest.Start(t)
	d := startDev(t, true, filepath.Join(root, "config", "crd", "bases"))
	tmp := t.TempDir()
	valid := writeFile(t, tmp, "machine.yaml", sprintf(machineYAML, "dev-1"))
	moved := writeFile(t, tmp, "machine-moved.yaml", sprintf(machineYAML, "dev-2"))
	invalid := writeFile(t, tmp, "machine-invalid.yaml", `apiVersion: infrastructure.cluster.x-k8s.io/v1beta1
kind: NstanceMachine
metadata: {name: m2, namespace: default}
spec: {group: Bad_Group, shard: dev-1}
`)
	run := func(kubectl func(args ...string) (string, error)) []string {
		var out []string
		for _, args := range [][]string{
			{"apply", "-f", valid},
			{"apply", "-f", invalid},
			{"apply", "-f", moved},
			{"get", "nstancemachine", "m1", "-o", "jsonpath={.spec.shard}"},
			{"get", "nstancemachine", "m2"},
		} {
			text, err := kubectl(args...)
			out = append(out, sprintf("%s -> err=%v\n%s", args[0], err != nil, text))
		}
		return out
	}
	real := run(func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		out, err := env.Kubectl(ctx, args...).CombinedOutput()
		return string(out), err
	})
	dev := run(func(args ...string) (string, error) { return d.kubectl(t, args...) })
	require.Equal(t, real, dev, "kube-apiserver (expected) and dev-k8s (actual) answer kubectl differently")
	require.Contains(t, dev[1], `The NstanceMachine "m2" is invalid`)
	require.Contains(t, dev[1], `spec.group: Invalid value: "Bad_Group"`)
	require.Contains(t, dev[2], "shard is immutable once set")
	require.Contains(t, dev[3], "dev-1")
	require.Contains(t, dev[4], "NotFound")

	// A hand edit of the stored file to an invalid value is not served:
	// kubectl shows the last valid object and an Event naming file and field.
	path := filepath.Join(d.dir, "nstancemachines", "default", "m1.json")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, bytes.Replace(data, []byte(`"shard": "dev-1"`), []byte(`"shard": "Not A Shard"`), 1), 0o644))
	var events string
	require.Eventually(t, func() bool {
		events, _ = d.kubectl(t, "get", "events", "--field-selector", "reason=InvalidFile")
		return strings.Contains(events, "InvalidFile")
	}, 10*time.Second, 100*time.Millisecond, events)
	require.Regexp(t, `Warning\s+InvalidFile\s+nstancemachine/m1\s+hand-edited file `+regexp.QuoteMeta(path), events)
	require.Contains(t, events, "spec.shard")
	require.Equal(t, "dev-1", d.mustKubectl(t, "get", "nstancemachine", "m1", "-o", "jsonpath={.spec.shard}"))
}

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }
