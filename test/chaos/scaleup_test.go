package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// processConfig is leaseConfig with the process provider: each instance is
// a `sleep` child recorded in stateDir, which a restarted or new leader
// re-adopts.
func processConfig(stateDir string) string {
	opts, _ := json.Marshal(map[string]string{"command": "sleep 3600", "state_dir": stateDir, "node_dir": "-", "work_dir": stateDir})
	return fmt.Sprintf(`{
  "cluster": {
    "id": %q,
    "leader_election": {"lease_duration": "3s", "renew_interval": "1s", "renew_deadline": "2s", "max_clock_skew": "500ms", "retry_interval": "200ms"}
  },
  "shard": {
    "id": %q,
    "infra": {"provider": "process", "region": "dev", "zone": "deva", "options": %s},
    "bind": {
      "health_addr": "0.0.0.0:8990", "election_addr": "0.0.0.0:8991", "registration_addr": "0.0.0.0:8992",
      "operator_addr": "0.0.0.0:8993", "agent_addr": "0.0.0.0:8994"
    },
    "agent_startup_grace": "1h",
    "default_drain_timeout": "1m",
    "subnet_pools": {"default": {"subnets": ["dev-subnet-a"]}}
  },
  "templates": {
    "w": {"kind": "worker", "arch": "amd64", "instance_type": "dev.small", "subnet_pool": "default"}
  }
}`, clusterID, shard, opts)
}

// fleetState is what exists after a scale-up: instance records in storage
// and live instance processes (found by the marker in their environment,
// so a process started but never recorded is counted too).
type fleetState struct {
	records   []string
	processes []string // instance ids of live processes
}

func (s *stack) instanceRecords(ctx context.Context) ([]string, error) {
	out, err := devs3test.Client(s.s3URL).ListObjectsV2(ctx, &s3.ListObjectsV2Input{
		Bucket: aws.String(devs3test.Bucket), Prefix: aws.String("shard/" + shard + "/instances/"),
	})
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, o := range out.Contents {
		ids = append(ids, strings.TrimSuffix(filepath.Base(aws.ToString(o.Key)), ".json"))
	}
	slices.Sort(ids)
	return ids, nil
}

// markedProcesses returns the instance id of every live process whose
// environment carries marker (NSTANCE_INSTANCE_ID from the provider).
func markedProcesses(marker string) (map[int]string, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		vars := strings.Split(string(env), "\x00")
		if !slices.Contains(vars, marker) {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && strings.Contains(string(stat), ") Z ") {
			continue // a zombie is not a running instance
		}
		if comm, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm")); strings.TrimSpace(string(comm)) != "sleep" {
			continue // a server carries the marker too
		}
		id := "?"
		for _, v := range vars {
			if after, ok := strings.CutPrefix(v, "NSTANCE_INSTANCE_ID="); ok {
				id = after
			}
		}
		out[pid] = id
	}
	return out, nil
}

func (s *stack) fleet(ctx context.Context, marker string) (fleetState, error) {
	recs, err := s.instanceRecords(ctx)
	if err != nil {
		return fleetState{}, err
	}
	procs, err := markedProcesses(marker)
	if err != nil {
		return fleetState{}, err
	}
	var ids []string
	for _, id := range procs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return fleetState{records: recs, processes: ids}, nil
}

// The leader is killed with SIGKILL in the middle of a scale-up; the
// standby takes over and finishes it. Every round ends with exactly the
// group's size in instance records and in running instance processes, the
// same ids on both sides: no duplicate and no lost instance
// (CHAOS_SCALE_ROUNDS rounds of CHAOS_SCALE_STEP instances).
func TestLeaderKilledDuringScaleUp(t *testing.T) {
	rounds := envInt(t, "CHAOS_SCALE_ROUNDS", 3)
	step := envInt(t, "CHAOS_SCALE_STEP", 20)
	dir := t.TempDir()
	// The whole temp path: its last element ("001") is the same in every
	// test, and another run's processes (a parallel package, another
	// checkout) must never count as this run's.
	marker := "NSTANCE_CHAOS_RUN=" + dir
	st := newStackWith(t, 2, processConfig(filepath.Join(dir, "instances")), []string{marker})
	ctx := context.Background()
	t.Cleanup(func() {
		// Stop the instance processes this test's servers started (found by
		// the run's marker), by PID and process group.
		procs, _ := markedProcesses(marker)
		for pid := range procs {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	clients := st.operatorClients()
	p := startPoller(clients)
	defer p.Stop()

	size := 0
	for round := 1; round <= rounds; round++ {
		leader := st.leader(p, time.Now(), 60*time.Second)
		standby := st.other(leader)
		size += step
		_, err := clients[leader].UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "g", Template: "w", Size: uint32(size)}})
		require.NoError(t, err, "round %d: UpsertGroup", round)
		// Kill the leader once about half of the new instances exist.
		require.Eventually(t, func() bool {
			recs, err := st.instanceRecords(ctx)
			return err == nil && len(recs) >= size-step/2
		}, 60*time.Second, 5*time.Millisecond, "round %d: the scale-up starts", round)
		killedAt := time.Now()
		st.kill9(leader)
		recs, err := st.instanceRecords(ctx)
		require.NoError(t, err)
		atKill := len(recs)
		require.Eventually(t, func() bool { return p.servedSince(standby, killedAt) }, 60*time.Second, 20*time.Millisecond, "round %d: the standby takes over", round)
		var last fleetState
		var lastErr error
		converged := func() bool {
			last, lastErr = st.fleet(ctx, marker)
			return lastErr == nil && len(last.records) == size && slices.Equal(last.records, last.processes)
		}
		deadline := time.Now().Add(90 * time.Second)
		for !converged() && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		require.NoError(t, lastErr)
		require.True(t, converged(), "round %d: want %d records and processes with the same ids; have %d records, %d processes\nrecords   %v\nprocesses %v",
			round, size, len(last.records), len(last.processes), last.records, last.processes)
		// Stable: nothing more appears once the leader has converged.
		resp, err := clients[standby].ListGroups(ctx, &nstancev1.ListGroupsRequest{})
		require.NoError(t, err)
		require.Len(t, resp.Groups, 1)
		require.Eventually(t, func() bool {
			resp, err := clients[standby].ListGroups(ctx, &nstancev1.ListGroupsRequest{})
			return err == nil && resp.Groups[0].ActualSize == uint32(size)
		}, 30*time.Second, 100*time.Millisecond)
		f, err := st.fleet(ctx, marker)
		require.NoError(t, err)
		require.Equal(t, f.records, f.processes, "round %d", round)
		require.Len(t, f.records, size, "round %d: no duplicate, no lost instance", round)
		t.Logf("round %d: leader %s killed with %d of %d records written; %s finished it: %d records, %d processes",
			round, leader.id, atKill, size, standby.id, len(f.records), len(f.processes))
		st.launch(leader) // back as the standby
	}
}
