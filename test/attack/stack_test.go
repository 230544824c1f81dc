package attack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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

// stopGrace is how long a stopped process of the stack may take to exit
// after SIGTERM before it is killed.
const stopGrace = 10 * time.Second

// bins holds the binaries of the suite, built once per test binary.
var bins proctest.Binaries

func TestMain(m *testing.M) { os.Exit(bins.Main(m)) }

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
	// procs are the stack's processes, logs in dir/logs/{name}.log.
	procs *proctest.Group
}

type server struct {
	shard                                           string
	health, election, registration, operator, agent string
	proc                                            *proc
}

type proc = proctest.Proc

func newStack(t *testing.T) *stack {
	t.Helper()
	s := &stack{t: t, root: proctest.Root(t), dir: t.TempDir(), bin: bins.Dir(t, "dev-s3", "nstance-server", "nstance-agent"), s3Addr: portpick.Addr(t)}
	for n := 1; n <= 2; n++ {
		s.servers = append(s.servers, &server{
			shard: fmt.Sprintf("dev-%d", n), health: portpick.Addr(t), election: portpick.Addr(t),
			registration: portpick.Addr(t), operator: portpick.Addr(t), agent: portpick.Addr(t),
		})
	}
	// Cleanups run last-in first-out: the group's processes stop first,
	// then the agent process groups the servers started for this stack (by
	// the PIDs the process provider recorded in this stack's state
	// directories; nothing else is touched).
	t.Cleanup(func() { proctest.StopRecorded(filepath.Join(s.dir, "agents-*", "*", "process.json"), stopGrace) })
	s.procs = proctest.NewGroup(t, proctest.Options{Bin: s.bin, Dir: s.dir, Grace: stopGrace})
	return s
}

func (s *stack) awsEnv() []string { return proctest.S3Env("http://" + s.s3Addr) }

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

// up starts dev-s3 and both servers and waits until both serve.
func (s *stack) up(ctx context.Context) {
	t := s.t
	t.Helper()
	s.procs.MustStart("dev-s3", "dev-s3", nil, "--addr", s.s3Addr, "--bucket", bucket, "--dir", filepath.Join(s.dir, "dev-s3"))
	if err := proctest.Wait(ctx, "dev-s3 /healthz", 30*time.Second, func() bool { return proctest.HTTPOK("http://" + s.s3Addr + "/healthz") }); err != nil {
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
		sv.proc = s.procs.MustStart("server-"+sv.shard, "nstance-server", env, "--shard", sv.shard, "--id", sv.shard+"-attack",
			"--bucket", bucket, "--cache-dir", filepath.Join(s.dir, "cache-"+sv.shard), "--bind-health", sv.health,
			// Nonce markers are swept every 2s, so a case can watch a sweep (cases_identity_test.go).
			"--nonce-sweep-interval", "2s")
		if sv == s.servers[0] {
			// dev-1 leads the cluster: it runs alone until it holds the lease.
			if err := proctest.Wait(ctx, sv.shard+" holding the cluster lease", 120*time.Second, func() bool {
				b, err := s.get(ctx, s.keys.ClusterLeader())
				return err == nil && strings.Contains(string(b), `"`+sv.shard+`-attack"`)
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, sv := range s.servers {
		if err := proctest.Wait(ctx, sv.shard+" /health 200", 120*time.Second, func() bool { return proctest.HTTPOK("http://" + sv.health + "/health") }); err != nil {
			t.Fatal(err)
		}
		// /health is 200 once the cache is synced; the listeners come with
		// shard leadership.
		if err := proctest.Wait(ctx, sv.shard+" listeners", 60*time.Second, func() bool {
			return proctest.Dialable(sv.registration, sv.operator, sv.agent)
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
