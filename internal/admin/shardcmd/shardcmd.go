package shardcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nstance-dev/nstance/internal/admin/shard"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func connFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "servers", Usage: "shard Operator endpoints, shard=host:port,...", EnvVars: []string{"NSTANCE_ADMIN_SERVERS"}, Required: true},
		&cli.StringFlag{Name: "shard", Usage: "shard to act on (optional when only one is listed)"},
		&cli.BoolFlag{Name: "all-shards", Usage: "act on every listed shard"},
		&cli.StringFlag{Name: "ca-cert", Usage: "cluster CA certificate (PEM)", EnvVars: []string{"NSTANCE_ADMIN_CA_CERT"}},
		&cli.StringFlag{Name: "cert", Usage: "operator client certificate (PEM)", EnvVars: []string{"NSTANCE_ADMIN_CERT"}},
		&cli.StringFlag{Name: "key", Usage: "operator client key (PEM)", EnvVars: []string{"NSTANCE_ADMIN_KEY"}},
		&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "table", Usage: "table or json"},
		&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "per-command timeout"},
	}
}

func open(c *cli.Context) (*shard.Set, []string, error) {
	servers, err := shard.ParseServers(c.String("servers"))
	if err != nil {
		return nil, nil, err
	}
	tc, err := shard.Credentials{CACertFile: c.String("ca-cert"), CertFile: c.String("cert"), KeyFile: c.String("key")}.TLSConfig()
	if err != nil {
		return nil, nil, err
	}
	set, err := shard.Dial(servers, tc)
	if err != nil {
		return nil, nil, err
	}
	names, err := set.Select(c.String("shard"), c.Bool("all-shards"))
	if err != nil {
		set.Close()
		return nil, nil, err
	}
	return set, names, nil
}

// forEach runs fn on each selected shard and joins the errors, naming the shard.
func forEach(c *cli.Context, fn func(ctx context.Context, name string, oc nstancev1.OperatorServiceClient) error) error {
	set, names, err := open(c)
	if err != nil {
		return err
	}
	defer set.Close()
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	var errs []error
	for _, n := range names {
		oc, _ := set.Client(n)
		if err := fn(ctx, n, oc); err != nil {
			errs = append(errs, fmt.Errorf("shard %s: %w", n, err))
		}
	}
	return errors.Join(errs...)
}

func printJSON(w io.Writer, shardName string, m proto.Message) {
	b, _ := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	fmt.Fprintf(w, "{\"shard\":%q,\"result\":%s}\n", shardName, b)
}

// Commands returns the shard commands for nstance-admin.
func Commands() []*cli.Command {
	return []*cli.Command{configCommand(), groupCommand(), serveCommand()}
}

