package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nstance-dev/nstance/internal/server/provider/tmux"
	"github.com/nstance-dev/nstance/internal/testing/hosttools"
	"github.com/nstance-dev/nstance/internal/testing/portpick"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
)

// Binaries the stack is built from, once per test run.
var binaries = []string{"dev-s3", "dev-k8s", "nstance-server", "nstance-agent", "nstance-operator", "nstance-admin"}

const (
	clusterID     = "example-cluster"
	namespace     = "default"
	bucket        = "dev"
	encryptionKey = "thisisatest32bytekey123456789012"
)

// stack is dev-s3, two nstance-servers (tmux provider on a private tmux
// socket), dev-k8s and nstance-operator, each a child process of the test
// with its own process group, every port picked free on 127.0.0.1.
type stack struct {
	t       *testing.T
	root    string // repository root
	dir     string // runtime state (the test's temp/)
	bin     string
	k8sDir  string
	socket  string // private tmux server (-L)
	session string

	s3Addr, k8sAddr, probeAddr string
	servers                    []serverPorts

	// lbSocket and lbAddr are the dev HAProxy's runtime API socket and
	// frontend (withLB); empty: the stack runs without a load balancer and
	// the configs' "// dev-lb" lines are dropped, as the dev scripts do
	// without haproxy.
	lbSocket, lbAddr string

	// procs are the stack's processes, logs in dir/logs/{name}.log.
	procs *proctest.Group
}

type serverPorts struct {
	shard                                           string
	health, election, registration, operator, agent string
}

// bins holds the binaries of the suite, built once per test binary.
var bins proctest.Binaries

func TestMain(m *testing.M) { os.Exit(bins.Main(m)) }

func newStack(t *testing.T) *stack {
	t.Helper()
	hosttools.Require(t, "tmux")
	dir := t.TempDir()
	s := &stack{
		t: t, root: proctest.Root(t), dir: dir, bin: bins.Dir(t, binaries...),
		k8sDir:  filepath.Join(dir, "dev-k8s"),
		socket:  fmt.Sprintf("nstance-e2e-%d-%d", os.Getpid(), time.Now().UnixNano()%100000),
		session: "nstance-e2e-agents",
		s3Addr:  portpick.Addr(t), k8sAddr: portpick.Addr(t), probeAddr: portpick.Addr(t),
	}
	for n := 1; n <= 2; n++ {
		s.servers = append(s.servers, serverPorts{
			shard: fmt.Sprintf("dev-%d", n), health: portpick.Addr(t), election: portpick.Addr(t),
			registration: portpick.Addr(t), operator: portpick.Addr(t), agent: portpick.Addr(t),
		})
	}
	s.procs = proctest.NewGroup(t, proctest.Options{Bin: s.bin, Dir: s.root, LogDir: filepath.Join(dir, "logs"), Env: s.env(),
		Grace: 10 * time.Second, TailLines: 30})
	t.Cleanup(s.stop) // before the group's own cleanup (last-in first-out)
	return s
}

func (s *stack) env() []string {
	return append(append(os.Environ(), proctest.S3Env("http://"+s.s3Addr)...),
		"NSTANCE_ENCRYPTION_KEY="+encryptionKey, "TMUX=")
}

