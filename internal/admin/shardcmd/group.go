package shardcmd

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nstance-dev/nstance/internal/admin/output"
	"github.com/nstance-dev/nstance/internal/admin/shard"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

var groupHeader = []string{"SHARD", "GROUP", "TEMPLATE", "SIZE", "ACTUAL", "READY", "STATIC"}

func groupRow(shardName string, g *nstancev1.GroupStatus) []string {
	return []string{shardName, g.GetSpec().GetGroupId(), g.GetSpec().GetTemplate(), strconv.FormatUint(uint64(g.GetSpec().GetSize()), 10),
		strconv.FormatUint(uint64(g.GetActualSize()), 10), strconv.FormatUint(uint64(g.GetReadyCount()), 10), strconv.FormatBool(g.GetStatic())}
}

func groupID(g *nstancev1.GroupStatus) string { return g.GetSpec().GetGroupId() }

func watchFlag() cli.Flag {
	return &cli.BoolFlag{Name: "watch", Aliases: []string{"w"}, Usage: "after the list, print every change until interrupted (Ctrl+C)"}
}

func parseVars(vs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, v := range vs {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--var %q: want key=value", v)
		}
		out[k] = val
	}
	return out, nil
}

func groupCommand() *cli.Command {
	return &cli.Command{
		Name:  "group",
		Usage: "groups of instances on shard servers",
		Subcommands: []*cli.Command{
			{
				Name: "list", Usage: "list the groups of your tenant", Flags: flags(true, watchFlag()),
				Action: func(c *cli.Context) error {
					return run(c, true, func(s *session) error {
						if c.Bool("watch") {
							return watchGroups(s)
						}
						return listGroups(s)
					})
				},
			},
			{
				Name: "status", Usage: "show one group with its instances' provider ids", ArgsUsage: "GROUP", Flags: flags(true),
				Action: func(c *cli.Context) error {
					id, err := oneArg(c, "GROUP")
					if err != nil {
						return err
					}
					return run(c, true, func(s *session) error {
						var it items
						first := true
						err := s.forEach(func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error {
							g, err := shard.FindGroup(ctx, oc, id)
							if err != nil {
								return err
							}
							if g == nil {
								return fmt.Errorf("group %q not found", id)
							}
							if s.p.Machine() {
								return it.add(n, g)
							}
							if !first {
								fmt.Fprintln(s.p.W)
							}
							first = false
							return printGroup(s.p, n, g)
						})
						if s.p.Machine() {
							return it.print(s.p, err)
						}
						return err
					})
				},
			},
			{
				Name: "create", Usage: "create (or replace) a dynamic group", ArgsUsage: "GROUP",
				Flags: flags(true,
					&cli.StringFlag{Name: "template", Required: true, Usage: "instance template from the server config"},
					&cli.IntFlag{Name: "size", Value: 1, Usage: "number of instances"},
					&cli.StringFlag{Name: "instance-type"},
					&cli.StringFlag{Name: "subnet-pool"},
					&cli.StringSliceFlag{Name: "var", Usage: "template variable key=value (repeatable)"},
					&cli.DurationFlag{Name: "drain-timeout", Usage: "drain acknowledgement timeout (default: the shard's; 0 disables the drain)"},
				),
				Action: func(c *cli.Context) error {
					id, err := oneArg(c, "GROUP")
					if err != nil {
						return err
					}
					if c.Int("size") < 0 {
						return errors.New("--size must not be negative")
					}
					vars, err := parseVars(c.StringSlice("var"))
					if err != nil {
						return err
					}
					spec := &nstancev1.GroupSpec{GroupId: id, Template: c.String("template"), Size: uint32(c.Int("size")),
						InstanceType: c.String("instance-type"), SubnetPool: c.String("subnet-pool"), Vars: vars}
					if c.IsSet("drain-timeout") {
						spec.DrainTimeout = durationpb.New(c.Duration("drain-timeout"))
					}
					return run(c, true, func(s *session) error {
						var it items
						err := s.forEach(func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error {
							resp, err := oc.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: spec})
							if err != nil {
								return err
							}
							if s.p.Machine() {
								return it.add(n, resp)
							}
							verb := "updated"
							if resp.GetCreated() {
								verb = "created"
							}
							_, err = fmt.Fprintf(s.p.W, "%s: group %s %s (size %d)\n", n, id, verb, spec.GetSize())
							return err
						})
						if s.p.Machine() {
							return it.print(s.p, err)
						}
						return err
					})
				},
			},
			{
				Name: "scale", Usage: "change the size of a dynamic group", ArgsUsage: "GROUP",
				Flags: flags(true, &cli.IntFlag{Name: "size", Required: true, Usage: "new number of instances"}),
				Action: func(c *cli.Context) error {
					id, err := oneArg(c, "GROUP")
					if err != nil {
						return err
					}
					if c.Int("size") < 0 {
						return errors.New("--size must not be negative")
					}
					return run(c, true, func(s *session) error {
						var it items
						err := s.forEach(func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error {
							g, err := shard.Scale(ctx, oc, id, uint32(c.Int("size")))
							if err != nil {
								return err
							}
							if s.p.Machine() {
								return it.add(n, g)
							}
							_, err = fmt.Fprintf(s.p.W, "%s: group %s scaled to %d (currently %d)\n", n, id, g.GetSpec().GetSize(), g.GetActualSize())
							return err
						})
						if s.p.Machine() {
							return it.print(s.p, err)
						}
						return err
					})
				},
			},
			{
				Name: "delete", Usage: "delete a dynamic group; its instances are drained and removed", ArgsUsage: "GROUP", Flags: flags(true),
				Action: func(c *cli.Context) error {
					id, err := oneArg(c, "GROUP")
					if err != nil {
						return err
					}
					return run(c, true, func(s *session) error {
						var it items
						err := s.forEach(func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error {
							resp, err := oc.DeleteGroup(ctx, &nstancev1.DeleteGroupRequest{GroupId: id})
							if err != nil {
								return err
							}
							if s.p.Machine() {
								return it.add(n, resp)
							}
							_, err = fmt.Fprintf(s.p.W, "%s: group %s deleted; %d instances will be drained and deleted\n", n, id, resp.GetInstancesToDelete())
							return err
						})
						if s.p.Machine() {
							return it.print(s.p, err)
						}
						return err
					})
				},
			},
		},
	}
}

