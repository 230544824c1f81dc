package chaos

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nstance-dev/nstance/internal/agent/identity"
	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// envDuration reads a positive duration knob (make chaos raises them).
func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	require.NoError(t, err, "%s=%q", name, v)
	require.Positive(t, d, name)
	return d
}

// agentBinary is the nstance-agent binary built with the others.
func agentBinary(t testing.TB) string {
	t.Helper()
	return filepath.Join(binaries(t), "nstance-agent")
}

// renewalConfig is a one-server shard on host whose instances are real
// agents (process provider running agent, state in agentDir) and whose
// server and agent certificates live validity.
func renewalConfig(host string, validity time.Duration, agent, agentDir string) string {
	options, _ := json.Marshal(map[string]string{"command": agent, "state_dir": agentDir, "node_dir": "-", "work_dir": agentDir})
	return fmt.Sprintf(`{
  "cluster": {
    "id": %[1]q,
    "leader_election": {"lease_duration": "3s", "renew_interval": "1s", "renew_deadline": "2s", "max_clock_skew": "500ms", "retry_interval": "200ms"}
  },
  "shard": {
    "id": %[2]q,
    "infra": {"provider": "process", "region": "dev", "zone": "deva", "options": %[3]s},
    "bind": {
      "health_addr": "0.0.0.0:8990", "election_addr": "0.0.0.0:8991", "registration_addr": "0.0.0.0:8992",
      "operator_addr": "0.0.0.0:8993", "agent_addr": "0.0.0.0:8994"
    },
    "advertise": {"hosts": [%[5]q]},
    "health_check_interval": "1s",
    "subnet_pools": {"default": {"subnets": ["dev-subnet-a"]}}
  },
  "certificates": {"server_validity": %[4]q, "agent_validity": %[4]q, "operator_validity": "24h", "agent_nonce_ttl": "15m"},
  "templates": {
    "svc": {
      "kind": "worker", "arch": "amd64", "instance_type": "dev.small", "subnet_pool": "default",
      "files": {"motd": {"kind": "string", "content": "{{ .InstanceID }}"}}
    }
  },
  "groups": {}
}`, clusterID, shard, options, validity.String(), host)
}

// startRenewalStack is newStack with renewalConfig: one server on its own
// loopback host, dev-s3 in-process.
func startRenewalStack(t *testing.T, validity time.Duration, agent, agentDir string) *stack {
	t.Helper()
	st := newEmptyStack(t)
	s3 := devs3test.Start(t, filepath.Join(st.dir, "dev-s3"))
	st.s3URL = s3.URL
	host := st.net + "1"
	_, err := devs3test.Client(s3.URL).PutObject(context.Background(), putInput("config/"+shard+".jsonc",
		[]byte(renewalConfig(host, validity, agent, agentDir))))
	require.NoError(t, err)
	st.startServer("srv-1", host)
	return st
}

// killRecordedAgents kills the agent process groups the process provider
// recorded under dir ({id}/process.json); nothing else is touched
// (proctest.StopRecorded).
func killRecordedAgents(dir string) {
	proctest.StopRecorded(filepath.Join(dir, "*", "process.json"), 0)
}

// countLines counts the lines of a file containing sub.
func countLines(t *testing.T, path, sub string) int {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), sub) {
			n++
		}
	}
	require.NoError(t, sc.Err())
	return n
}

// handshakeFailures sums nstance_server_tls_handshake_failures_total from a
// server's /metrics, by label set.
func handshakeFailures(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "nstance_server_tls_handshake_failures_total") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, line)
		out[line[:i]] += v
	}
	require.NoError(t, sc.Err())
	return out
}

// fleetWatch lists the operator's instances every second and remembers
// every instance id and every state other than RUNNING it saw.
type fleetWatch struct {
	mu      sync.Mutex
	ids     map[string]bool
	bad     []string
	errs    []string
	stop    context.CancelFunc
	stopped chan struct{}
}

