package shardcmd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nstance-dev/nstance/internal/admin/output"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const statePrefix = "INSTANCE_STATE_"

// stateName is the short lower-case name of a state: running, pending_deletion, ...
func stateName(st nstancev1.InstanceState) string {
	return strings.ToLower(strings.TrimPrefix(st.String(), statePrefix))
}

func stateNames() []string {
	var out []string
	for v := range nstancev1.InstanceState_name {
		if v != 0 {
			out = append(out, stateName(nstancev1.InstanceState(v)))
		}
	}
	slices.Sort(out)
	return out
}

// parseState accepts a short name (running, pending-deletion, pending_deletion) or the enum name.
func parseState(s string) (nstancev1.InstanceState, error) {
	norm := strings.ToUpper(strings.ReplaceAll(strings.TrimSpace(s), "-", "_"))
	if !strings.HasPrefix(norm, statePrefix) {
		norm = statePrefix + norm
	}
	if v, ok := nstancev1.InstanceState_value[norm]; ok && v != 0 {
		return nstancev1.InstanceState(v), nil
	}
	return 0, fmt.Errorf("--state %q: want one of %s", s, strings.Join(stateNames(), ", "))
}

var instanceHeader = []string{"SHARD", "INSTANCE", "GROUP", "STATE", "PROVIDER ID", "AGE"}

func (s *session) instanceRow(shardName string, in *nstancev1.InstanceStatus) []string {
	var created time.Time
	if in.GetCreatedAt() != nil {
		created = in.GetCreatedAt().AsTime()
	}
	return []string{shardName, in.GetInstanceId(), orDash(in.GetGroupId()), stateName(in.GetState()), orDash(in.GetProviderId()), s.p.Age(created)}
}

func instanceID(in *nstancev1.InstanceStatus) string { return in.GetInstanceId() }

// sameInstance ignores the time of the last health report, which moves on
// every report without anything changing that a watcher would care about.
func sameInstance(a, b *nstancev1.InstanceStatus) bool {
	a, b = proto.Clone(a).(*nstancev1.InstanceStatus), proto.Clone(b).(*nstancev1.InstanceStatus)
	a.LastHealthAt, b.LastHealthAt = nil, nil
	return proto.Equal(a, b)
}

