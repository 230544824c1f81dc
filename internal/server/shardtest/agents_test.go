package shardtest_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nstance-dev/nstance/internal/server/agentapi"
	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/process"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/pkg/objstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Health settings of the agent tests: reports every 200ms, unhealthy after
// 15 misses (3s). The agents and the server are separate processes competing
// for the CPU: with 3 misses (600ms) a healthy agent that a loaded machine
// did not schedule for a moment was declared unhealthy and replaced, failing
// the rotation test (about 1 run in 20 with both cores busy).
const (
	reportEvery = 200 * time.Millisecond
	misses      = 15
)

// agentBinary builds cmd/nstance-agent once per test binary run.
var agentBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "nstance-agent-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "nstance-agent")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/nstance-dev/nstance/cmd/nstance-agent").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building nstance-agent: %v\n%s", err, out)
	}
	return bin, nil
})

func TestMain(m *testing.M) {
	code := m.Run()
	if bin, err := agentBinary(); err == nil {
		os.RemoveAll(filepath.Dir(bin))
	}
	os.Exit(code)
}

// agentConfig is the test shard config whose worker template delivers a
// templated file and a certificate for a generated key.
func agentConfig(role string) string {
	return strings.Replace(shardtest.Config("test-cluster", "test-1", "process"),
		`"worker": { "kind": "worker", "arch": "amd64", "instance_type": "test.small", "subnet_pool": "default", "vars": { "role": "worker" } },`,
		fmt.Sprintf(`"worker": { "kind": "worker", "arch": "amd64", "instance_type": "test.small", "subnet_pool": "default", "vars": { "role": %q },
      "keys": { "tls": { "type": "ed25519", "certificate": { "common_name": "{{ .InstanceID }}", "dns_names": ["{{ .InstanceID }}.workers.test"], "usages": ["server_auth"] } } },
      "files": {
        "role": { "kind": "string", "path": "role.txt", "content": "role={{ .Vars.role }} group={{ .Group }}" },
        "tls": { "kind": "certificate", "path": "tls.crt", "key": "tls" },
      } },`, role), 1)
}

// agentShard is a fake shard whose process provider runs the real agent.
type agentShard struct {
	sh       *shardtest.Shard
	p        *process.Provider
	c        nstancev1.OperatorServiceClient
	stateDir string
}

func startAgentShard(t *testing.T) *agentShard {
	t.Helper()
	return startAgentShardWith(t, agentConfig("worker"))
}

// startAgentShardWith starts the shard with cfg; opts adjust the shard's options.
func startAgentShardWith(t *testing.T, cfg string, opts ...func(*shardtest.Options)) *agentShard {
	t.Helper()
	return startAgentShardProc(t, cfg, nil, opts...)
}

// startAgentShardProc is startAgentShardWith whose process provider config
// proc adjusts first (nil: as it is).
func startAgentShardProc(t testing.TB, cfg string, proc func(*process.Config), opts ...func(*shardtest.Options)) *agentShard {
	t.Helper()
	bin, err := agentBinary()
	require.NoError(t, err)
	a := &agentShard{stateDir: t.TempDir()}
	pc := process.Config{
		Command: []string{bin}, StateDir: a.stateDir, StopTimeout: time.Second,
		Env: []string{"NSTANCE_METRICS_INTERVAL=" + reportEvery.String(), "NSTANCE_RECONNECT_MIN=100ms", "NSTANCE_RECONNECT_MAX=1s"},
	}
	if proc != nil {
		proc(&pc)
	}
	a.p, err = process.New(pc)
	require.NoError(t, err)
	t.Cleanup(func() {
		list, _ := a.p.List(context.Background())
		for _, inst := range list {
			_ = a.p.Delete(context.Background(), inst.InstanceID)
		}
	})
	// Health tuning comes from the shard config only (unless cfg set it).
	if !strings.Contains(cfg, `"health_check_interval"`) {
		cfg = strings.Replace(cfg, `"default_drain_timeout": "30s",`, fmt.Sprintf(`"default_drain_timeout": "30s", "health_check_interval": %q, "health_misses": %d, "agent_startup_grace": "30s",`,
			reportEvery.String(), misses), 1)
	}
	o := shardtest.Options{
		ConfigJSONC: cfg, Provider: a.p,
		Agent: app.Tuning{
			RepushInterval: 500 * time.Millisecond,
		},
	}
	for _, opt := range opts {
		opt(&o)
	}
	a.sh = shardtest.Start(t, o)
	a.c = a.sh.Client(t, "acme")
	return a
}

