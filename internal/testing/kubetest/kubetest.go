package kubetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	cpv1 "github.com/nstance-dev/nstance/api/controlplane/v1beta1"
	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

// Env is a running API server with the CRDs installed.
type Env struct {
	// Config reaches the API server as a cluster administrator.
	Config *rest.Config
	// Client is an uncached client using Scheme.
	Client client.Client
	// Scheme knows the built-in, apiextensions, Nstance and CAPI kinds.
	Scheme *k8sruntime.Scheme
	// Kubeconfig is the path of a kubeconfig file for kubectl.
	Kubeconfig string
	// AssetsDir holds the kube-apiserver, etcd and kubectl binaries.
	AssetsDir string
	// ClientCAFile is the CA bundle (kube-apiserver's --client-ca-file)
	// that signs the certificates of users made by AddUser.
	ClientCAFile string
	te           *envtest.Environment
}

// AddUser returns a configuration that authenticates with a client
// certificate for name and groups (CN and O), signed by ClientCAFile.
func (e *Env) AddUser(name string, groups ...string) (*rest.Config, error) {
	u, err := e.te.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return nil, fmt.Errorf("add user %s: %w", name, err)
	}
	return u.Config(), nil
}

// Kubectl returns a command running the envtest-built kubectl against this
// API server.
func (e *Env) Kubectl(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(e.AssetsDir, "kubectl"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.Kubeconfig)
	return cmd
}

// NewScheme returns a scheme with every kind the project's tests use.
func NewScheme() (*k8sruntime.Scheme, error) {
	s := k8sruntime.NewScheme()
	for _, add := range []func(*k8sruntime.Scheme) error{
		clientgoscheme.AddToScheme,
		apiextensionsv1.AddToScheme,
		clusterv1.AddToScheme,
		infrav1.AddToScheme,
		cpv1.AddToScheme,
	} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("build scheme: %w", err)
		}
	}
	return s, nil
}

// Start launches kube-apiserver and etcd with the Nstance and CAPI CRDs and
// stops them when the test ends.
func Start(t testing.TB) *Env {
	t.Helper()
	env, stop, err := StartEnv()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	return env
}

// StartEnv is Start for callers without a testing.TB (TestMain, benchmarks
// programs). The returned function stops the control plane.
func StartEnv() (*Env, func() error, error) { return StartEnvWith(Options{}) }

// Options adjust the control plane that StartEnvWith starts.
type Options struct {
	// APIServerArgs are extra kube-apiserver flags, by name without dashes
	// (e.g. "token-auth-file"). envtest sets client-ca-file itself, after
	// these: use ClientCAs to trust further client CAs.
	APIServerArgs map[string]string
	// ClientCAs are PEM certificates kube-apiserver trusts for client
	// certificates besides the CA of envtest's own users (the admin of
	// Config and Kubeconfig): --client-ca-file becomes a bundle of both.
	// Empty keeps envtest's default authenticator.
	ClientCAs []byte
	// NoCRDs starts the API server bare, as a new management cluster is
	// before `clusterctl init`: neither the Nstance nor the CAPI CRDs.
	NoCRDs bool
}

