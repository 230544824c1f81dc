package hollownode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/nstance-dev/nstance/internal/testing/portpick"
)

// Content types the kubelet can speak to the API server.
const (
	// ContentTypeProtobuf is kubemark's default.
	ContentTypeProtobuf = "application/vnd.kubernetes.protobuf"
	// ContentTypeJSON is for API servers without protobuf (dev-k8s).
	ContentTypeJSON = "application/json"
)

// Options describe one hollow kubelet.
type Options struct {
	// Name is the node name (required). The client certificate must be
	// CN=system:node:<Name>, O=system:nodes for the Node authorizer and
	// NodeRestriction to treat the kubelet as that node.
	Name string
	// Kubeconfig is the path of the kubelet's kubeconfig. When empty, Start
	// writes one from Server, CAFile, CertFile and KeyFile.
	Kubeconfig string
	// Server is the API server's URL (https://127.0.0.1:port).
	Server string
	// CAFile is the PEM file of the CA that signed the API server's serving
	// certificate.
	CAFile string
	// CertFile and KeyFile are the node's client certificate and key (PEM).
	CertFile, KeyFile string
	// ProviderID, when set, is the spec.providerID the Node must carry:
	// WaitReady fails otherwise. Start does not set it (kubemark cannot):
	// create the Node with it, as this node, before Start.
	ProviderID string
	// ContentType is what the kubelet sends the API server: ContentTypeJSON
	// for a JSON-only server; empty means kubemark's default, protobuf.
	ContentType string
	// Labels are extra node labels (--node-labels). NodeRestriction refuses
	// most labels under kubernetes.io and k8s.io that a node sets itself.
	Labels map[string]string
	// Binary is the kubemark to run; empty means Binary().
	Binary string
	// Args are further kubemark flags, appended last. A --vmodule here
	// replaces the one Start passes, and Start then cannot find the runtime
	// socket to remove: add remote_runtime=3 to it.
	Args []string
	// StartTimeout bounds Start's wait for the process to come up (its
	// runtime socket listening); zero means 60 seconds.
	StartTimeout time.Duration
}

// Node is a running hollow kubelet.
type Node struct {
	// Name is the node name.
	Name string
	// Port is the kubelet's port (HTTP, all interfaces; see the package
	// documentation).
	Port int
	// PID is the kubemark process's id.
	PID int
	// Dir is the node's own directory (under t.TempDir()).
	Dir string
	// Kubeconfig is the kubeconfig the kubelet uses.
	Kubeconfig string
	// LogPath holds the process's stdout and stderr.
	LogPath string

	providerID string
	cmd        *exec.Cmd
	done       chan struct{}
	waitErr    error
	// scratch are the paths kubemark created outside Dir (its root
	// directory and runtime socket under /tmp), found while it ran.
	scratch  []string
	stopOnce sync.Once
	stopErr  error
}

// Start runs a hollow kubelet for the test and stops it at cleanup. It fails
// the test when kubemark is missing, when the options are incomplete, or
// when the process does not come up.
func Start(t testing.TB, opts Options) *Node {
	t.Helper()
	n, err := start(t, opts)
	if err != nil {
		t.Fatalf("start hollow kubelet %s: %v", opts.Name, err)
	}
	return n
}

