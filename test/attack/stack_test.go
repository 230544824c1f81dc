package attack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/testing/portpick"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/s3store"
)

const (
	clusterID     = "attack-cluster"
	bucket        = "dev"
	encryptionKey = "thisisatest32bytekey123456789012"
	// panicHookEnv enables the servers' test-only panic hook
	// (grpcserve.PanicHookEnv); only this suite sets it.
	panicHookEnv = "NSTANCE_TEST_PANIC_HOOK"
)

// stack is dev-s3 and two nstance-servers (shards dev-1 and dev-2, process
// provider), each a child process of the test in its own process group,
// every port picked free on 127.0.0.1.
type stack struct {
	t       *testing.T
	root    string
	dir     string
	bin     string
	s3Addr  string
	servers []*server
	store   objstore.Store
	keys    layout.Keys

	mu    sync.Mutex
	procs []*proc
}

type server struct {
	shard                                           string
	health, election, registration, operator, agent string
	proc                                            *proc
}

type proc = proctest.Proc

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := proctest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// buildBinaries compiles the three binaries the stack runs with one `go
// build` (packages compile once, in parallel).
func buildBinaries(t *testing.T, root string) string {
	t.Helper()
	dir := t.TempDir()
	if err := proctest.Build(root, dir, "dev-s3", "nstance-server", "nstance-agent"); err != nil {
		t.Fatal(err)
	}
	return dir
}

// freeAddr returns a 127.0.0.1 address no other test gets while this one
// runs (the stack's processes are told their addresses before binding).
func freeAddr(t *testing.T) string {
	t.Helper()
	return portpick.Addr(t)
}

func newStack(t *testing.T) *stack {
	t.Helper()
	root := repoRoot(t)
	s := &stack{t: t, root: root, dir: t.TempDir(), bin: buildBinaries(t, root), s3Addr: freeAddr(t)}
	for n := 1; n <= 2; n++ {
		s.servers = append(s.servers, &server{
			shard: fmt.Sprintf("dev-%d", n), health: freeAddr(t), election: freeAddr(t),
			registration: freeAddr(t), operator: freeAddr(t), agent: freeAddr(t),
		})
	}
	t.Cleanup(s.stop)
	return s
}

func (s *stack) awsEnv() []string {
	return []string{"AWS_ACCESS_KEY_ID=dev", "AWS_SECRET_ACCESS_KEY=dev", "AWS_REGION=us-east-1",
		"AWS_ENDPOINT_URL=http://" + s.s3Addr, "AWS_S3_USE_PATH_STYLE=true"}
}

// start runs a binary of the build directory with its output in
// dir/logs/{name}.log.
func (s *stack) start(name, binary string, env []string, args ...string) *proc {
	s.t.Helper()
	p, err := proctest.Start(name, filepath.Join(s.dir, "logs", name+".log"), s.dir, append(os.Environ(), env...), filepath.Join(s.bin, binary), args...)
	if err != nil {
		s.t.Fatal(err)
	}
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	return p
}

// stopProc ends one process group: SIGTERM, then SIGKILL after 10s.
func stopProc(p *proc) { p.Stop(10 * time.Second) }

// agentRecord is what the process provider records per instance
// ({state_dir}/{id}/process.json).
type agentRecord struct {
	PID        int    `json:"pid"`
	StartTicks uint64 `json:"start_ticks"`
}

// startTicks is the kernel start time of a process (field 22 of
// /proc/<pid>/stat), which tells a recorded agent from a later process that
// reused its PID.
func startTicks(pid int) (uint64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command name (field 2) may hold spaces; count after its ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, false
	}
	var v uint64
	if _, err := fmt.Sscanf(f[19], "%d", &v); err != nil {
		return 0, false
	}
	return v, true
}