func printGroup(p *output.Printer, shardName string, g *nstancev1.GroupStatus) error {
	sp := g.GetSpec()
	kv := []string{"shard", shardName, "group", sp.GetGroupId(), "template", sp.GetTemplate(),
		"size", strconv.FormatUint(uint64(sp.GetSize()), 10), "actual", strconv.FormatUint(uint64(g.GetActualSize()), 10),
		"ready", strconv.FormatUint(uint64(g.GetReadyCount()), 10), "static", strconv.FormatBool(g.GetStatic()), "etag", g.GetEtag()}
	vars := make([]string, 0, len(sp.GetVars()))
	for k, v := range sp.GetVars() {
		vars = append(vars, k+"="+v)
	}
	sort.Strings(vars)
	if len(vars) > 0 {
		kv = append(kv, "vars", strings.Join(vars, ","))
	}
	if err := p.Fields(kv...); err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("provider ids:\n")
	for _, id := range g.GetProviderIds() {
		fmt.Fprintf(&b, "  %s\n", id)
	}
	_, err := fmt.Fprint(p.W, b.String())
	return err
}

func listGroups(s *session) error {
	rows := output.Rows{Header: groupHeader}
	var it items
	err := s.forEach(func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error {
		resp, err := oc.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
		if err != nil {
			return err
		}
		for _, g := range resp.GetGroups() {
			rows.Add(groupRow(n, g)...)
			if err := it.add(n, g); err != nil {
				return err
			}
		}
		return nil
	})
	if s.p.Machine() {
		return it.print(s.p, err)
	}
	return errors.Join(err, s.p.Table(rows))
}

// groupUpdate is what a shard's watcher hands to the printing loop: an
// event, a complete list after a reconnect, or the error that ended it.
type groupUpdate struct {
	shard string
	ev    *nstancev1.GroupEvent
	list  []*nstancev1.GroupStatus
	err   error
}