// firstReport is when id first reported in the running term (server clock).
func (a *agentShard) firstReport(id string) (time.Time, bool) {
	t := a.sh.Assembly.Term()
	if t == nil {
		return time.Time{}, false
	}
	rec, ok := t.Agents.Get(id)
	return rec.First, ok && rec.Reports > 0
}

func (a *agentShard) upsert(t *testing.T, size uint32, instanceType string) {
	t.Helper()
	_, err := a.c.UpsertGroup(ctxT(t), &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{
		GroupId: "workers", Template: "worker", Size: size, InstanceType: instanceType, DrainTimeout: durationpb.New(300 * time.Millisecond),
	}})
	require.NoError(t, err)
}

func (a *agentShard) ids(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, pid := range group(t, a.c, "workers").GetProviderIds() {
		out = append(out, instanceID(pid))
	}
	return out
}

func (a *agentShard) file(id, name string) string {
	b, _ := os.ReadFile(filepath.Join(a.stateDir, id, "files", name))
	return string(b)
}

// agentHash is the config hash the instance's agent last reported.
func (a *agentShard) agentHash(id string) string {
	term := a.sh.Assembly.Term()
	if term == nil {
		return ""
	}
	rec, ok := term.Agents.Get(id)
	if !ok {
		return ""
	}
	return rec.Last.GetConfigHash()
}

// serverHash is the hash of the files the server currently wants the instance to hold.
func (a *agentShard) serverHash(t *testing.T, id string) string {
	t.Helper()
	term := a.sh.Assembly.Term()
	require.NotNil(t, term, "the server leads")
	_, h, err := term.Agent.Files(context.Background(), agentapi.Ref{InstanceID: id, Tenant: "acme", Shard: "test-1", Group: "workers"})
	require.NoError(t, err)
	return h
}

func (a *agentShard) watch(t *testing.T) (*collector[*nstancev1.InstanceEvent], *collector[*nstancev1.ErrorEvent]) {
	t.Helper()
	ctx := ctxT(t)
	wi, err := a.c.WatchInstances(ctx, &nstancev1.WatchInstancesRequest{})
	require.NoError(t, err)
	_, err = wi.Header()
	require.NoError(t, err)
	we, err := a.c.WatchErrors(ctx, &nstancev1.WatchErrorsRequest{})
	require.NoError(t, err)
	_, err = we.Header()
	require.NoError(t, err)
	return collect(t, wi.Recv), collect(t, we.Recv)
}

func TestAgentsRegisterReceiveFilesAndGetVarChangesPushed(t *testing.T) {
	a := startAgentShard(t)
	a.upsert(t, 2, "")
	g := waitGroup(t, a.c, "workers", 2)
	require.Len(t, g.GetProviderIds(), 2)
	ids := a.ids(t)

	for _, id := range ids {
		require.Eventually(t, func() bool {
			return a.file(id, "role.txt") == "role=worker group=workers" && a.file(id, "tls.crt") != ""
		}, 10*time.Second, 20*time.Millisecond, "files of %s delivered", id)
		block, _ := pem.Decode([]byte(a.file(id, "tls.crt")))
		require.NotNil(t, block)
		cert, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		require.Equal(t, id, cert.Subject.CommonName)
		wca, err := a.sh.TenantWorkloadCA(context.Background(), "acme")
		require.NoError(t, err)
		require.NoError(t, cert.CheckSignatureFrom(wca), "issued by the tenant's workload CA")
		require.Error(t, cert.CheckSignatureFrom(a.sh.CA.Cert), "not by the cluster CA")
		st, err := os.Stat(filepath.Join(a.stateDir, id, "keys", "tls.key"))
		require.NoError(t, err, "generated key on disk")
		require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
		require.Eventually(t, func() bool { return a.agentHash(id) == a.serverHash(t, id) }, 10*time.Second, 20*time.Millisecond,
			"agent %s reports the hash of what it was sent", id)
		status, err := a.c.GetInstanceStatus(ctxT(t), &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: id}})
		require.NoError(t, err)
		require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_RUNNING, status.GetInstance().GetState())
		require.NotNil(t, status.GetInstance().GetLastHealthAt(), "first report recorded on the instance")
		last := status.GetInstance().GetLastReport()
		require.NotNil(t, last, "GetInstanceStatus carries the last report's figures")
		require.Positive(t, last.GetMemory().GetTotalBytes())
		require.NotEmpty(t, last.GetFiles(), "and its files' status")
		require.Equal(t, a.agentHash(id), last.GetConfigHash())
	}
	listed, err := a.c.ListInstances(ctxT(t), &nstancev1.ListInstancesRequest{})
	require.NoError(t, err)
	for _, st := range listed.GetInstances() {
		require.Nil(t, st.GetLastReport(), "ListInstances leaves the reports out unless asked")
	}
	listed, err = a.c.ListInstances(ctxT(t), &nstancev1.ListInstancesRequest{WithHealth: true})
	require.NoError(t, err)
	require.Len(t, listed.GetInstances(), 2)
	for _, st := range listed.GetInstances() {
		require.NotNil(t, st.GetLastReport(), "with_health: %s", st.GetInstanceId())
	}
	before := map[string]string{}
	for _, id := range ids {
		before[id] = a.agentHash(id)
	}

	// A template var changes: every agent gets its files again, with a new hash.
	ctx := ctxT(t)
	_, err = a.sh.Store.Put(ctx, a.sh.Keys.Config(a.sh.ShardID), []byte(agentConfig("web")), objstore.PutOptions{})
	require.NoError(t, err)
	res, err := a.sh.AdminClient(t, "acme").RefreshConfig(ctx, &nstancev1.RefreshConfigRequest{})
	require.NoError(t, err)
	require.Equal(t, nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_UPDATED, res.GetOutcome(), res.GetMessage())
	for _, id := range ids {
		require.Eventually(t, func() bool { return a.file(id, "role.txt") == "role=web group=workers" }, 10*time.Second, 20*time.Millisecond,
			"new var value written on %s", id)
		require.Eventually(t, func() bool {
			h := a.agentHash(id)
			return h != before[id] && h == a.serverHash(t, id)
		}, 10*time.Second, 20*time.Millisecond, "agent %s reports the new hash", id)
	}
	require.ElementsMatch(t, ids, a.ids(t), "a var change replaces no instance")
}