// stop tears down in reverse start order, then ends the agent process groups
// the servers started for this stack (by the PIDs the process provider
// recorded in this stack's state directories; nothing else is touched).
func (s *stack) stop() {
	s.mu.Lock()
	procs := append([]*proc(nil), s.procs...)
	s.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		stopProc(procs[i])
	}
	recs, _ := filepath.Glob(filepath.Join(s.dir, "agents-*", "*", "process.json"))
	for _, r := range recs {
		b, err := os.ReadFile(r)
		var rec agentRecord
		if err != nil || json.Unmarshal(b, &rec) != nil || rec.PID <= 0 {
			continue
		}
		if st, ok := startTicks(rec.PID); !ok || st != rec.StartTicks {
			continue // gone, or the PID now belongs to another process
		}
		if syscall.Kill(-rec.PID, syscall.SIGTERM) != nil {
			continue
		}
		deadline := time.Now().Add(10 * time.Second)
		for syscall.Kill(rec.PID, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		_ = syscall.Kill(-rec.PID, syscall.SIGKILL)
	}
	if s.t.Failed() {
		for _, p := range procs {
			s.t.Logf("---- %s (%s), last lines:\n%s", p.Name, p.Log, tail(p.Log, 40))
		}
	}
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stateDir is where server N's process provider keeps its instances.
func (s *stack) stateDir(sv *server) string { return filepath.Join(s.dir, "agents-"+sv.shard) }

// shardConfig is the config of one shard: process provider running the
// built agent, loopback binds on the picked ports, both tenants declared,
// and template "svc" (for both) whose
// key "svc" gets a server and client certificate with names rendered from
// vars, and file ca.crt the CA bundle that verifies such certificates.
// svcUsages is the usages line of template "svc" (cases replace it).
const svcUsages = `"usages": ["server_auth", "client_auth"],`

func (s *stack) shardConfig(sv *server) []byte {
	options, _ := json.Marshal(map[string]string{
		"command": filepath.Join(s.bin, "nstance-agent"), "state_dir": s.stateDir(sv), "node_dir": "-", "work_dir": s.dir,
	})
	return []byte(fmt.Sprintf(`// attack suite shard config
{
  "cluster": {
    "id": %[1]q,
    "storage": { "kind": "s3", "bucket": %[2]q },
    "secrets": { "encryption_key": { "provider": "env", "env": "NSTANCE_ENCRYPTION_KEY" } },
    "leader_election": { "lease_duration": "15s", "renew_interval": "5s", "retry_interval": "1s" },
  },
  "shard": {
    "id": %[3]q,
    "infra": { "provider": "process", "region": "dev", "zone": "deva", "options": %[4]s },
    "bind": {
      "health_addr": %[5]q, "election_addr": %[6]q, "registration_addr": %[7]q,
      "operator_addr": %[8]q, "agent_addr": %[9]q,
    },
    "advertise": { "hosts": ["127.0.0.1"], "registration_addr": %[7]q, "operator_addr": %[8]q, "agent_addr": %[9]q },
    "health_check_interval": "5s",
    "default_drain_timeout": "1m",
    "subnet_pools": { "default": { "subnets": ["dev-subnet-a"] } },
  },
  "tenants": [%[10]q, %[11]q],
  "certificates": { "agent_validity": "24h", "operator_validity": "24h", "agent_nonce_ttl": "15m", "nonce_max_lifetime": %[12]q },
  "defaults": {
    "vars": { "san_dns": "svc.workload.test", "san_ip": "10.20.30.40", "san_uri": "spiffe://workload.test/svc" },
  },
  "templates": {
    "svc": {
      "kind": "worker", "arch": "amd64", "instance_type": "dev.small", "subnet_pool": "default",
      "tenants": [%[10]q, %[11]q],
      "keys": {
        "svc": {
          "type": "ed25519",
          "certificate": {
            "common_name": "{{ .InstanceID }}",
            "dns_names": ["{{ .Vars.san_dns }}"],
            "ip_addresses": ["{{ .Vars.san_ip }}"],
            "uris": ["{{ .Vars.san_uri }}"],
            `+svcUsages+`
            "validity": "24h",
          },
        },
      },
      "files": {
        "svc.crt": { "kind": "certificate", "key": "svc", "mode": "0644" },
        "ca.crt": { "kind": "ca_bundle", "mode": "0644" },
      },
    },
  },
  "groups": {},
}
`, clusterID, bucket, sv.shard, options, sv.health, sv.election, sv.registration, sv.operator, sv.agent, tenantA, tenantB, nonceMaxLifetime(sv.shard)))
}

// nonceMaxLifetime is 1h on dev-1, the cluster leader, and 24h on dev-2:
// a case checks that the leader's sweep of the cluster's nonce markers
// honours each marker's own expiry, not its shard's lifetime
// (cases_identity_test.go).
func nonceMaxLifetime(shard string) string {
	if shard == "dev-1" {
		return "1h"
	}
	return "24h"
}

func httpOK(url string) bool {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitFor polls cond every 100ms until it holds or timeout passes.
func waitFor(what string, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// up starts dev-s3 and both servers and waits until both serve.
func (s *stack) up(ctx context.Context) {
	t := s.t
	t.Helper()
	s.start("dev-s3", "dev-s3", nil, "--addr", s.s3Addr, "--bucket", bucket, "--dir", filepath.Join(s.dir, "dev-s3"))
	if err := waitFor("dev-s3 /healthz", 30*time.Second, func() bool { return httpOK("http://" + s.s3Addr + "/healthz") }); err != nil {
		t.Fatal(err)
	}
	// The S3 client reads the standard AWS variables.
	for _, kv := range s.awsEnv() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	store, err := s3store.New(ctx, bucket, "")
	if err != nil {
		t.Fatal(err)
	}
	s.store, s.keys = store, layout.New("")
	for _, sv := range s.servers {
		if _, err := s.store.Put(ctx, s.keys.Config(sv.shard), s.shardConfig(sv), objstore.PutOptions{}); err != nil {
			t.Fatalf("uploading the config of %s: %v", sv.shard, err)
		}
		env := append(s.awsEnv(), "NSTANCE_ENCRYPTION_KEY="+encryptionKey, panicHookEnv+"=1")
		sv.proc = s.start("server-"+sv.shard, "nstance-server", env, "--shard", sv.shard, "--id", sv.shard+"-attack",
			"--bucket", bucket, "--cache-dir", filepath.Join(s.dir, "cache-"+sv.shard), "--bind-health", sv.health,
			// Nonce markers are swept every 2s, so a case can watch a sweep (cases_identity_test.go).
			"--nonce-sweep-interval", "2s")
		if sv == s.servers[0] {
			// dev-1 leads the cluster: it runs alone until it holds the lease.
			if err := waitFor(sv.shard+" holding the cluster lease", 120*time.Second, func() bool {
				b, err := s.get(ctx, s.keys.ClusterLeader())
				return err == nil && strings.Contains(string(b), `"`+sv.shard+`-attack"`)
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, sv := range s.servers {
		if err := waitFor(sv.shard+" /health 200", 120*time.Second, func() bool { return httpOK("http://" + sv.health + "/health") }); err != nil {
			t.Fatal(err)
		}
		// /health is 200 once the cache is synced; the listeners come with
		// shard leadership.
		if err := waitFor(sv.shard+" listeners", 60*time.Second, func() bool {
			for _, a := range []string{sv.registration, sv.operator, sv.agent} {
				c, err := net.DialTimeout("tcp", a, time.Second)
				if err != nil {
					return false
				}
				c.Close()
			}
			return true
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// get reads an object from S3, as an operator with storage access would.
func (s *stack) get(ctx context.Context, key string) ([]byte, error) {
	o, err := s.store.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	return o.Body, nil
}

// rss is the resident set size of a server process in bytes.
func rss(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err != nil {
				return 0, err
			}
			return kb * 1024, nil
		}
	}
	return 0, errors.New("no VmRSS line")
}