func start(t testing.TB, opts Options) (*Node, error) {
	if opts.Name == "" {
		return nil, errors.New("options: Name is required")
	}
	bin := opts.Binary
	if bin == "" {
		b, err := Binary()
		if err != nil {
			return nil, err
		}
		bin = b
	}
	dir := filepath.Join(t.TempDir(), "hollownode-"+opts.Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create node directory: %w", err)
	}
	kubeconfig := opts.Kubeconfig
	if kubeconfig == "" {
		kubeconfig = filepath.Join(dir, "kubeconfig")
		if err := writeKubeconfig(kubeconfig, opts); err != nil {
			return nil, err
		}
	}
	port := portpick.Port(t)
	args := []string{
		"--morph=kubelet",
		"--name=" + opts.Name,
		"--kubeconfig=" + kubeconfig,
		"--kubelet-port=" + strconv.Itoa(port),
		"--kubelet-read-only-port=0",
		// The fake image service; the host's (containerd) is not there.
		"--use-host-image-service=false",
		// Only used with --bootstrap-kubeconfig, which this helper never
		// passes; pointed here anyway so nothing goes to /etc/srv.
		"--cert-dir=" + filepath.Join(dir, "pki"),
		// Logs the fake runtime's socket path, which is how Stop knows
		// which /tmp/kubelet_remote_*.sock is this process's.
		"--vmodule=remote_runtime=3",
	}
	if opts.ContentType != "" {
		args = append(args, "--kube-api-content-type="+opts.ContentType)
	}
	if len(opts.Labels) > 0 {
		keys := make([]string, 0, len(opts.Labels))
		for k := range opts.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		pairs := make([]string, 0, len(keys))
		for _, k := range keys {
			pairs = append(pairs, k+"="+opts.Labels[k])
		}
		args = append(args, "--node-labels="+strings.Join(pairs, ","))
	}
	args = append(args, opts.Args...)

	logPath := filepath.Join(dir, "kubemark.log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create log file: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("run %s: %w", bin, err)
	}
	n := &Node{
		Name:       opts.Name,
		Port:       port,
		PID:        cmd.Process.Pid,
		Dir:        dir,
		Kubeconfig: kubeconfig,
		LogPath:    logPath,
		providerID: opts.ProviderID,
		cmd:        cmd,
		done:       make(chan struct{}),
	}
	go func() {
		n.waitErr = cmd.Wait()
		_ = f.Close()
		close(n.done)
	}()
	t.Cleanup(func() {
		if err := n.Stop(); err != nil {
			t.Errorf("stop hollow kubelet %s: %v", n.Name, err)
		}
		if t.Failed() {
			t.Logf("hollow kubelet %s (pid %d), last lines of %s:\n%s", n.Name, n.PID, n.LogPath, n.Tail(60))
		}
	})
	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	if err := n.awaitScratch(timeout); err != nil {
		return nil, fmt.Errorf("%w; last lines of %s:\n%s", err, logPath, n.Tail(30))
	}
	return n, nil
}

// writeKubeconfig writes a kubeconfig for the node from file paths.
func writeKubeconfig(path string, opts Options) error {
	var missing []string
	for name, v := range map[string]string{"Server": opts.Server, "CAFile": opts.CAFile, "CertFile": opts.CertFile, "KeyFile": opts.KeyFile} {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("options: without Kubeconfig, %s must be set", strings.Join(missing, ", "))
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["cluster"] = &clientcmdapi.Cluster{Server: opts.Server, CertificateAuthority: opts.CAFile}
	cfg.AuthInfos[opts.Name] = &clientcmdapi.AuthInfo{ClientCertificate: opts.CertFile, ClientKey: opts.KeyFile}
	cfg.Contexts["node"] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: opts.Name}
	cfg.CurrentContext = "node"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

// rootDirLine is kubemark's log line naming the kubelet's root directory.
var rootDirLine = regexp.MustCompile(`Using (/tmp/hollow-kubelet\.[0-9]+) as root dir for hollow-kubelet`)

// runtimeLine is the kubelet's log line (at remote_runtime=3) naming the
// fake runtime's socket. The runtime creates the socket under a temporary
// name and renames it, so the process's own socket table shows the wrong
// name; the log is where the final one appears.
var runtimeLine = regexp.MustCompile(`"Connecting to runtime service" endpoint="unix://(/tmp/kubelet_remote_[0-9]+\.sock)"`)

// awaitScratch waits until the process has logged its root directory and
// its runtime socket exists, and records both for removal.
func (n *Node) awaitScratch(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var root, sock string
	for {
		if b, err := os.ReadFile(n.LogPath); err == nil {
			if m := rootDirLine.FindSubmatch(b); root == "" && m != nil {
				root = string(m[1])
				n.scratch = append(n.scratch, root)
			}
			if m := runtimeLine.FindSubmatch(b); sock == "" && m != nil {
				// Recorded as soon as it is named (the socket appears a
				// moment later); Stop removes it if it is there.
				sock = string(m[1])
				n.scratch = append(n.scratch, sock)
			}
		}
		if root != "" && sock != "" {
			if fi, err := os.Lstat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
				return nil
			}
		}
		select {
		case <-n.done:
			return fmt.Errorf("kubemark exited while starting: %v", n.waitErr)
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubemark did not come up within %s (root directory %q, runtime socket %q)", timeout, root, sock)
		}
	}
}

// ScratchPaths are the paths kubemark created outside Dir (its root
// directory and runtime socket under /tmp); Stop removes them.
func (n *Node) ScratchPaths() []string { return append([]string(nil), n.scratch...) }

// Exited is closed once the process has ended.
func (n *Node) Exited() <-chan struct{} { return n.done }