func TestUnhealthyAndKilledAgentsAreReplacedBeforeDrain(t *testing.T) {
	a := startAgentShard(t)
	insts, errs := a.watch(t)
	a.upsert(t, 2, "")
	waitGroup(t, a.c, "workers", 2)
	initial := a.ids(t)
	pids := map[string]int{}
	for _, id := range initial {
		pid, ok := a.p.PID(id)
		require.True(t, ok)
		pids[id] = pid
	}

	// The message names the mechanism that noticed (the time it took
	// depends on how busy the machine is, so it is only logged).
	cases := []struct {
		name    string
		victim  string
		signal  syscall.Signal
		message string // regular expression
	}{
		// A frozen agent: the process lives, reports stop; health monitoring
		// notices once at least misses reports are overdue.
		{"frozen agent misses reports", initial[0], syscall.SIGSTOP, `agent missed (\d+) health reports`},
		// A killed agent: the provider check that follows a missed report finds it gone.
		{"killed agent", initial[1], syscall.SIGKILL, "instance stopped"},
	}
	var pending []*nstancev1.InstanceEvent
	for _, tc := range cases {
		before := a.ids(t)
		began := time.Now()
		require.NoError(t, syscall.Kill(pids[tc.victim], tc.signal), tc.name)

		ev := errs.next(t, 15*time.Second, func(e *nstancev1.ErrorEvent) bool { return e.GetInstanceId() == tc.victim })
		m := regexp.MustCompile(tc.message).FindStringSubmatch(ev.GetMessage())
		require.NotNil(t, m, "%s: %q does not match %q", tc.name, ev.GetMessage(), tc.message)
		if len(m) > 1 {
			n, err := strconv.Atoi(m[1])
			require.NoError(t, err)
			require.GreaterOrEqual(t, n, misses, "%s: not declared unhealthy before %d missed reports", tc.name, misses)
		}
		detected := time.Since(began)
		t.Logf("%s: detected after %s: %s", tc.name, detected.Round(time.Millisecond), ev.GetMessage())

		pd := insts.next(t, 20*time.Second, func(e *nstancev1.InstanceEvent) bool {
			return e.GetStatus() == nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION
		})
		require.Equal(t, tc.victim, pd.GetInstanceId(), "%s: only the victim is drained", tc.name)
		require.Equal(t, nstancev1.DeletionReason_DELETION_REASON_UNHEALTHY, pd.GetReason())
		pending = append(pending, pd)
		del := insts.next(t, 10*time.Second, func(e *nstancev1.InstanceEvent) bool {
			return e.GetStatus() == nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED
		})
		require.Equal(t, tc.victim, del.GetInstanceId())
		require.Eventually(t, func() bool { return !pidAlive(pids[tc.victim]) }, 5*time.Second, 20*time.Millisecond, "%s: process gone", tc.name)
		_, ok := a.p.PID(tc.victim)
		require.False(t, ok, "%s: deleted at the provider", tc.name)

		g := waitGroup(t, a.c, "workers", 2)
		var replacement string
		for _, pid := range g.GetProviderIds() {
			if id := instanceID(pid); !contains(before, id) {
				replacement = id
			}
		}
		require.NotEmpty(t, replacement, "%s: a new instance joined", tc.name)
		at, ok := a.firstReport(replacement)
		require.True(t, ok)
		require.True(t, at.Before(pd.GetOccurredAt().AsTime()),
			"%s: replacement %s reported (%s) before %s was announced pending deletion (%s)", tc.name, replacement, at, tc.victim, pd.GetOccurredAt().AsTime())
		t.Logf("%s: replacement %s first report %s, %s pending deletion %s, deleted %s", tc.name, replacement,
			at.Format("15:04:05.000"), tc.victim, pd.GetOccurredAt().AsTime().Local().Format("15:04:05.000"), del.GetOccurredAt().AsTime().Local().Format("15:04:05.000"))
	}
	require.Len(t, pending, 2)
}