func instanceCommand() *cli.Command {
	return &cli.Command{
		Name:  "instance",
		Usage: "instances on shard servers",
		Subcommands: []*cli.Command{
			{
				Name: "list", Usage: "list the instances of your tenant",
				Flags: flags(true, watchFlag(),
					&cli.StringSliceFlag{Name: "group", Usage: "only instances of this group (repeatable)"},
					&cli.StringSliceFlag{Name: "state", Usage: "only instances in this state (repeatable): " + strings.Join(stateNames(), ", ")},
					&cli.DurationFlag{Name: "interval", Value: 2 * time.Second, Usage: "with --watch: how often to re-list"},
				),
				Action: func(c *cli.Context) error {
					req := &nstancev1.ListInstancesRequest{GroupIds: c.StringSlice("group")}
					for _, v := range c.StringSlice("state") {
						st, err := parseState(v)
						if err != nil {
							return err
						}
						req.States = append(req.States, st)
					}
					if c.Bool("watch") && c.Duration("interval") <= 0 {
						return fmt.Errorf("--interval must be positive, got %s", c.Duration("interval"))
					}
					return run(c, true, func(s *session) error {
						if c.Bool("watch") {
							return watchInstances(s, req, c.Duration("interval"))
						}
						return listInstances(s, req)
					})
				},
			},
			{
				Name: "get", Usage: "show one instance (looked up on every configured shard unless --shard)", ArgsUsage: "INSTANCE", Flags: flags(false),
				Action: func(c *cli.Context) error {
					id, err := oneArg(c, "INSTANCE")
					if err != nil {
						return err
					}
					return run(c, false, func(s *session) error {
						n, in, err := s.findInstance(id)
						if err != nil {
							return err
						}
						return s.printInstance(n, in)
					})
				},
			},
			{
				Name: "delete", Usage: "delete one instance; unless --skip-drain it waits for a drain acknowledgement (or the drain timeout)", ArgsUsage: "INSTANCE",
				Flags: flags(false, &cli.BoolFlag{Name: "skip-drain", Usage: "delete without waiting for a drain acknowledgement"}),
				Action: func(c *cli.Context) error {
					return onInstance(c, func(s *session, n string, oc nstancev1.OperatorServiceClient, id string) error {
						var err error
						var resp *nstancev1.DeleteInstanceResponse
						if err := s.call(func(ctx context.Context) error {
							resp, err = oc.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: id, SkipDrain: c.Bool("skip-drain")})
							return err
						}); err != nil {
							return fmt.Errorf("shard %s: %w", n, err)
						}
						in := resp.GetInstance()
						if s.p.Machine() {
							return s.printInstance(n, in)
						}
						msg := fmt.Sprintf("%s: instance %s is %s", n, id, stateName(in.GetState()))
						switch {
						case c.Bool("skip-drain"):
							msg += "; it is deleted without waiting for a drain"
						case in.GetState() == nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION:
							msg += fmt.Sprintf(" until its drain is acknowledged (nstance-admin instance ack-drain %s) or the deadline %s passes", id, timeString(in.GetDrainDeadline()))
						}
						_, err = fmt.Fprintln(s.p.W, msg)
						return err
					})
				},
			},
			{
				Name: "ack-drain", Usage: "acknowledge that a pending-deletion instance is drained, so it is deleted now", ArgsUsage: "INSTANCE", Flags: flags(false),
				Action: func(c *cli.Context) error {
					return onInstance(c, func(s *session, n string, oc nstancev1.OperatorServiceClient, id string) error {
						var err error
						var resp *nstancev1.AcknowledgeDrainedResponse
						if err := s.call(func(ctx context.Context) error {
							resp, err = oc.AcknowledgeDrained(ctx, &nstancev1.AcknowledgeDrainedRequest{InstanceId: id})
							return err
						}); err != nil {
							return fmt.Errorf("shard %s: %w", n, err)
						}
						if s.p.Machine() {
							return s.printInstance(n, resp.GetInstance())
						}
						_, err = fmt.Fprintf(s.p.W, "%s: instance %s drain acknowledged; it is %s\n", n, id, stateName(resp.GetInstance().GetState()))
						return err
					})
				},
			},
			instanceRevokeCommand(),
		},
	}
}

// onInstance runs fn against the shard holding the instance that the
// command's one argument names (looked up on every shard unless --shard).
func onInstance(c *cli.Context, fn func(s *session, shard string, oc nstancev1.OperatorServiceClient, id string) error) error {
	id, err := oneArg(c, "INSTANCE")
	if err != nil {
		return err
	}
	return run(c, false, func(s *session) error {
		n, _, err := s.findInstance(id)
		if err != nil {
			return err
		}
		oc, err := s.set.Client(n)
		if err != nil {
			return fmt.Errorf("shard %s: %w", n, err)
		}
		return fn(s, n, oc, id)
	})
}

// findInstance asks the session's shards for an instance; exactly one must have it.
func (s *session) findInstance(id string) (string, *nstancev1.InstanceStatus, error) {
	var (
		found []string
		inst  *nstancev1.InstanceStatus
		errs  []error
	)
	for _, n := range s.names {
		oc, _ := s.set.Client(n)
		err := s.call(func(ctx context.Context) error {
			resp, err := oc.GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: id}})
			if err == nil {
				found, inst = append(found, n), resp.GetInstance()
			}
			return err
		})
		if err != nil && status.Code(err) != codes.NotFound {
			errs = append(errs, fmt.Errorf("shard %s: %w", n, err))
		}
	}
	switch {
	case len(found) == 1:
		return found[0], inst, nil
	case len(found) > 1:
		return "", nil, fmt.Errorf("instance %q exists on shards %s: pass --shard", id, strings.Join(found, ", "))
	case len(errs) > 0:
		return "", nil, errors.Join(append([]error{fmt.Errorf("instance %q not found on the shards that answered", id)}, errs...)...)
	}
	return "", nil, fmt.Errorf("instance %q not found on shard %s", id, strings.Join(s.names, ", "))
}

