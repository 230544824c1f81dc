package status_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nstance-dev/nstance/internal/admin/shard"
	"github.com/nstance-dev/nstance/internal/admin/status"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// stream reads a server-sent event stream and hands each snapshot over.
type stream struct {
	t    *testing.T
	snap chan status.Snapshot
}

func follow(t *testing.T, url string) *stream {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	s := &stream{t: t, snap: make(chan status.Snapshot, 64)}
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		event := ""
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: ") && event == "snapshot":
				var snap status.Snapshot
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &snap); err != nil {
					t.Errorf("snapshot event is not JSON: %v", err)
					return
				}
				select {
				case s.snap <- snap:
				case <-ctx.Done():
					return
				}
			case line == "":
				event = ""
			}
		}
	}()
	return s
}

// until waits for a snapshot event for which cond holds; every event
// before it must be a consistent snapshot too.
func (s *stream) until(what string, cond func(status.Snapshot) bool) status.Snapshot {
	s.t.Helper()
	timeout := time.After(30 * time.Second)
	var last status.Snapshot
	for {
		select {
		case snap := <-s.snap:
			if cond(snap) {
				return snap
			}
			last = snap
		case <-timeout:
			b, _ := json.MarshalIndent(last, "", "  ")
			s.t.Fatalf("no snapshot event with %s; last:\n%s", what, b)
		}
	}
}

func shardOf(s status.Snapshot, name string) status.ShardStatus {
	for _, sh := range s.Shards {
		if sh.Name == name {
			return sh
		}
	}
	return status.ShardStatus{}
}

func groupOf(sh status.ShardStatus, id string) (status.GroupRow, bool) {
	for _, g := range sh.Groups {
		if g.ID == id {
			return g, true
		}
	}
	return status.GroupRow{}, false
}

func running(sh status.ShardStatus, group string) int {
	n := 0
	for _, in := range sh.Instances {
		if in.Group == group && in.State == "running" {
			n++
		}
	}
	return n
}

// TestPageFollowsTheShards: with a refresh interval far beyond the test,
// the page's event stream still follows a scale-up and a scale-down (the
// watches drive it), and shows a shard that went away as unreachable.
func TestPageFollowsTheShards(t *testing.T) {
	a := shardtest.Start(t, shardtest.Options{ShardID: "dev-1"})
	b := shardtest.Start(t, shardtest.Options{ShardID: "dev-2", CA: a.CA})
	tc, err := a.ClientTLSAs("default", pki.RoleAdmin)
	require.NoError(t, err)
	addrs := map[string]string{"dev-1": a.OperatorAddr, "dev-2": b.OperatorAddr}
	set, err := shard.Dial(addrs, tc)
	require.NoError(t, err)
	t.Cleanup(set.Close)

	col, err := status.NewCollector(status.Options{Shards: set, Addresses: addrs, Refresh: time.Hour, Log: testr.New(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- col.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	srv := httptest.NewServer(status.Handler(col, 50*time.Millisecond))
	t.Cleanup(srv.Close)

	page, err := http.Get(srv.URL + "/")
	require.NoError(t, err)
	page.Body.Close()
	require.Equal(t, http.StatusOK, page.StatusCode)
	require.Contains(t, page.Header.Get("Content-Type"), "text/html")

	ev := follow(t, srv.URL+"/v1/status/events")
	ev.until("both shards reachable", func(s status.Snapshot) bool {
		return len(s.Shards) == 2 && shardOf(s, "dev-1").Reachable && shardOf(s, "dev-2").Reachable
	})

	cl, err := set.Client("dev-1")
	require.NoError(t, err)
	_, err = cl.UpsertGroup(context.Background(), &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{
		GroupId: "web", Template: "worker", Size: 3, DrainTimeout: durationpb.New(time.Second)}})
	require.NoError(t, err)
	ev.until("group web 3/3 with three running instances", func(s status.Snapshot) bool {
		g, ok := groupOf(shardOf(s, "dev-1"), "web")
		return ok && g.Desired == 3 && g.Ready == 3 && running(shardOf(s, "dev-1"), "web") == 3
	})

	_, err = shard.Scale(context.Background(), cl, "web", 1)
	require.NoError(t, err)
	snap := ev.until("group web scaled to 1 with one instance left", func(s status.Snapshot) bool {
		sh := shardOf(s, "dev-1")
		g, ok := groupOf(sh, "web")
		return ok && g.Desired == 1 && g.Actual == 1 && len(sh.Instances) == 1
	})
	require.Equal(t, "running", shardOf(snap, "dev-1").Instances[0].State)

	// The JSON endpoint serves the same state.
	resp, err := http.Get(srv.URL + "/v1/status")
	require.NoError(t, err)
	var got status.Snapshot
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	resp.Body.Close()
	g, ok := groupOf(shardOf(got, "dev-1"), "web")
	require.True(t, ok)
	require.Equal(t, uint32(1), g.Desired)

	b.Stop()
	gone := ev.until("dev-2 unreachable", func(s status.Snapshot) bool { return !shardOf(s, "dev-2").Reachable })
	require.NotEmpty(t, shardOf(gone, "dev-2").Error)
	require.True(t, shardOf(gone, "dev-1").Reachable, "the other shard stays reachable")
}