// connectGroups opens a WatchGroups stream, waits until the server has
// subscribed it (the response header), then lists the groups: every change
// after the list arrives on the stream.
func connectGroups(ctx context.Context, s *session, n string) (*groupStream, []*nstancev1.GroupStatus, error) {
	oc, err := s.set.Client(n)
	if err != nil {
		return nil, nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	st, err := oc.WatchGroups(sctx, &nstancev1.WatchGroupsRequest{})
	if err != nil {
		cancel()
		return nil, nil, err
	}
	timer := time.AfterFunc(s.timeout, cancel)
	_, err = st.Header()
	if !timer.Stop() {
		cancel()
		return nil, nil, fmt.Errorf("no answer from the watch within %s", s.timeout)
	}
	if err != nil {
		cancel()
		return nil, nil, err
	}
	var list []*nstancev1.GroupStatus
	err = s.call(func(ctx context.Context) error {
		resp, err := oc.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
		list = resp.GetGroups()
		return err
	})
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return &groupStream{ServerStreamingClient: st, cancel: cancel}, list, nil
}

// groupStream is a watch stream with the function that ends it.
type groupStream struct {
	grpc.ServerStreamingClient[nstancev1.GroupEvent]
	cancel context.CancelFunc
}

// pumpGroups forwards a shard's events and reconnects after a retryable end.
func pumpGroups(ctx context.Context, s *session, n string, st *groupStream, out chan<- groupUpdate) {
	defer func() { st.cancel() }()
	send := func(u groupUpdate) bool {
		select {
		case out <- u:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for {
		ev, err := st.Recv()
		if err != nil {
			st.cancel()
		}
		if err == nil {
			if !send(groupUpdate{shard: n, ev: ev}) {
				return
			}
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if !retryable(err) {
			send(groupUpdate{shard: n, err: err})
			return
		}
		s.log.Info("group watch ended; reconnecting", "shard", n, "reason", err.Error())
		for attempt := 1; ; attempt++ {
			if !sleep(ctx, backoff(attempt)) {
				return
			}
			nst, list, cerr := connectGroups(ctx, s, n)
			if err = cerr; err == nil {
				st = nst
				s.log.Info("group watch reconnected", "shard", n)
				if !send(groupUpdate{shard: n, list: list}) {
					return
				}
				break
			}
			if ctx.Err() != nil {
				return
			}
			if !retryable(err) {
				send(groupUpdate{shard: n, err: err})
				return
			}
			s.log.V(1).Info("reconnecting the group watch failed", "shard", n, "attempt", attempt, "reason", err.Error())
		}
	}
}

// watchGroups prints the groups, then every change the shards announce,
// until the command's context ends (Ctrl+C, SIGTERM).
func watchGroups(s *session) error {
	ctx, cancel := context.WithCancel(s.c.Context)
	defer cancel()
	tr := newTracker(groupID, groupRow, nil)
	stream := s.p.Stream(groupHeader)
	streams := make([]*groupStream, len(s.names))
	var initial []output.Event
	for i, n := range s.names {
		st, list, err := connectGroups(ctx, s, n)
		if err != nil {
			if stopped(s.c.Context, err) {
				return nil
			}
			return fmt.Errorf("shard %s: %w", n, err)
		}
		streams[i] = st
		evs, err := tr.sync(n, list)
		if err != nil {
			return err
		}
		initial = append(initial, evs...)
	}
	if err := stream.Write(initial...); err != nil {
		return err
	}
	updates := make(chan groupUpdate)
	for i, n := range s.names {
		go pumpGroups(ctx, s, n, streams[i], updates)
	}
	for {
		var u groupUpdate
		select {
		case <-ctx.Done():
			return nil
		case u = <-updates:
		}
		var evs []output.Event
		switch {
		case u.err != nil:
			return fmt.Errorf("watching shard %s: %w", u.shard, u.err)
		case u.ev == nil:
			var err error
			if evs, err = tr.sync(u.shard, u.list); err != nil {
				return err
			}
		case u.ev.GetSnapshot():
			// The list taken after subscribing already holds the snapshot.
		case u.ev.GetType() == nstancev1.GroupEventType_GROUP_EVENT_TYPE_DELETE:
			ev, ok, err := tr.remove(u.shard, u.ev.GetGroupId())
			if err != nil {
				return err
			}
			if ok {
				evs = append(evs, ev)
			}
		case u.ev.GetType() == nstancev1.GroupEventType_GROUP_EVENT_TYPE_UPSERT && u.ev.GetGroup() != nil:
			g := u.ev.GetGroup()
			if old, had := tr.known[objKey{u.shard, groupID(g)}]; had && g.GetUpdatedAt().AsTime().Before(old.GetUpdatedAt().AsTime()) {
				break // older than what the list showed
			}
			ev, ok, err := tr.upsert(u.shard, g)
			if err != nil {
				return err
			}
			if ok {
				evs = append(evs, ev)
			}
		}
		if len(evs) > 0 {
			if err := stream.Write(evs...); err != nil {
				return err
			}
		}
	}
}
