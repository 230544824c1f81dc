package clustercmd

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/admin/cmdutil"
	"github.com/nstance-dev/nstance/internal/carotation"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// previousKeyFlags name encryption keys that envelopes may still be sealed
// with (the servers' cluster.secrets.previous_keys).
func previousKeyFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringSliceFlag{Name: "previous-key-env", Usage: "variable holding a previous encryption key (repeatable)"},
		&cli.StringSliceFlag{Name: "previous-key-file", Usage: "file holding a previous encryption key (repeatable)"},
	}
}

// secretStore opens storage and the keyring from the flags: the current key
// seals, the current and previous keys open.
func secretStore(ctx context.Context, c *cli.Context) (objstore.Store, layout.Keys, *secrets.Store, error) {
	objs, keys, err := store(ctx, c)
	if err != nil {
		return nil, layout.Keys{}, nil, err
	}
	var prev []secrets.Source
	for _, e := range c.StringSlice("previous-key-env") {
		prev = append(prev, secrets.Source{Provider: "env", Env: e})
	}
	for _, f := range c.StringSlice("previous-key-file") {
		prev = append(prev, secrets.Source{Provider: "file", File: f})
	}
	ring, err := secrets.LoadKeyring(secrets.Source{Provider: c.String("key-provider"), Env: c.String("key-env"), File: c.String("key-file")}, prev, nil)
	if err != nil {
		return nil, layout.Keys{}, nil, err
	}
	return objs, keys, &secrets.Store{Objects: objs, Ring: ring}, nil
}

func rotateFlags(extra ...cli.Flag) []cli.Flag {
	flags := []cli.Flag{&cli.StringFlag{Name: "cluster-id", Usage: "Nstance cluster id", Required: true, EnvVars: []string{"NSTANCE_CLUSTER_ID"}}}
	flags = append(flags, storageFlags()...)
	flags = append(flags, keyFlags()...)
	flags = append(flags, previousKeyFlags()...)
	flags = append(flags, extra...)
	flags = append(flags, outputFlag())
	return append(flags, cmdutil.LogFlags()...)
}

func rotator(ctx context.Context, c *cli.Context) (*carotation.Rotator, error) {
	objs, keys, sec, err := secretStore(ctx, c)
	if err != nil {
		return nil, err
	}
	return &carotation.Rotator{Objects: objs, Secrets: sec, Keys: keys, ClusterID: c.String("cluster-id")}, nil
}

func rotateCACommand() *cli.Command {
	force := &cli.BoolFlag{Name: "force", Usage: "skip the time gate (only once every client and server is known to hold what the step needs)"}
	step := func(name, usage string, run func(ctx context.Context, c *cli.Context, r *carotation.Rotator) (carotation.State, error), extra ...cli.Flag) *cli.Command {
		return &cli.Command{
			Name: name, Usage: usage, Flags: rotateFlags(extra...),
			Action: func(c *cli.Context) error {
				_, flush, err := cmdutil.Logger(c)
				if err != nil {
					return err
				}
				defer flush()
				r, err := rotator(c.Context, c)
				if err != nil {
					return err
				}
				if _, err := run(c.Context, c, r); err != nil {
					return err
				}
				return printStatus(c, r)
			},
		}
	}
	return &cli.Command{
		Name:  "rotate-ca",
		Usage: "rotate the cluster CA in three phases: introduce, switch, retire (status shows where it stands)",
		Description: "introduce: a new CA joins the trusted bundle (servers still sign with the old one).\n" +
			"switch: servers sign with the new CA and re-issue their own certificates; clients get new ones at renewal.\n" +
			"retire: the old CA leaves the bundle.\n" +
			"switch waits until every client renewed since introduce, retire until every certificate of the old CA expired\n" +
			"(the longest agent/operator validity of any shard); --force skips the wait. Every step may be re-run.",
		Subcommands: []*cli.Command{
			step("introduce", "create the new CA and add it to the trusted bundle",
				func(ctx context.Context, c *cli.Context, r *carotation.Rotator) (carotation.State, error) {
					lim, err := carotation.LimitsFromConfigs(ctx, r.Objects, r.Keys)
					if err != nil {
						return carotation.State{}, err
					}
					if v := c.Duration("ca-validity"); v > 0 {
						lim.CAValidity = v
					}
					return r.Introduce(ctx, lim)
				},
				&cli.DurationFlag{Name: "ca-validity", Usage: "validity of the new CA (default: the longest certificates.ca_validity of any shard)"}),
			step("switch", "sign with the new CA",
				func(ctx context.Context, c *cli.Context, r *carotation.Rotator) (carotation.State, error) {
					return r.Switch(ctx, c.Bool("force"))
				}, force),
			step("retire", "remove the old CA from the trusted bundle",
				func(ctx context.Context, c *cli.Context, r *carotation.Rotator) (carotation.State, error) {
					return r.Retire(ctx, c.Bool("force"))
				}, force),
			step("status", "show the rotation phase, the trusted CAs and what the next step waits for",
				func(context.Context, *cli.Context, *carotation.Rotator) (carotation.State, error) {
					return carotation.State{}, nil
				}),
		},
	}
}