// stopGrace is how long Stop waits after SIGTERM before SIGKILL.
const stopGrace = 10 * time.Second

// Stop ends the process by its PID (SIGTERM, then SIGKILL after a grace
// period), waits for it and removes the paths it left under /tmp. It is
// safe to call more than once, also concurrently; the test's cleanup calls
// it too.
func (n *Node) Stop() error {
	n.stopOnce.Do(func() { n.stopErr = n.stop() })
	return n.stopErr
}

func (n *Node) stop() error {
	select {
	case <-n.done:
	default:
		if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("signal pid %d: %w", n.PID, err)
		}
		select {
		case <-n.done:
		case <-time.After(stopGrace):
			if err := n.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
				return fmt.Errorf("kill pid %d: %w", n.PID, err)
			}
			<-n.done
		}
	}
	var errs []error
	for _, p := range n.scratch {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// Tail returns the last lines of the process's log.
func (n *Node) Tail(lines int) string {
	b, err := os.ReadFile(n.LogPath)
	if err != nil {
		return fmt.Sprintf("(read %s: %v)", n.LogPath, err)
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// RESTConfig is a client configuration with the node's own identity (from
// its kubeconfig).
func (n *Node) RESTConfig() (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", n.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", n.Kubeconfig, err)
	}
	return cfg, nil
}

// WaitReady waits, with the node's own identity, until its Node has the
// condition Ready=True, and returns that Node. With Options.ProviderID set
// it fails when the Node's spec.providerID differs. It also fails when the
// process exits first or ctx ends.
func (n *Node) WaitReady(ctx context.Context) (*corev1.Node, error) {
	cfg, err := n.RESTConfig()
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for node %s: %w", n.Name, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-n.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	sel := fields.OneTermEqualSelector("metadata.name", n.Name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (k8sruntime.Object, error) {
			o.FieldSelector = sel
			return cs.CoreV1().Nodes().List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return cs.CoreV1().Nodes().Watch(ctx, o)
		},
	}
	var last *corev1.Node
	ev, err := watchtools.UntilWithSync(ctx, lw, &corev1.Node{}, nil, func(e watch.Event) (bool, error) {
		node, ok := e.Object.(*corev1.Node)
		if !ok || e.Type == watch.Deleted {
			return false, nil
		}
		last = node
		return nodeReady(node), nil
	})
	if err != nil {
		select {
		case <-n.done:
			return nil, fmt.Errorf("node %s: kubemark exited (%v) before the Node was Ready; last lines of %s:\n%s", n.Name, n.waitErr, n.LogPath, n.Tail(30))
		default:
		}
		state := "no Node yet"
		if last != nil {
			state = fmt.Sprintf("conditions %s", conditions(last))
		}
		return nil, fmt.Errorf("wait for Node %s to be Ready (%s): %w", n.Name, state, err)
	}
	node := ev.Object.(*corev1.Node)
	if n.providerID != "" && node.Spec.ProviderID != n.providerID {
		return node, fmt.Errorf("node %s is Ready with spec.providerID %q, want %q (create the Node with it before starting the kubelet)", n.Name, node.Spec.ProviderID, n.providerID)
	}
	return node, nil
}

func nodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func conditions(node *corev1.Node) string {
	var parts []string
	for _, c := range node.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s", c.Type, c.Status))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// Binary finds kubemark among the envtest binaries: in KUBEBUILDER_ASSETS
// when set, else in the cache directory of scripts/envtest-assets.sh.
func Binary() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		root, err := repoRoot()
		if err != nil {
			return "", err
		}
		out, err := exec.Command(filepath.Join(root, "scripts", "envtest-assets.sh"), "--dir").Output()
		if err != nil {
			return "", fmt.Errorf("locate envtest cache with scripts/envtest-assets.sh --dir: %w", err)
		}
		dir = strings.TrimSpace(string(out))
	}
	bin := filepath.Join(dir, "kubemark")
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("kubemark (the hollow kubelet) is not in %s: build it with `scripts/envtest-assets.sh` (or `make envtest-assets`; needs a C compiler for cgo; a cache that has the other envtest binaries gets only kubemark built): %w", dir, err)
	}
	return bin, nil
}

// repoRoot is the directory holding the main go.mod, found from this file.
func repoRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("locate repository root: no caller information")
	}
	// internal/testing/hollownode/hollownode.go -> repository root.
	root := filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return "", fmt.Errorf("locate repository root from %s: %w", file, err)
	}
	return root, nil
}
