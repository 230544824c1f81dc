package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/testing/netnstest"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
)

// vipConfig is a shard whose leader holds vip on eth0; its one instance
// is a real agent the process provider starts inside agentNS (through
// `ip netns exec`), dialling the VIP.
func vipConfig(vip netip.Prefix, agentCmd, agentDir string) string {
	options, _ := json.Marshal(map[string]string{"command": agentCmd, "state_dir": agentDir, "node_dir": "-", "work_dir": agentDir})
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
    "advertise": {"hosts": [%[4]q]},
    "leader_address": {"mode": "vip", "interface": "eth0", "address": %[5]q},
    "registration": {"source_address_check": "off"},
    "agent_startup_grace": "1h",
    "health_check_interval": "1s",
    "subnet_pools": {"default": {"subnets": ["dev-subnet-a"]}}
  },
  "templates": {
    "svc": {
      "kind": "worker", "arch": "amd64", "instance_type": "dev.small", "subnet_pool": "default",
      "files": {"motd": {"kind": "string", "content": "{{ .InstanceID }}"}}
    }
  },
  "groups": {"default": {"g": {"template": "svc", "size": 1}}}
}`, clusterID, shard, options, vip.Addr().String(), vip.String())
}

// vipServer is one nstance-server running inside its own namespace,
// reaching dev-s3 through its own proxy on the hub.
type vipServer struct {
	id    string
	host  *netnstest.Host
	proc  *proctest.Proc
	proxy *proxy
}

// vipStack is two servers in two network namespaces on one bridge, sharing
// the VIP, and a third namespace for the agent.
type vipStack struct {
	t         *testing.T
	bin, dir  string
	vip       netip.Prefix
	hosts     []*netnstest.Host
	agentHost *netnstest.Host
	servers   map[*netnstest.Host]*vipServer
	s3c       *s3.Client
	agentDir  string
	termFile  string
}

// startVIPStack writes the shard config (one agent instance when agent is
// set, none otherwise) and starts both servers.
func startVIPStack(t *testing.T, agent bool) *vipStack {
	netnstest.RequireRoot(t)
	ipCmd, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("skipping: the ip command (iproute2) is needed to start processes inside the namespaces")
	}
	if ipCmd, err = filepath.Abs(ipCmd); err != nil {
		t.Fatal(err)
	}
	st := &vipStack{t: t, bin: binaries(t), dir: t.TempDir(), vip: netip.MustParsePrefix("10.78.0.100/24"), servers: map[*netnstest.Host]*vipServer{}}
	n := netnstest.New(t, netip.MustParsePrefix("10.78.0.0/24"))
	st.hosts = []*netnstest.Host{n.AddHost("s1"), n.AddHost("s2")}
	st.agentHost = n.AddHost("ag")

	// dev-s3 runs in this process; each server reaches it through its own
	// proxy listening on the hub's bridge address.
	s3srv := devs3test.Start(t, filepath.Join(st.dir, "dev-s3"))
	st.s3c = devs3test.Client(s3srv.URL)
	st.agentDir = filepath.Join(st.dir, "agents")
	require.NoError(t, os.MkdirAll(st.agentDir, 0o700))
	t.Cleanup(func() { killRecordedAgents(st.agentDir) })
	st.termFile = filepath.Join(st.dir, "termination.json")
	agentCmd := "ip netns exec " + st.agentHost.Name + " " + filepath.Join(st.bin, "nstance-agent")
	cfg := vipConfig(st.vip, agentCmd, st.agentDir)
	if !agent {
		cfg = strings.Replace(cfg, `"groups": {"default": {"g": {"template": "svc", "size": 1}}}`, `"groups": {}`, 1)
	}
	_, err = st.s3c.PutObject(context.Background(), putInput("config/"+shard+".jsonc", []byte(cfg)))
	require.NoError(t, err)

	// The servers are killed when the test ends; logs are dir/{id}.log.
	procs := proctest.NewGroup(t, proctest.Options{LogDir: st.dir, TailLines: 60})
	for i, h := range st.hosts {
		ln, err := n.Hub.Listen(net.JoinHostPort(n.Hub.Addr.String(), strconv.Itoa(8980+i)))
		require.NoError(t, err)
		s := &vipServer{id: fmt.Sprintf("srv-%d", i+1), host: h, proxy: startProxyOn(t, ln, strings.TrimPrefix(s3srv.URL, "http://"))}
		s.proc, err = procs.Start(s.id, ipCmd, append(proctest.S3Env("http://"+ln.Addr().String()),
			"NSTANCE_ENCRYPTION_KEY="+encryptionKey,
			// Inherited by the agent the process provider starts.
			"NSTANCE_METRICS_INTERVAL=200ms", "NSTANCE_RECONNECT_MIN=50ms", "NSTANCE_RECONNECT_MAX=500ms",
			"NSTANCE_TERMINATION_FILE="+st.termFile,
		), "netns", "exec", h.Name, filepath.Join(st.bin, "nstance-server"), "--id", s.id, "--shard", shard, "--bucket", "dev")
		require.NoError(t, err)
		st.servers[h] = s
	}
	return st
}

// holders lists the server namespaces whose eth0 carries the VIP.
func (st *vipStack) holders() []*netnstest.Host {
	var out []*netnstest.Host
	for _, h := range st.hosts {
		if ok, err := h.HasAddr("eth0", st.vip.Addr()); err == nil && ok {
			out = append(out, h)
		}
	}
	return out
}

// leader waits until exactly one server holds the VIP and returns it and
// the other one.
func (st *vipStack) leader() (leader, standby *netnstest.Host) {
	st.t.Helper()
	require.Eventually(st.t, func() bool {
		hs := st.holders()
		if len(hs) == 1 {
			leader = hs[0]
		}
		return len(hs) == 1
	}, 60*time.Second, 20*time.Millisecond, "one server holds the VIP")
	standby = st.hosts[0]
	if standby == leader {
		standby = st.hosts[1]
	}
	return leader, standby
}

// Two servers in two network namespaces on one bridge hold the shard's VIP
// in turn; an agent in a third namespace dials only the VIP. The leader is
// killed with SIGKILL: the address leaves its namespace (the kernel
// lifetime ends with its lease), the standby adds it and announces it with
// gratuitous ARP, and the agent reconnects to the same address and reports
// to the new leader (its spot termination notice lands in the instance
// record, which only a leader receiving its reports writes).
func TestVIPMovesToStandbyWhenLeaderKilled(t *testing.T) {
	st := startVIPStack(t, true)
	vip, s3c, agentDir, agentHost, servers, termFile := st.vip, st.s3c, st.agentDir, st.agentHost, st.servers, st.termFile
	holders := st.holders
	leader, standby := st.leader()
	// The exec'd `ip netns exec` became the server itself: killing the
	// PID kills the server.
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", servers[leader].proc.Pid()))
	require.NoError(t, err)
	require.Equal(t, "nstance-server", strings.TrimSpace(string(comm)))

	// The agent registers and reports through the VIP: its first report
	// is persisted in its instance record.
	var instID string
	require.Eventually(t, func() bool {
		ids, err := instanceIDs(s3c)
		if err != nil || len(ids) != 1 {
			return false
		}
		instID = ids[0]
		rec, err := instanceRecord(s3c, instID)
		return err == nil && rec["last_health_at"] != nil
	}, 90*time.Second, 100*time.Millisecond, "the agent reports to the leader through the VIP")
	agentLog := filepath.Join(agentDir, instID, "agent.log")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- agent log, last lines:\n%s", proctest.Tail(agentLog, 60))
			out, _ := exec.Command("ip", "-n", agentHost.Name, "neigh").CombinedOutput()
			t.Logf("agent neighbours:\n%s", out)
		}
	})
	// The agent only knows the VIP.
	b, err := os.ReadFile(filepath.Join(agentDir, instID, "process.json"))
	require.NoError(t, err)
	var rec struct {
		PID int `json:"pid"`
	}
	require.NoError(t, json.Unmarshal(b, &rec))
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", rec.PID))
	require.NoError(t, err)
	require.Contains(t, strings.Split(string(environ), "\x00"), "NSTANCE_AGENT_ADDR="+net.JoinHostPort(vip.Addr().String(), "8994"))

	killedAt := time.Now()
	servers[leader].proc.Kill()
	require.Eventually(t, func() bool {
		hs := holders()
		return len(hs) == 1 && hs[0] == standby
	}, 60*time.Second, 20*time.Millisecond, "the VIP moves to the standby, and only there")
	moved := time.Since(killedAt)
	// The agent reconnects to the same address and reports to the new
	// leader: a spot notice it reads from now on reaches the instance
	// record, which only a leader receiving its reports writes (the old
	// one is dead). The server sends no files again: the agent's hash
	// matches.
	require.NoError(t, os.WriteFile(termFile, []byte(`{"kind": "spot", "message": "vip test"}`), 0o600))
	require.Eventually(t, func() bool {
		rec, err := instanceRecord(s3c, instID)
		return err == nil && rec["termination_notice"] == "spot"
	}, 60*time.Second, 50*time.Millisecond, "the agent reconnects through the VIP and its report reaches the new leader")
	reported := time.Since(killedAt)
	// The new leader replaces the announced instance: a replacement is
	// created through it.
	require.Eventually(t, func() bool {
		ids, err := instanceIDs(s3c)
		return err == nil && slices.ContainsFunc(ids, func(id string) bool { return id != instID })
	}, 60*time.Second, 50*time.Millisecond, "the spot-noticed instance is replaced")
	require.Equal(t, []*netnstest.Host{standby}, holders(), "still only the new leader holds the VIP")
	t.Logf("leader %s killed: VIP on %s after %s, the agent's report reached it after %s", servers[leader].id, servers[standby].id,
		moved.Round(time.Millisecond), reported.Round(time.Millisecond))
}

func instanceIDs(c *s3.Client) ([]string, error) {
	out, err := c.ListObjectsV2(context.Background(), &s3.ListObjectsV2Input{
		Bucket: aws.String(devs3test.Bucket), Prefix: aws.String("shard/" + shard + "/instances/"),
	})
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, o := range out.Contents {
		ids = append(ids, strings.TrimSuffix(filepath.Base(aws.ToString(o.Key)), ".json"))
	}
	return ids, nil
}

func instanceRecord(c *s3.Client, id string) (map[string]any, error) {
	out, err := c.GetObject(context.Background(), &s3.GetObjectInput{
		Bucket: aws.String(devs3test.Bucket), Key: aws.String("shard/" + shard + "/instances/" + id + ".json"),
	})
	if err != nil {
		return nil, err
	}
	defer func() { _ = out.Body.Close() }()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	return m, json.Unmarshal(b, &m)
}

// The leader loses its storage (its proxy drops everything) while it keeps
// running: its lease lapses, and it gives the VIP up before the standby
// takes it, so the address is never on both namespaces; healed, the old
// leader stays a standby without it.
func TestVIPLeavesLeaderPartitionedFromStorage(t *testing.T) {
	st := startVIPStack(t, false)
	leader, standby := st.leader()
	stop := make(chan struct{})
	both := make(chan string, 1)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if hs := st.holders(); len(hs) > 1 {
				select {
				case both <- time.Now().Format(time.RFC3339Nano):
				default:
				}
			}
		}
	}()
	cut := time.Now()
	st.servers[leader].proxy.Cut()
	require.Eventually(t, func() bool {
		hs := st.holders()
		return len(hs) == 1 && hs[0] == standby
	}, 60*time.Second, 20*time.Millisecond, "the VIP moves to the standby")
	moved := time.Since(cut)
	require.False(t, st.servers[leader].proc.Exited(), "the partitioned leader is still running")
	st.servers[leader].proxy.Heal()
	// The old leader rejoins as a standby and never takes the address.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		require.Equal(t, []*netnstest.Host{standby}, st.holders())
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	<-sampled
	select {
	case at := <-both:
		t.Fatalf("both servers held the VIP at %s", at)
	default:
	}
	t.Logf("leader %s cut off from storage: VIP only on %s after %s", st.servers[leader].id, st.servers[standby].id, moved.Round(time.Millisecond))
}