func printStatus(c *cli.Context, r *carotation.Rotator) error {
	p, err := printer(c, c.App.Writer)
	if err != nil {
		return err
	}
	st, err := r.Status(c.Context)
	if err != nil {
		return err
	}
	if p.Machine() {
		return p.Document(st)
	}
	phase := string(st.State.Phase)
	if phase == "" {
		phase = "none (never rotated)"
	}
	kv := []string{"phase", phase, "signer", strings.TrimSpace(st.Signer.Fingerprint + " " + roleOf(st.Signer))}
	for i, b := range st.Bundle {
		kv = append(kv, fmt.Sprintf("trusted[%d]", i), fmt.Sprintf("%s %s(expires %s)", b.Fingerprint, roleOf(b), b.NotAfter.Format(time.RFC3339)))
	}
	kv = append(kv, "next step", st.NextStep)
	if st.Waiting != "" {
		kv = append(kv, "waiting", st.Waiting)
	} else {
		kv = append(kv, "waiting", "nothing: the next step may run")
	}
	return p.Fields(kv...)
}

func roleOf(ci carotation.CertInfo) string {
	if ci.Role == "" {
		return ""
	}
	return "(" + ci.Role + ") "
}

func rotateKeyCommand() *cli.Command {
	return &cli.Command{
		Name:  "rotate-encryption-key",
		Usage: "re-seal every secret envelope under the current key (--key-*), opening old ones with --previous-key-*",
		Description: "Give every server the new key as cluster.secrets.encryption_key with the old one in previous_keys\n" +
			"first, then run this with the same keys; it is idempotent (envelopes already under the new key are left\n" +
			"alone), so an interrupted run is finished by running it again. Then drop the old key from previous_keys.",
		Flags: rotateFlags(),
		Action: func(c *cli.Context) error {
			log, flush, err := cmdutil.Logger(c)
			if err != nil {
				return err
			}
			defer flush()
			p, err := printer(c, c.App.Writer)
			if err != nil {
				return err
			}
			_, keys, sec, err := secretStore(c.Context, c)
			if err != nil {
				return err
			}
			rep, err := sec.ResealAll(c.Context, keys.SecretPrefix())
			if err != nil {
				return fmt.Errorf("re-sealing (run again to finish; %d re-sealed so far): %w", rep.Resealed, err)
			}
			log.V(1).Info("re-sealed", "keys", rep.Keys)
			if p.Machine() {
				return p.Document(struct {
					KeyID string `json:"key_id"`
					secrets.ResealReport
				}{sec.Ring.CurrentID(), rep})
			}
			return p.Fields("key id", sec.Ring.CurrentID(), "envelopes", fmt.Sprint(rep.Total),
				"re-sealed", fmt.Sprint(rep.Resealed), "already current", fmt.Sprint(rep.AlreadyCurrent))
		},
	}
}