func TestInstanceTypeChangeRotatesOneAtATime(t *testing.T) {
	a := startAgentShard(t)
	insts, _ := a.watch(t)
	a.upsert(t, 2, "")
	waitGroup(t, a.c, "workers", 2)
	initial := a.ids(t)

	// Sample the provider and the records throughout the rotation.
	var mu sync.Mutex
	var violations []string
	minRunning, maxActive := 99, 0
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			list, err := a.p.List(context.Background())
			if err != nil {
				continue
			}
			running := 0
			for _, inst := range list {
				if inst.State == provider.StateRunning {
					running++
				}
			}
			active := 0
			for _, rec := range a.sh.Assembly.Instances.ListGroup("acme", "workers") {
				if rec.State.Active() {
					active++
				}
			}
			mu.Lock()
			minRunning, maxActive = min(minRunning, running), max(maxActive, active)
			if running < 2 {
				violations = append(violations, fmt.Sprintf("%d running", running))
			}
			if active > 3 {
				violations = append(violations, fmt.Sprintf("%d active (size 2 + surge 1)", active))
			}
			mu.Unlock()
		}
	}()

	a.upsert(t, 2, "test.large")
	var rotations []*nstancev1.InstanceEvent
	deleted := map[string]bool{}
	for len(deleted) < 2 {
		ev := insts.next(t, 30*time.Second, func(*nstancev1.InstanceEvent) bool { return true })
		require.Contains(t, initial, ev.GetInstanceId(), "only the old instances leave (%v)", ev)
		switch ev.GetStatus() {
		case nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION:
			require.Equal(t, nstancev1.DeletionReason_DELETION_REASON_ROTATION, ev.GetReason())
			rotations = append(rotations, ev)
		case nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED:
			deleted[ev.GetInstanceId()] = true
		}
	}
	g := waitGroup(t, a.c, "workers", 2)
	close(stop)
	<-sampled
	mu.Lock()
	require.Empty(t, violations)
	t.Logf("rotation: fewest running %d, most active %d", minRunning, maxActive)
	mu.Unlock()

	require.Len(t, rotations, 2)
	var fresh []string
	for _, pid := range g.GetProviderIds() {
		id := instanceID(pid)
		require.NotContains(t, initial, id)
		rec, ok := a.sh.Assembly.Instances.Get(id)
		require.True(t, ok)
		require.Equal(t, "test.large", rec.InstanceType)
		require.Equal(t, instances.StateRunning, rec.State)
		fresh = append(fresh, id)
	}
	// The k-th old instance is announced only once k new ones have reported.
	for k, ev := range rotations {
		reported := 0
		for _, id := range fresh {
			if at, ok := a.firstReport(id); ok && at.Before(ev.GetOccurredAt().AsTime()) {
				reported++
			}
		}
		require.GreaterOrEqual(t, reported, k+1, "rotation %d of %s started with only %d replacements reporting", k+1, ev.GetInstanceId(), reported)
		t.Logf("rotation %d: %s pending deletion at %s with %d replacement(s) reporting", k+1, ev.GetInstanceId(),
			ev.GetOccurredAt().AsTime().Local().Format("15:04:05.000"), reported)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