func (s *session) printInstance(n string, in *nstancev1.InstanceStatus) error {
	if s.p.Machine() {
		obj, err := output.ShardProto(n, in)
		if err != nil {
			return err
		}
		return s.p.Document(obj)
	}
	addrs := make([]string, 0, len(in.GetAddresses()))
	for _, a := range in.GetAddresses() {
		addrs = append(addrs, strings.ToLower(strings.TrimPrefix(a.GetType().String(), "ADDRESS_TYPE_"))+"="+a.GetAddress())
	}
	return s.p.Fields(
		"instance", in.GetInstanceId(), "shard", n, "group", orDash(in.GetGroupId()), "template", in.GetTemplate(),
		"state", stateName(in.GetState()), "provider id", orDash(in.GetProviderId()), "instance type", orDash(in.GetInstanceType()),
		"addresses", orDash(strings.Join(addrs, ",")), "created", timeString(in.GetCreatedAt()),
		"last health", timeString(in.GetLastHealthAt()), "drain deadline", timeString(in.GetDrainDeadline()),
		"client token", orDash(in.GetClientToken()), "message", orDash(in.GetMessage()))
}

func (s *session) listShardInstances(n string, req *nstancev1.ListInstancesRequest) ([]*nstancev1.InstanceStatus, error) {
	oc, err := s.set.Client(n)
	if err != nil {
		return nil, err
	}
	var list []*nstancev1.InstanceStatus
	err = s.call(func(ctx context.Context) error {
		resp, err := oc.ListInstances(ctx, req)
		list = resp.GetInstances()
		return err
	})
	return list, err
}

func listInstances(s *session, req *nstancev1.ListInstancesRequest) error {
	rows := output.Rows{Header: instanceHeader}
	var it items
	var errs []error
	for _, n := range s.names {
		list, err := s.listShardInstances(n, req)
		if err != nil {
			errs = append(errs, fmt.Errorf("shard %s: %w", n, err))
			continue
		}
		for _, in := range list {
			rows.Add(s.instanceRow(n, in)...)
			if err := it.add(n, in); err != nil {
				return err
			}
		}
	}
	err := errors.Join(errs...)
	if s.p.Machine() {
		return it.print(s.p, err)
	}
	return errors.Join(err, s.p.Table(rows))
}

// watchInstances prints the instances, then re-lists every interval and
// prints what changed. The Operator API streams only the deletion steps of
// instances (WatchInstances), not every state change, so a periodic list
// is the complete source.
func watchInstances(s *session, req *nstancev1.ListInstancesRequest, interval time.Duration) error {
	ctx := s.c.Context
	tr := newTracker(instanceID, s.instanceRow, sameInstance)
	stream := s.p.Stream(instanceHeader)
	failing := map[string]bool{}
	for first := true; ; first = false {
		var evs []output.Event
		for _, n := range s.names {
			list, err := s.listShardInstances(n, req)
			if err != nil {
				if stopped(ctx, err) {
					return nil
				}
				if first || !retryable(err) {
					return fmt.Errorf("shard %s: %w", n, err)
				}
				if !failing[n] {
					s.log.Info("listing instances failed; retrying", "shard", n, "every", interval.String(), "reason", err.Error())
					failing[n] = true
				}
				continue
			}
			if failing[n] {
				s.log.Info("listing instances works again", "shard", n)
				delete(failing, n)
			}
			e, err := tr.sync(n, list)
			if err != nil {
				return err
			}
			evs = append(evs, e...)
		}
		if first || len(evs) > 0 {
			if err := stream.Write(evs...); err != nil {
				return err
			}
		}
		if !sleep(ctx, interval) {
			return nil
		}
	}
}