func configCommand() *cli.Command {
	return &cli.Command{
		Name:  "config",
		Usage: "shard server configuration",
		Subcommands: []*cli.Command{
			{
				Name: "status", Usage: "show the etag and modification time of the running config", Flags: connFlags(),
				Action: func(c *cli.Context) error {
					tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
					if c.String("output") != "json" {
						fmt.Fprintln(tw, "SHARD\tETAG\tLAST MODIFIED")
					}
					err := forEach(c, func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error {
						st, err := oc.GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
						if err != nil {
							return err
						}
						if c.String("output") == "json" {
							printJSON(c.App.Writer, n, st)
							return nil
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\n", n, st.GetEtag(), st.GetLastModified().AsTime().Format(time.RFC3339))
						return nil
					})
					tw.Flush()
					return err
				},
			},
			{
				Name: "refresh", Usage: "make the server reload config/{shard}.jsonc from object storage", Flags: connFlags(),
				Action: func(c *cli.Context) error {
					return forEach(c, func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error {
						res, err := oc.RefreshConfig(ctx, &nstancev1.RefreshConfigRequest{})
						if err != nil {
							return err
						}
						if c.String("output") == "json" {
							printJSON(c.App.Writer, n, res)
						} else {
							outcome := strings.ToLower(strings.TrimPrefix(res.GetOutcome().String(), "REFRESH_CONFIG_OUTCOME_"))
							fmt.Fprintf(c.App.Writer, "%s: %s (etag %s): %s\n", n, outcome, res.GetEtag(), res.GetMessage())
							for _, ve := range res.GetValidationErrors() {
								fmt.Fprintf(c.App.Writer, "  %s: %s\n", ve.GetKey(), ve.GetReason())
							}
						}
						switch res.GetOutcome() {
						case nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_INVALID, nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_STORAGE_ERROR:
							return errors.New(res.GetMessage())
						}
						return nil
					})
				},
			},
		},
	}
}

func groupFlags(extra ...cli.Flag) []cli.Flag { return append(connFlags(), extra...) }

func oneArg(c *cli.Context, what string) (string, error) {
	if c.NArg() != 1 {
		return "", fmt.Errorf("want exactly one %s argument, got %d", what, c.NArg())
	}
	return c.Args().First(), nil
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

func groupTable(w io.Writer, rows [][2]any) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tGROUP\tTEMPLATE\tSIZE\tACTUAL\tREADY\tSTATIC")
	for _, r := range rows {
		g := r[1].(*nstancev1.GroupStatus)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%t\n", r[0], g.GetSpec().GetGroupId(), g.GetSpec().GetTemplate(), g.GetSpec().GetSize(), g.GetActualSize(), g.GetReadyCount(), g.GetStatic())
	}
	tw.Flush()
}

func groupCommand() *cli.Command {
	return &cli.Command{
		Name:  "group",
		Usage: "groups of instances on shard servers",
		Subcommands: []*cli.Command{
			{
				Name: "list", Usage: "list the groups of your tenant", Flags: groupFlags(),
				Action: func(c *cli.Context) error {
					var rows [][2]any
					err := forEach(c, func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error {
						resp, err := oc.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
						if err != nil {
							return err
						}
						if c.String("output") == "json" {
							printJSON(c.App.Writer, n, resp)
						}
						for _, g := range resp.GetGroups() {
							rows = append(rows, [2]any{n, g})
						}
						return nil
					})
					if c.String("output") != "json" {
						groupTable(c.App.Writer, rows)
					}
					return err
				},
			},
			{
				Name: "status", Usage: "show one group with its instances' provider ids", ArgsUsage: "GROUP", Flags: groupFlags(),
				Action: func(c *cli.Context) error {
					id, err := oneArg(c, "GROUP")
					if err != nil {
						return err
					}
					return forEach(c, func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error {
						g, err := shard.FindGroup(ctx, oc, id)
						if err != nil {
							return err
						}
						if g == nil {
							return fmt.Errorf("group %q not found", id)
						}
						if c.String("output") == "json" {
							printJSON(c.App.Writer, n, g)
							return nil
						}
						s := g.GetSpec()
						fmt.Fprintf(c.App.Writer, "shard: %s\ngroup: %s\ntemplate: %s\nsize: %d\nactual: %d\nready: %d\nstatic: %t\netag: %s\n",
							n, s.GetGroupId(), s.GetTemplate(), s.GetSize(), g.GetActualSize(), g.GetReadyCount(), g.GetStatic(), g.GetEtag())
						vars := make([]string, 0, len(s.GetVars()))
						for k, v := range s.GetVars() {
							vars = append(vars, k+"="+v)
						}
						sort.Strings(vars)
						if len(vars) > 0 {
							fmt.Fprintf(c.App.Writer, "vars: %s\n", strings.Join(vars, ","))
						}
						fmt.Fprintln(c.App.Writer, "provider ids:")
						for _, p := range g.GetProviderIds() {
							fmt.Fprintf(c.App.Writer, "  %s\n", p)
						}
						return nil
					})
				},
			},
			{
				Name: "create", Usage: "create (or replace) a dynamic group", ArgsUsage: "GROUP",
				Flags: groupFlags(
					&cli.StringFlag{Name: "template", Required: true, Usage: "instance template from the server config"},
					&cli.IntFlag{Name: "size", Value: 1, Usage: "number of instances"},
					&cli.StringFlag{Name: "instance-type"},
					&cli.StringFlag{Name: "subnet-pool"},
					&cli.StringSliceFlag{Name: "var", Usage: "template variable key=value (repeatable)"},
					&cli.DurationFlag{Name: "drain-timeout", Usage: "drain acknowledgement timeout (default: the shard's)"},
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
					if d := c.Duration("drain-timeout"); d > 0 {
						spec.DrainTimeout = durationpb.New(d)
					}
					return forEach(c, func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error {
						resp, err := oc.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: spec})
						if err != nil {
							return err
						}
						verb := "updated"
						if resp.GetCreated() {
							verb = "created"
						}
						fmt.Fprintf(c.App.Writer, "%s: group %s %s (size %d)\n", n, id, verb, spec.GetSize())
						return nil
					})
				},
			},
			{
				Name: "scale", Usage: "change the size of a dynamic group", ArgsUsage: "GROUP",
				Flags: groupFlags(&cli.IntFlag{Name: "size", Required: true, Usage: "new number of instances"}),
				Action: func(c *cli.Context) error {
					id, err := oneArg(c, "GROUP")
					if err != nil {
						return err
					}
					if c.Int("size") < 0 {
						return errors.New("--size must not be negative")
					}
					return forEach(c, func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error {
						g, err := shard.Scale(ctx, oc, id, uint32(c.Int("size")))
						if err != nil {
							return err
						}
						fmt.Fprintf(c.App.Writer, "%s: group %s scaled to %d (currently %d)\n", n, id, g.GetSpec().GetSize(), g.GetActualSize())
						return nil
					})
				},
			},
			{
				Name: "delete", Usage: "delete a dynamic group; its instances are drained and removed", ArgsUsage: "GROUP", Flags: groupFlags(),
				Action: func(c *cli.Context) error {
					id, err := oneArg(c, "GROUP")
					if err != nil {
						return err
					}
					return forEach(c, func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error {
						resp, err := oc.DeleteGroup(ctx, &nstancev1.DeleteGroupRequest{GroupId: id})
						if err != nil {
							return err
						}
						fmt.Fprintf(c.App.Writer, "%s: group %s deleted; %d instances will be drained and deleted\n", n, id, resp.GetInstancesToDelete())
						return nil
					})
				},
			},
		},
	}
}

func serveCommand() *cli.Command {
	return &cli.Command{
		Name:  "serve",
		Usage: "serve the config and group operations as a JSON HTTP API",
		Flags: append(connFlags(), &cli.StringFlag{Name: "listen", Value: "127.0.0.1:8980", Usage: "HTTP listen address"}),
		Action: func(c *cli.Context) error {
			servers, err := shard.ParseServers(c.String("servers"))
			if err != nil {
				return err
			}
			tc, err := shard.Credentials{CACertFile: c.String("ca-cert"), CertFile: c.String("cert"), KeyFile: c.String("key")}.TLSConfig()
			if err != nil {
				return err
			}
			set, err := shard.Dial(servers, tc)
			if err != nil {
				return err
			}
			defer set.Close()
			ln, err := net.Listen("tcp", c.String("listen"))
			if err != nil {
				return err
			}
			fmt.Fprintf(c.App.ErrWriter, "nstance-admin serving on http://%s\n", ln.Addr())
			srv := &http.Server{Handler: shard.Handler(set), ReadHeaderTimeout: 10 * time.Second}
			go func() {
				<-c.Context.Done()
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(sctx)
			}()
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
}