// StartEnvWith is StartEnv with extra kube-apiserver flags.
func StartEnvWith(opts Options) (*Env, func() error, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, nil, err
	}
	var crdDirs []string
	if !opts.NoCRDs {
		if crdDirs, err = CRDDirs(); err != nil {
			return nil, nil, err
		}
	}
	scheme, err := NewScheme()
	if err != nil {
		return nil, nil, err
	}
	te := &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		CRDDirectoryPaths:        crdDirs,
		ErrorIfCRDPathMissing:    !opts.NoCRDs,
		Scheme:                   scheme,
		ControlPlaneStartTimeout: 60 * time.Second,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	for k, v := range opts.APIServerArgs {
		te.ControlPlane.GetAPIServer().Configure().Set(k, v)
	}
	if len(opts.ClientCAs) > 0 {
		authn, err := newBundleAuthn(opts.ClientCAs)
		if err != nil {
			return nil, nil, err
		}
		te.ControlPlane.GetAPIServer().SecureServing.Authn = authn
	}
	cfg, err := te.Start()
	if err != nil {
		return nil, nil, fmt.Errorf("start kube-apiserver and etcd from %s: %w", assets, err)
	}
	stop := func() error { return te.Stop() }
	fail := func(err error) (*Env, func() error, error) {
		_ = stop()
		return nil, nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fail(fmt.Errorf("create client: %w", err))
	}
	user, err := te.AddUser(envtest.User{Name: "envtest-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fail(fmt.Errorf("add kubeconfig user: %w", err))
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return fail(fmt.Errorf("render kubeconfig: %w", err))
	}
	dir, err := os.MkdirTemp("", "kubetest-")
	if err != nil {
		return fail(fmt.Errorf("create kubeconfig dir: %w", err))
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		return fail(fmt.Errorf("write kubeconfig: %w", err))
	}
	stopAll := func() error {
		defer os.RemoveAll(dir)
		return stop()
	}
	// envtest's certificate authenticator keeps its CA here (the file
	// behind the --client-ca-file it sets).
	caFile := filepath.Join(te.ControlPlane.GetAPIServer().CertDir, "client-cert-auth-ca.crt")
	if _, err := os.Stat(caFile); err != nil {
		caFile = ""
	}
	return &Env{Config: cfg, Client: c, Scheme: scheme, Kubeconfig: path, AssetsDir: assets, ClientCAFile: caFile, te: te}, stopAll, nil
}

// AssetsDir finds the envtest binaries: KUBEBUILDER_ASSETS, else the cache
// directory that scripts/envtest-assets.sh fills.
func AssetsDir() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, requireAssets(dir)
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	out, err := exec.Command(filepath.Join(root, "scripts", "envtest-assets.sh"), "--dir").Output()
	if err != nil {
		return "", fmt.Errorf("locate envtest cache: %w", err)
	}
	dir := strings.TrimSpace(string(out))
	return dir, requireAssets(dir)
}

func requireAssets(dir string) error {
	for _, bin := range []string{"kube-apiserver", "etcd", "kubectl"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return fmt.Errorf("envtest binary %s missing in %s (run `make envtest-assets`): %w", bin, dir, err)
		}
	}
	return nil
}

// CRDDirs returns the Nstance CRD directory and the cluster-api core CRD
// directory from the module cache.
func CRDDirs() ([]string, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	capi, err := CAPICRDDir(root)
	if err != nil {
		return nil, err
	}
	return []string{filepath.Join(root, "config", "crd", "bases"), capi}, nil
}

// CAPICRDDir is the directory of cluster-api's own CRDs, shipped in the
// sigs.k8s.io/cluster-api module.
func CAPICRDDir(root string) (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/cluster-api")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("locate sigs.k8s.io/cluster-api module: %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "core", "config", "crd", "bases")
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("cluster-api CRDs: %w", err)
	}
	return dir, nil
}

// RepoRoot is the directory holding the main go.mod.
func RepoRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("locate repository root: no caller information")
	}
	// internal/testing/kubetest/kubetest.go -> repository root.
	root := filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return "", fmt.Errorf("locate repository root from %s: %w", file, err)
	}
	return root, nil
}

// RunMain is the body of a package's TestMain: it starts one control plane
// for every test of the package, stores it in *env, runs the tests and stops
// it. It returns the exit code for os.Exit.
func RunMain(m *testing.M, env **Env) int { return RunMainWith(m, env, Options{}) }

// RunMainWith is RunMain with a control plane started with opts.
func RunMainWith(m *testing.M, env **Env, opts Options) int {
	e, stop, err := StartEnvWith(opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "start envtest: %v\n", err)
		return 1
	}
	*env = e
	code := m.Run()
	if err := stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stop envtest: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Lazy is a further control plane that a package's tests start only when
// one of them needs it (a second cluster); TestMain stops it after the
// tests with Stop.
type Lazy struct {
	mu   sync.Mutex
	env  *Env
	stop func() error
	err  error
}

// Get starts the control plane on the first call and returns it; a start
// that failed fails every caller.
func (l *Lazy) Get(t testing.TB) *Env {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.env == nil && l.err == nil {
		l.env, l.stop, l.err = StartEnv()
	}
	if l.err != nil {
		t.Fatalf("start second envtest control plane: %v", l.err)
	}
	return l.env
}

// Stop stops the control plane if it was started.
func (l *Lazy) Stop() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stop == nil {
		return nil
	}
	err := l.stop()
	l.env, l.stop = nil, nil
	return err
}
