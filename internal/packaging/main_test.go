package packaging_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apiyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/nstance-dev/nstance/internal/testing/hosttools"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

const (
	helmVersion = "v3.22.0"
	chartRel    = "deploy/helm/nstance-operator"
	sampleRel   = "deploy/helm/nstance-operator/ci/sample-values.yaml"
	minimalRel  = "deploy/helm/nstance-operator/ci/minimal-values.yaml"
)

var (
	root string

	envOnce sync.Once
	env     *kubetest.Env
	envErr  error
	envStop func() error
)

func TestMain(m *testing.M) {
	r, err := kubetest.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "packaging tests:", err)
		os.Exit(1)
	}
	root = r
	code := m.Run()
	if envStop != nil {
		if err := envStop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop envtest:", err)
		}
	}
	os.Exit(code)
}

// apiServer starts one kube-apiserver for the whole package on first use.
func apiServer(t *testing.T) *kubetest.Env {
	t.Helper()
	envOnce.Do(func() { env, envStop, envErr = kubetest.StartEnv() })
	require.NoError(t, envErr, "start envtest")
	return env
}

var helmOnce sync.Once

// helm returns the pinned helm binary in ./bin, installing it on first use
// (as `make bin/helm` would).
func helm(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(root, "bin", "helm")
	helmOnce.Do(func() {
		if _, err := os.Stat(bin); err == nil {
			return
		}
		cmd := exec.Command("go", "install", "helm.sh/helm/v3/cmd/helm@"+helmVersion)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOBIN="+filepath.Join(root, "bin"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Logf("install helm: %v\n%s", err, out)
		}
	})
	_, err := os.Stat(bin)
	require.NoError(t, err, "helm %s is needed in ./bin (make bin/helm)", helmVersion)
	return bin
}

// run executes a command and returns stdout, failing the test with stderr.
func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	if !filepath.IsAbs(name) {
		hosttools.Require(t, name)
	}
	// Builds on a cold cache and a loaded machine take as long as they take:
	// the only bound is the test binary's own deadline (go test -timeout),
	// kept a little earlier so the failure names the command.
	ctx, cancel := context.WithCancel(context.Background())
	if dl, ok := t.Deadline(); ok {
		ctx, cancel = context.WithDeadline(context.Background(), dl.Add(-time.Minute))
	}
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NoError(t, err, "%s %s\nstderr:\n%s", name, strings.Join(args, " "), stderr.String())
	return stdout.String()
}

// object is one rendered manifest.
type object struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	raw []byte
}

func (o object) String() string { return o.Kind + "/" + o.Metadata.Name }

// decode splits a multi-document YAML stream.
func decode(t *testing.T, manifest string) []object {
	t.Helper()
	dec := apiyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	var objs []object
	for {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "decode manifest")
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		var o object
		require.NoError(t, json.Unmarshal(raw, &o))
		require.NotEmpty(t, o.Kind, "document without kind: %s", raw)
		o.raw = raw
		objs = append(objs, o)
	}
	return objs
}

// into decodes an object into a typed value, rejecting unknown fields.
func into(t *testing.T, o object, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(o.raw))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(v), "decode %s", o)
}

func find(objs []object, kind, name string) (object, bool) {
	for _, o := range objs {
		if o.Kind == kind && (name == "" || o.Metadata.Name == name) {
			return o, true
		}
	}
	return object{}, false
}

func ofKind(objs []object, kind string) []object {
	var out []object
	for _, o := range objs {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

func encode(t *testing.T, objs []object) string {
	t.Helper()
	var b strings.Builder
	for _, o := range objs {
		y, err := yaml.JSONToYAML(o.raw)
		require.NoError(t, err)
		b.WriteString("---\n")
		b.Write(y)
	}
	return b.String()
}

// operatorExists reports whether cmd/nstance-operator has a main package yet.
func operatorExists() bool {
	files, _ := filepath.Glob(filepath.Join(root, "cmd", "nstance-operator", "*.go"))
	return len(files) > 0
}

// execOut runs a command and returns its combined output and error.
func execOut(dir, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// fmtSscanf parses "major.minor.patch".
func fmtSscanf(version string, major, minor *int) (int, error) {
	var patch string
	return fmt.Sscanf(version, "%d.%d.%s", major, minor, &patch)
}
