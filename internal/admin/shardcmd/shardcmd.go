package shardcmd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/urfave/cli/v2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nstance-dev/nstance/internal/admin/cmdutil"
	"github.com/nstance-dev/nstance/internal/admin/conn"
	"github.com/nstance-dev/nstance/internal/admin/output"
	"github.com/nstance-dev/nstance/internal/admin/shard"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Commands returns the shard commands for nstance-admin.
func Commands() []*cli.Command {
	return []*cli.Command{configCommand(), groupCommand(), instanceCommand(), operatorCommand(), revocationCommand(), serveCommand()}
}

// flags are the flags of a command that acts on shards and prints a result.
func flags(selectMany bool, extra ...cli.Flag) []cli.Flag {
	fs := append(conn.Flags(selectMany), output.Flag(),
		&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "timeout of each call to a shard"})
	fs = append(fs, extra...)
	return append(fs, cmdutil.LogFlags()...)
}

// session is what a running command needs: where to print, where to log,
// the shard connections and the shards it acts on.
type session struct {
	c       *cli.Context
	p       *output.Printer
	log     logr.Logger
	set     *shard.Set
	names   []string
	timeout time.Duration
}

// open prepares a session; with selectMany the shards come from --shard or
// --all-shards, otherwise from --shard or every configured shard.
func open(c *cli.Context, selectMany bool) (*session, func(), error) {
	p, err := output.New(c)
	if err != nil {
		return nil, nil, err
	}
	log, flush, err := cmdutil.Logger(c)
	if err != nil {
		return nil, nil, err
	}
	set, st, err := conn.Dial(c)
	if err != nil {
		flush()
		return nil, nil, err
	}
	done := func() { set.Close(); flush() }
	var names []string
	if selectMany {
		names, err = conn.Select(c, set)
	} else if s := c.String(conn.FlagShard); s != "" {
		names, err = []string{s}, nil
		if _, cerr := set.Client(s); cerr != nil {
			err = cerr
		}
	} else {
		names = set.Names()
	}
	if err != nil {
		done()
		return nil, nil, err
	}
	log.V(1).Info("connecting", "context", st.Context, "shards", strings.Join(names, ","))
	return &session{c: c, p: p, log: log, set: set, names: names, timeout: c.Duration("timeout")}, done, nil
}

// run opens a session, runs fn and closes the session.
func run(c *cli.Context, selectMany bool, fn func(s *session) error) error {
	s, done, err := open(c, selectMany)
	if err != nil {
		return err
	}
	defer done()
	return fn(s)
}

// call runs fn with the per-call timeout.
func (s *session) call(fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(s.c.Context, s.timeout)
	defer cancel()
	return fn(ctx)
}

// forEach runs fn on each selected shard and joins the errors, naming the shard.
func (s *session) forEach(fn func(ctx context.Context, name string, oc nstancev1.OperatorServiceClient) error) error {
	var errs []error
	for _, n := range s.names {
		oc, _ := s.set.Client(n)
		if err := s.call(func(ctx context.Context) error { return fn(ctx, n, oc) }); err != nil {
			errs = append(errs, fmt.Errorf("shard %s: %w", n, err))
		}
	}
	return errors.Join(errs...)
}

// items collects the machine form of per-shard results; print writes them
// as one list document even when some shards failed, then returns err.
type items struct{ list output.List }

func (it *items) add(shardName string, m proto.Message) error {
	obj, err := output.ShardProto(shardName, m)
	if err != nil {
		return err
	}
	it.list.Items = append(it.list.Items, obj)
	return nil
}

func (it *items) print(p *output.Printer, err error) error {
	if it.list.Items == nil {
		it.list.Items = []output.Object{}
	}
	if perr := p.Document(it.list); perr != nil {
		return errors.Join(err, perr)
	}
	return err
}

func oneArg(c *cli.Context, what string) (string, error) {
	if c.NArg() != 1 {
		return "", fmt.Errorf("want exactly one %s argument, got %d", what, c.NArg())
	}
	return c.Args().First(), nil
}

func configCommand() *cli.Command {
	return &cli.Command{
		Name:  "config",
		Usage: "shard server configuration",
		Subcommands: []*cli.Command{
			{
				Name: "status", Usage: "show the etag and modification time of the running config", Flags: flags(true),
				Action: func(c *cli.Context) error {
					return run(c, true, func(s *session) error {
						rows := output.Rows{Header: []string{"SHARD", "ETAG", "LAST MODIFIED"}}
						var it items
						err := s.forEach(func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error {
							st, err := oc.GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
							if err != nil {
								return err
							}
							rows.Add(n, st.GetEtag(), timeString(st.GetLastModified()))
							return it.add(n, st)
						})
						if s.p.Machine() {
							return it.print(s.p, err)
						}
						return errors.Join(err, s.p.Table(rows))
					})
				},
			},
			{
				Name: "refresh", Usage: "make the server reload config/{shard}.jsonc from object storage", Flags: flags(true),
				Action: func(c *cli.Context) error {
					return run(c, true, func(s *session) error {
						var it items
						err := s.forEach(func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error {
							res, err := oc.RefreshConfig(ctx, &nstancev1.RefreshConfigRequest{})
							if err != nil {
								return err
							}
							if s.p.Machine() {
								if err := it.add(n, res); err != nil {
									return err
								}
							} else {
								outcome := strings.ToLower(strings.TrimPrefix(res.GetOutcome().String(), "REFRESH_CONFIG_OUTCOME_"))
								fmt.Fprintf(s.p.W, "%s: %s (etag %s): %s\n", n, outcome, res.GetEtag(), res.GetMessage())
								for _, ve := range res.GetValidationErrors() {
									fmt.Fprintf(s.p.W, "  %s: %s\n", ve.GetKey(), ve.GetReason())
								}
							}
							switch res.GetOutcome() {
							case nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_INVALID, nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_STORAGE_ERROR:
								return errors.New(res.GetMessage())
							}
							return nil
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

// timeString renders a timestamp as RFC 3339 in UTC, "-" when unset.
func timeString(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().UTC().Format(time.RFC3339)
}

// orDash returns s, or "-" when it is empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