func watchFleet(c nstancev1.OperatorServiceClient) *fleetWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &fleetWatch{ids: map[string]bool{}, stop: cancel, stopped: make(chan struct{})}
	go func() {
		defer close(w.stopped)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := c.ListInstances(cctx, &nstancev1.ListInstancesRequest{})
			ccancel()
			w.mu.Lock()
			switch {
			case ctx.Err() != nil:
			case err != nil:
				w.errs = append(w.errs, time.Now().Format(time.TimeOnly)+" "+err.Error())
			default:
				for _, in := range resp.GetInstances() {
					w.ids[in.GetInstanceId()] = true
					if in.GetState() != nstancev1.InstanceState_INSTANCE_STATE_RUNNING {
						w.bad = append(w.bad, fmt.Sprintf("%s %s %s %s", time.Now().Format(time.TimeOnly), in.GetInstanceId(), in.GetState(), in.GetMessage()))
					}
				}
			}
			w.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

func (w *fleetWatch) Stop() { w.stop(); <-w.stopped }

// Certificates shortened by config (server and agent validity
// CHAOS_CERT_VALIDITY, 24s in make test, 2m in make chaos) and the stack
// left running CHAOS_RENEWAL_RUN (90s; 10m) with traffic: operator calls on
// a standing connection every 200ms and on a fresh connection (a new
// handshake against the possibly renewed server certificate) every second,
// agents reporting every second. Every certificate is renewed several
// times; no handshake fails on either side (server metric, agent logs,
// operator calls), no agent connection is lost, and no instance is
// replaced or leaves RUNNING.
func TestCertificatesRenewedUnderTraffic(t *testing.T) {
	validity := envDuration(t, "CHAOS_CERT_VALIDITY", 24*time.Second)
	run := envDuration(t, "CHAOS_RENEWAL_RUN", 90*time.Second)
	const size = 3
	agentDir := t.TempDir()
	t.Cleanup(func() { // after the servers are gone (cleanups run last-in first-out)
		killRecordedAgents(agentDir)
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(agentDir, "*", "agent.log"))
			for _, l := range logs {
				t.Logf("--- %s, last lines:\n%s", l, proctest.Tail(l, 30))
			}
		}
	})
	st := startRenewalStack(t, validity, agentBinary(t), agentDir)
	srv := st.servers[0]
	roots, opCert := st.registerOperator()
	// The operator-like client reads its roots and certificate at every
	// handshake: a CA rotation during the run replaces both through
	// RenewCertificate, as the operator does.
	op := &rotClient{name: "operator"}
	op.roots.Store(roots)
	op.cert.Store(&opCert)
	opTLS := pki.ClientTLSDynamic(op.roots.Load, nil, srv.host, nil)
	opTLS.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return op.cert.Load(), nil }
	conn, err := grpc.NewClient(srv.Operator(), grpc.WithTransportCredentials(credentials.NewTLS(opTLS.Clone())))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	c := nstancev1.NewOperatorServiceClient(conn)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "renew", Template: "svc", Size: size}})
	require.NoError(t, err)
	var initial []string
	require.Eventually(t, func() bool {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		resp, err := c.ListInstances(cctx, &nstancev1.ListInstancesRequest{})
		if err != nil {
			return false
		}
		initial = initial[:0]
		for _, in := range resp.GetInstances() {
			if in.GetState() != nstancev1.InstanceState_INSTANCE_STATE_RUNNING || in.GetLastHealthAt() == nil {
				return false
			}
			initial = append(initial, in.GetInstanceId())
		}
		return len(initial) == size
	}, 120*time.Second, 250*time.Millisecond, "%d instances running and reporting", size)
	sort.Strings(initial)
	t.Logf("instances %v running; validity %s, running %s", initial, validity, run)

	// Traffic and observation.
	w := watchFleet(c)
	var mu sync.Mutex
	var callErrs []string
	var calls, fresh int
	tctx, tcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // standing connection
		defer wg.Done()
		for tctx.Err() == nil {
			cctx, ccancel := context.WithTimeout(tctx, 5*time.Second)
			_, err := c.GetConfigStatus(cctx, &nstancev1.GetConfigStatusRequest{})
			ccancel()
			mu.Lock()
			calls++
			if err != nil && tctx.Err() == nil {
				callErrs = append(callErrs, "standing: "+err.Error())
			}
			mu.Unlock()
			sleepCtx(tctx, 200*time.Millisecond)
		}
	}()
	go func() { // a new connection, so a new handshake, every second
		defer wg.Done()
		for tctx.Err() == nil {
			err := freshCall(tctx, srv.Operator(), opTLS)
			mu.Lock()
			fresh++
			if err != nil && tctx.Err() == nil {
				callErrs = append(callErrs, "fresh connection: "+err.Error())
			}
			mu.Unlock()
			sleepCtx(tctx, time.Second)
		}
	}()
	began := time.Now()
	if os.Getenv("CHAOS_NO_ROTATION") == "" {
		// rotate-ca introduce -> switch -> retire while the traffic runs.
		rotateDuringRun(t, st, srv, c, op, agentDir, initial, validity)
	}
	// The run's length is the input, not a wait for a condition.
	time.Sleep(time.Until(began.Add(run)))
	tcancel()
	wg.Wait()
	w.Stop()

	// Server side: the certificate was renewed, agents' identities too,
	// and no handshake failed.
	failures := handshakeFailures(t, "http://"+srv.addr(8990)+"/metrics")
	serverRenewals := countLines(t, srv.log, "renewed certificate")
	identityRenewals := countLines(t, srv.log, "agent identity renewed")
	t.Logf("%d operator calls, %d fresh connections; server certificate renewed %d times, agent identities %d times; handshake failures %v",
		calls, fresh, serverRenewals, identityRenewals, failures)
	lifetimes := int(run / validity)
	require.GreaterOrEqual(t, serverRenewals, lifetimes, "server certificate renewals")
	require.GreaterOrEqual(t, identityRenewals, size*lifetimes, "agent identity renewals")
	require.Empty(t, failures, "failed TLS handshakes on the server")
	require.Empty(t, callErrs, "failed operator calls")
	// Control: the counter sees a refused handshake (a client certificate
	// of a foreign CA).
	require.Error(t, freshCall(context.Background(), srv.Operator(), foreignClientTLS(t, roots, srv.host)))
	require.Eventually(t, func() bool {
		return handshakeFailures(t, "http://"+srv.addr(8990)+"/metrics")[`nstance_server_tls_handshake_failures_total{listener="operator",reason="certificate"}`] == 1
	}, 10*time.Second, 50*time.Millisecond, "the handshake failure metric counts a refused client certificate")

	// Agent side: each renewed, reconnected only for that, and holds a
	// valid certificate of the same identity.
	for _, id := range initial {
		log := filepath.Join(agentDir, id, "agent.log")
		renewed := countLines(t, log, "identity certificate renewed")
		lost := countLines(t, log, "agent connection lost")
		loud := countLines(t, log, "!!!")
		t.Logf("agent %s: renewed %d times, connections lost %d", id, renewed, lost)
		require.GreaterOrEqual(t, renewed, lifetimes, "%s: renewals", id)
		require.Zero(t, lost, "%s: connections lost (failed handshakes or streams)", id)
		require.Zero(t, loud, "%s: identity errors", id)
		d, err := identity.Open(filepath.Join(agentDir, id, "identity"))
		require.NoError(t, err)
		cert, err := d.Certificate(time.Now())
		require.NoError(t, err, "%s: current identity", id)
		got, err := pki.IdentityFromCert(cert.Leaf, clusterID)
		require.NoError(t, err)
		require.Equal(t, id, got.ClientID)
	}

	// No instance was replaced, and none left RUNNING.
	w.mu.Lock()
	defer w.mu.Unlock()
	var seen []string
	for id := range w.ids {
		seen = append(seen, id)
	}
	sort.Strings(seen)
	require.Equal(t, initial, seen, "instances replaced")
	require.Empty(t, w.bad, "instances not RUNNING during the run")
	require.Empty(t, w.errs, "failed ListInstances calls")
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// freshCall dials a new connection, calls GetConfigStatus and closes it.
func freshCall(ctx context.Context, addr string, cfg *tls.Config) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg.Clone())))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = nstancev1.NewOperatorServiceClient(conn).GetConfigStatus(cctx, &nstancev1.GetConfigStatusRequest{})
	return err
}

// foreignClientTLS presents an operator certificate of another cluster's CA.
func foreignClientTLS(t *testing.T, roots *x509.CertPool, host string) *tls.Config {
	t.Helper()
	ca, err := pki.GenerateCA("foreign", time.Hour, time.Now())
	require.NoError(t, err)
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	leaf, _, err := ca.IssueClient(pki.ClientRequest{Identity: pki.Identity{ClusterID: "foreign", Tenant: "default", Role: pki.RoleOperator, ClientID: "intruder"},
		PublicKey: pub, Validity: time.Hour}, time.Now())
	require.NoError(t, err)
	return pki.ClientTLS(roots, &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}, host)
}
