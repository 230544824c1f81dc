package shardcmd_test

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/shardtest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// proxy forwards loopback TCP connections to a target; cut drops every open
// connection and refuses new ones until allow, as a shard restart would.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	refuse bool
}

func startProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); p.serve(c) }()
		}
	}()
	t.Cleanup(func() { ln.Close(); p.cut(true); wg.Wait() })
	return p
}

func (p *proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.refuse {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *proxy) serve(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c, up) {
		c.Close()
		up.Close()
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

func (p *proxy) cut(refuse bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = refuse
	for c := range p.conns {
		c.Close()
	}
}

func (p *proxy) allow() {
	p.mu.Lock()
	p.refuse = false
	p.mu.Unlock()
}

// A watch survives the shard going away: it reconnects and prints what
// changed meanwhile, then later changes. Changes go straight through the
// Operator API and the two watches run one after the other: only one
// nstance-admin runs at a time in this process (urfave/cli keeps global
// help state).
func TestWatchesReconnect(t *testing.T) {
	isolate(t)
	sh := shardtest.Start(t, shardtest.Options{ShardID: "dev-1"})
	cr := writeCreds(t, sh, "default")
	px := startProxy(t, sh.OperatorAddr)
	args := func(cmd ...string) []string {
		return append(cmd, "--servers", "dev-1="+px.ln.Addr().String(), "--ca-cert", cr.ca, "--cert", cr.cert, "--key", cr.key)
	}
	oc := sh.Client(t, "default")
	ctx := context.Background()
	upsert := func(id string, size uint32) {
		t.Helper()
		_, err := oc.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: id, Template: "worker", Size: size}})
		require.NoError(t, err)
	}
	logged := func(msg string) func(string) bool {
		return func(s string) bool { return strings.Contains(s, `"msg":"`+msg+`"`) }
	}

	t.Run("groups", func(t *testing.T) {
		upsert("db", 1)
		upsert("gone", 0)
		waitGroup(t, sh, "db", 1)
		groups, logs, stop := watchLogs(t, args("group", "list", "--watch", "-o", "json")...)
		waitFor(t, groups, hasGroupEvent(t, "ADDED", "gone", 0), "the initial group list")

		px.cut(true)
		waitFor(t, logs, logged("group watch ended; reconnecting"), "the watch noticing the outage")
		upsert("db", 2)
		upsert("late", 0)
		_, err := oc.DeleteGroup(ctx, &nstancev1.DeleteGroupRequest{GroupId: "gone"})
		require.NoError(t, err)
		waitGroup(t, sh, "db", 2)
		px.allow()

		waitFor(t, groups, hasGroupEvent(t, "MODIFIED", "db", 2), "the change made while disconnected")
		waitFor(t, groups, hasGroupEvent(t, "ADDED", "late", 0), "the group created while disconnected")
		waitFor(t, groups, hasGroupEvent(t, "DELETED", "gone", -1), "the group deleted while disconnected")
		require.Contains(t, logs.String(), `"msg":"group watch reconnected"`)
		upsert("db", 3)
		waitFor(t, groups, hasGroupEvent(t, "MODIFIED", "db", 3), "a change after the reconnect")
		require.NoError(t, stop())
	})

	t.Run("instances", func(t *testing.T) {
		added := func(n int) func(string) bool {
			return func(s string) bool {
				ids := map[any]bool{}
				for _, ev := range events(t, s) {
					if ev.Type == "ADDED" {
						ids[ev.Object["instance_id"]] = true
					}
				}
				return len(ids) == n
			}
		}
		insts, logs, stop := watchLogs(t, args("instance", "list", "--watch", "--interval", "50ms", "-o", "json")...)
		waitFor(t, insts, added(3), "the initial instance list")
		px.cut(true)
		waitFor(t, logs, logged("listing instances failed; retrying"), "the watch noticing the outage")
		upsert("db", 4)
		waitGroup(t, sh, "db", 4)
		px.allow()
		waitFor(t, insts, added(4), "the instance created while disconnected")
		waitFor(t, logs, logged("listing instances works again"), "the recovery logged")
		require.NoError(t, stop())
	})
}