// stop tears everything down in reverse start order (printing the tail of
// every log on failure), then the private tmux server.
func (s *stack) stop() {
	agentPIDs := s.panePIDs()
	s.procs.Close()
	_, _ = s.tmux("kill-server")
	// tmux leaves the socket file of a server that exited behind.
	_ = os.Remove(tmux.SocketPath(s.socket))
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range agentPIDs {
		for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if syscall.Kill(pid, 0) == nil {
			s.t.Errorf("agent pane process %d still running after teardown", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// tmux runs a command against the stack's private tmux server.
func (s *stack) tmux(args ...string) (string, error) {
	cmd := exec.Command("tmux", append([]string{"-L", s.socket}, args...)...)
	cmd.Env = append(os.Environ(), "TMUX=")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// agentWindows lists the instance ids with a window in the agents session.
func (s *stack) agentWindows() []string {
	out, err := s.tmux("list-windows", "-t", "="+s.session, "-F", "#{window_name}")
	if err != nil {
		return nil
	}
	var ids []string
	for _, w := range strings.Fields(out) {
		if id, ok := strings.CutPrefix(w, "nstance-agent-"); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

func (s *stack) panePIDs() []int {
	out, err := s.tmux("list-panes", "-a", "-F", "#{pane_pid}")
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(out) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids
}

// shardConfig derives server N's config from examples/config-tmux.jsonc:
// shard id, loopback binds on the picked ports, advertised addresses, the
// tmux provider on the private socket running the built agent directly, and
// no static groups (the operator creates them).
func (s *stack) shardConfig(n int) []byte {
	s.t.Helper()
	b, err := os.ReadFile(filepath.Join(s.root, "examples", "config-tmux.jsonc"))
	if err != nil {
		s.t.Fatal(err)
	}
	sp := s.servers[n-1]
	options, _ := json.Marshal(map[string]any{
		"health_port": devAgentHealthPort, "session": s.session, "socket": s.socket, "command": filepath.Join(s.bin, "nstance-agent"),
		"state_dir": filepath.Join(s.dir, "agents"), "node_dir": filepath.Join(s.k8sDir, "nodes"), "work_dir": s.dir,
	})
	host := func(a string) string { h, p, _ := net.SplitHostPort(a); return h + ":" + p }
	repl := []struct{ old, new string }{
		{`"id": "dev-1"`, `"id": "` + sp.shard + `"`},
		{`"options": { "session": "nstance-dev-agents", "health_port": 8987 }`, `"options": ` + string(options)},
		{`"0.0.0.0:8990"`, `"` + host(sp.health) + `"`},
		{`"0.0.0.0:8991"`, `"` + sp.election + `"`},
		{`"0.0.0.0:8992"`, `"` + sp.registration + `"`},
		{`"0.0.0.0:8993"`, `"` + sp.operator + `"`},
		{`"0.0.0.0:8994"`, `"` + sp.agent + `"`},
		{`"advertise": { "hosts": ["127.0.0.1"] }`, `"advertise": { "hosts": ["127.0.0.1"], "registration_addr": "` + sp.registration +
			`", "operator_addr": "` + sp.operator + `", "agent_addr": "` + sp.agent + `" }`},
		{`"workers": { "template": "worker", "size": 1, "drain_timeout": "2m" },`, ``},
	}
	if s.lbSocket != "" {
		repl = append(repl, struct{ old, new string }{`"socket": "/path/to/temp/haproxy/admin.sock"`, `"socket": "` + s.lbSocket + `"`})
	}
	out := string(b)
	if s.lbSocket == "" {
		var keep []string
		for _, line := range strings.Split(out, "\n") {
			if !strings.Contains(line, "// dev-lb") {
				keep = append(keep, line)
			}
		}
		out = strings.Join(keep, "\n")
	}
	for _, r := range repl {
		if !strings.Contains(out, r.old) {
			s.t.Fatalf("examples/config-tmux.jsonc no longer contains %s; update shardConfig", r.old)
		}
		out = strings.Replace(out, r.old, r.new, 1)
	}
	return []byte(out)
}

// devAgentHealthPort is the agents' health port of examples/config-tmux.jsonc
// (each agent on a loopback address of its own), the dev HAProxy's backend port.
const devAgentHealthPort = 8987

// withLB runs the dev load balancer as scripts/dev-lb.sh does: a real
// HAProxy from examples/dev/haproxy.cfg with its socket in a short temporary
// directory (a Unix socket path has at most 108 bytes) and its frontend on a
// picked port. Call it before up: the shard configs then keep the worker
// template's load balancer.
func (s *stack) withLB() {
	t := s.t
	t.Helper()
	bin := hosttools.Require(t, "haproxy")
	dir, err := os.MkdirTemp("", "nstance-e2e-lb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	tmpl, err := os.ReadFile(filepath.Join(s.root, "examples", "dev", "haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	s.lbSocket, s.lbAddr = filepath.Join(dir, "admin.sock"), portpick.Addr(t)
	cfg := strings.NewReplacer("@SOCKET@", s.lbSocket, "@FRONTEND@", s.lbAddr).Replace(string(tmpl))
	cfgPath := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s.procs.MustStart("haproxy", bin, nil, "-f", cfgPath, "-db")
	proctest.Eventually(t, "haproxy's runtime API socket and frontend", 20*time.Second, func() bool {
		c, err := net.DialTimeout("unix", s.lbSocket, time.Second)
		if err != nil {
			return false
		}
		_ = c.Close()
		return proctest.Dialable(s.lbAddr)
	})
}

// putObject writes an object into the stack's bucket through dev-s3.
func (s *stack) putObject(key string, body []byte) {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodPut, "http://"+s.s3Addr+"/"+bucket+"/"+key, bytes.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("uploading %s: %v", key, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("uploading %s: %s", key, resp.Status)
	}
}

// up starts the whole stack and waits until the operator is registered.
func (s *stack) up() {
	t := s.t
	t.Helper()
	s.procs.MustStart("dev-s3", "dev-s3", nil, "--addr", s.s3Addr, "--bucket", bucket, "--dir", filepath.Join(s.dir, "dev-s3"))
	proctest.Eventually(s.t, "dev-s3 /healthz", 20*time.Second, func() bool { return proctest.HTTPOK("http://" + s.s3Addr + "/healthz") })
	// The worker template's user data (examples/dev/node-userdata.sh), as
	// the dev stack uploads it.
	userdata, err := os.ReadFile(filepath.Join(s.root, "examples", "dev", "node-userdata.sh"))
	if err != nil {
		t.Fatal(err)
	}
	s.putObject("dev/node-userdata.sh", userdata)
	for n := 1; n <= 2; n++ {
		sp := s.servers[n-1]
		s.putObject("config/"+sp.shard+".jsonc", s.shardConfig(n))
		s.procs.MustStart("server-"+sp.shard, "nstance-server", nil, "--shard", sp.shard, "--id", sp.shard+"-e2e",
			"--bucket", bucket, "--cache-dir", filepath.Join(s.dir, "cache"), "--bind-health", sp.health)
	}

	if err := proctest.WriteJSON(s.path("namespaces", "", namespace), map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": namespace}}); err != nil {
		t.Fatal(err)
	}
	crds, err := proctest.CRDDirs(context.Background(), s.root)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(s.dir, "operator", "kubeconfig")
	k8sArgs := []string{"--addr", s.k8sAddr, "--dir", s.k8sDir, "--kubeconfig-out", kubeconfig}
	for _, d := range crds {
		k8sArgs = append(k8sArgs, "--crd-dir", d)
	}
	s.procs.MustStart("dev-k8s", "dev-k8s", nil, k8sArgs...)

	for _, sp := range s.servers {
		proctest.Eventually(s.t, sp.shard+" /health 200", 120*time.Second, func() bool { return proctest.HTTPOK("http://" + sp.health + "/health") })
	}
	ca := filepath.Join(s.dir, "dev-s3", "cluster", "ca.crt")
	proctest.Eventually(s.t, "cluster CA in dev-s3", 30*time.Second, func() bool { return proctest.Exists(ca) })
	proctest.Eventually(s.t, "dev-k8s kubeconfig", 30*time.Second, func() bool { return proctest.Exists(kubeconfig) })

	caPEM, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	s.put("configmaps", "nstance-cluster-ca", map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "nstance-cluster-ca", "namespace": namespace}, "data": map[string]any{"ca.crt": string(caPEM)}})
	nonce, err := proctest.Output(context.Background(), s.env(), filepath.Join(s.bin, "nstance-admin"), "cluster", "nonce", "--cluster-id", clusterID,
		"--storage-bucket", bucket, "--key-provider", "env", "--expiry", "1h", "--output", "-")
	if err != nil {
		t.Fatal(err)
	}
	s.put("secrets", "nstance-operator-nonce", map[string]any{"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
		"metadata": map[string]any{"name": "nstance-operator-nonce", "namespace": namespace},
		"data":     map[string]any{"nonce.jwt": base64.StdEncoding.EncodeToString(bytes.TrimSpace(nonce))}})

	var shards []proctest.OperatorShard
	for _, sp := range s.servers {
		shards = append(shards, proctest.OperatorShard{Name: sp.shard, Registration: sp.registration, Operator: sp.operator})
	}
	opCfg := filepath.Join(s.dir, "operator", "config.yaml")
	if err := proctest.WriteFile(opCfg, proctest.OperatorConfig(clusterID, "default", shards...), 0o644); err != nil {
		t.Fatal(err)
	}
	s.procs.MustStart("operator", "nstance-operator", []string{"NSTANCE_NAMESPACE=" + namespace, "NSTANCE_K8S_JSON=true"},
		"--kubeconfig", kubeconfig, "--config", opCfg, "--health-probe-bind-address", s.probeAddr, "--disable-webhooks")
	proctest.Eventually(s.t, "operator registered (Secret nstance-operator-cert)", 120*time.Second, func() bool {
		_, err := os.Stat(s.path("secrets", namespace, "nstance-operator-cert"))
		return err == nil
	})
}

// path is where dev-k8s keeps an object: {dir}/{resource}/{ns}/{name}.json.
func (s *stack) path(resource, ns, name string) string {
	if ns == "" {
		return filepath.Join(s.k8sDir, resource, name+".json")
	}
	return filepath.Join(s.k8sDir, resource, ns, name+".json")
}

// Resource directories of dev-k8s (custom resources are kept under
// {plural}.{group}).
const (
	resPools           = "machinepools"
	resMachines        = "machines"
	resNstanceMachines = "nstancemachines"
	resNstancePools    = "nstancemachinepools"
	resShardGroups     = "nstanceshardgroups"
)

// put writes an object as its JSON file, the way a developer edits one.
func (s *stack) put(resource, name string, obj map[string]any) {
	s.t.Helper()
	if err := proctest.WriteJSON(s.path(resource, namespace, name), obj); err != nil {
		s.t.Fatal(err)
	}
}

// get reads an object's JSON file; ok is false when it does not exist.
func (s *stack) get(resource, ns, name string) (map[string]any, bool) {
	b, err := os.ReadFile(s.path(resource, ns, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false
	}
	if err != nil {
		s.t.Fatal(err)
	}
	var obj map[string]any
	if err := json.Unmarshal(b, &obj); err != nil {
		return nil, false // being rewritten
	}
	return obj, true
}

// field walks nested maps: field(obj, "spec", "replicas").
func field(obj map[string]any, keys ...string) any {
	var cur any = obj
	for _, k := range keys {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[k]
	}
	return cur
}

// nodes lists the Node files (instance ids) in dev-k8s.
func (s *stack) nodes() []string {
	entries, _ := os.ReadDir(filepath.Join(s.k8sDir, "nodes"))
	var ids []string
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".json"); ok && !strings.HasPrefix(n, ".") {
			ids = append(ids, n)
		}
	}
	return ids
}

// registered reports whether an agent holds its certificate and has
// consumed its nonce.
func (s *stack) registered(id string) bool {
	idDir := filepath.Join(s.dir, "agents", id, "identity")
	_, errCert := os.Stat(filepath.Join(idDir, "agent.crt"))
	_, errNonce := os.Stat(filepath.Join(idDir, "nonce.jwt"))
	return errCert == nil && errors.Is(errNonce, os.ErrNotExist)
}

// ctx is a short context for API calls.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}
