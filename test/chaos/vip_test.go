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
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/testing/netnstest"
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

// vipServer is one nstance-server running inside its own namespace.
type vipServer struct {
	id   string
	host *netnstest.Host
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// Two servers in two network namespaces on one bridge hold the shard's VIP
// in turn; an agent in a third namespace dials only the VIP. The leader is
// killed with SIGKILL: the address leaves its namespace (the kernel
// lifetime ends with its lease), the standby adds it and announces it with
// gratuitous ARP, and the agent reconnects to the same address and reports
// to the new leader (its spot termination notice lands in the instance
// record, which only a leader receiving its reports writes).
func TestVIPMovesToStandbyWhenLeaderKilled(t *testing.T) {
	netnstest.RequireRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipping: the ip command (iproute2) is needed to start processes inside the namespaces")
	}
	bin := binaries(t)
	dir := t.TempDir()
	n := netnstest.New(t, netip.MustParsePrefix("10.78.0.0/24"))
	hosts := []*netnstest.Host{n.AddHost("s1"), n.AddHost("s2")}
	agentHost := n.AddHost("ag")
	vip := netip.MustParsePrefix("10.78.0.100/24")

	// dev-s3 runs in this process; servers reach it through a proxy
	// listening on the hub's bridge address.
	s3srv := devs3test.Start(t, filepath.Join(dir, "dev-s3"))
	ln, err := n.Hub.Listen(net.JoinHostPort(n.Hub.Addr.String(), "8989"))
	require.NoError(t, err)
	startProxyOn(t, ln, strings.TrimPrefix(s3srv.URL, "http://"))
	s3c := devs3test.Client(s3srv.URL)

	agentDir := filepath.Join(dir, "agents")
	require.NoError(t, os.MkdirAll(agentDir, 0o700))
	t.Cleanup(func() { killRecordedAgents(agentDir) })
	termFile := filepath.Join(dir, "termination.json")
	agentCmd := "ip netns exec " + agentHost.Name + " " + filepath.Join(bin, "nstance-agent")
	_, err = s3c.PutObject(context.Background(), putInput("config/"+shard+".jsonc", []byte(vipConfig(vip, agentCmd, agentDir))))
	require.NoError(t, err)

	env := append(os.Environ(),
		"AWS_ACCESS_KEY_ID=dev", "AWS_SECRET_ACCESS_KEY=dev", "AWS_REGION=us-east-1",
		"AWS_ENDPOINT_URL=http://"+net.JoinHostPort(n.Hub.Addr.String(), "8989"), "AWS_S3_USE_PATH_STYLE=true",
		"NSTANCE_ENCRYPTION_KEY="+encryptionKey,
		// Inherited by the agent the process provider starts.
		"NSTANCE_METRICS_INTERVAL=200ms", "NSTANCE_RECONNECT_MIN=50ms", "NSTANCE_RECONNECT_MAX=500ms",
		"NSTANCE_TERMINATION_FILE="+termFile,
	)
	servers := map[*netnstest.Host]*vipServer{}
	for i, h := range hosts {
		s := &vipServer{id: fmt.Sprintf("srv-%d", i+1), host: h, log: filepath.Join(dir, fmt.Sprintf("srv-%d.log", i+1)), done: make(chan struct{})}
		f, err := os.Create(s.log)
		require.NoError(t, err)
		s.cmd = exec.Command("ip", "netns", "exec", h.Name, filepath.Join(bin, "nstance-server"),
			"--id", s.id, "--shard", shard, "--bucket", "dev")
		s.cmd.Env = env
		s.cmd.Stdout, s.cmd.Stderr = f, f
		s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		require.NoError(t, s.cmd.Start())
		go func() { _ = s.cmd.Wait(); _ = f.Close(); close(s.done) }()
		t.Cleanup(func() {
			_ = s.cmd.Process.Kill()
			<-s.done
			if t.Failed() {
				if b, err := os.ReadFile(s.log); err == nil {
					t.Logf("--- %s log (last 6000 bytes) ---\n%s", s.id, tail(b, 6000))
				}
			}
		})
		servers[h] = s
	}
	holders := func() []*netnstest.Host {
		var out []*netnstest.Host
		for _, h := range hosts {
			if ok, err := h.HasAddr("eth0", vip.Addr()); err == nil && ok {
				out = append(out, h)
			}
		}
		return out
	}
	var leader *netnstest.Host
	require.Eventually(t, func() bool {
		hs := holders()
		if len(hs) == 1 {
			leader = hs[0]
		}
		return len(hs) == 1
	}, 60*time.Second, 20*time.Millisecond, "one server holds the VIP")
	standby := hosts[0]
	if standby == leader {
		standby = hosts[1]
	}
	// The exec'd `ip netns exec` became the server itself: killing the
	// PID kills the server.
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", servers[leader].cmd.Process.Pid))
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
			if b, err := os.ReadFile(agentLog); err == nil {
				t.Logf("--- agent log (last 6000 bytes) ---\n%s", tail(b, 6000))
			}
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
	require.NoError(t, servers[leader].cmd.Process.Kill())
	<-servers[leader].done
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
