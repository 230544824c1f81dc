package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	ucli "github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/cliconv"
	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/logging"
	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
	"github.com/nstance-dev/nstance/internal/server/pprofserve"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/proxmox"
	"github.com/nstance-dev/nstance/internal/storage"
	"github.com/nstance-dev/nstance/internal/version"
)

// envPrefix names the environment variables of every flag.
const envPrefix = "NSTANCE"

// logOptions reads --log-level and --log-format. The hidden, deprecated
// --debug (NSTANCE_DEBUG) still means --log-level debug unless a level is
// given explicitly.
func logOptions(c *ucli.Context) logging.Options {
	o := logging.FromCLI(c)
	if c.Bool("debug") && !c.IsSet("log-level") {
		o.Level = "debug"
	}
	return o
}

// App returns the nstance-server command.
func App() *ucli.App {
	return cliconv.Configure(&ucli.App{
		Name:  Name,
		Usage: "per-shard Nstance control plane",
		Description: "Every flag is also read from the NSTANCE_* variable shown beside it; a flag given wins.\n" +
			"Other variables: " + config.DefaultEncryptionKeyEnv + " holds the cluster encryption key (the default of\n" +
			"shard.encryption.env for provider env); AWS_* configure the S3 client; " + proxmox.EnvTokenSecret + " holds the\n" +
			"Proxmox VE API token's secret when shard.infra.options.token_secret_file is unset; " + grpcserve.PanicHookEnv + "=1 (tests\n" +
			"only) makes a request with the " + grpcserve.PanicHookHeader + " header panic, to prove the recovery.\n" +
			"Exit codes: 0 stopped by a signal or valid with --validate; 1 a runtime failure; 2 a usage error.",
		Flags: append(logging.CLIFlags(envPrefix),
			&ucli.StringFlag{Name: "id", Usage: "server id (default: host name)", EnvVars: []string{"NSTANCE_SERVER_ID"}},
			&ucli.StringFlag{Name: "shard", Usage: "zone shard this server runs", EnvVars: []string{"NSTANCE_SHARD"}, Required: true},
			&ucli.StringFlag{Name: "storage", Value: "s3", Usage: "object storage kind: s3, gcs or file", EnvVars: []string{"NSTANCE_STORAGE"}},
			&ucli.StringFlag{Name: "bucket", Usage: "S3 bucket (endpoint and credentials from AWS_* variables)", EnvVars: []string{"NSTANCE_STORAGE_BUCKET"}},
			&ucli.StringFlag{Name: "prefix", Usage: "key prefix inside the bucket", EnvVars: []string{"NSTANCE_STORAGE_PREFIX"}},
			&ucli.StringFlag{Name: "storage-dir", Usage: "directory for --storage file", EnvVars: []string{"NSTANCE_STORAGE_DIR"}},
			&ucli.StringFlag{Name: "cache-dir", Usage: "directory of the SQLite cache (empty: in memory)", EnvVars: []string{"NSTANCE_CACHE_DIR"}},
			&ucli.StringFlag{Name: "leader-pod", Usage: "namespace/name of this server's Kubernetes pod: the shard leader labels it nstance.dev/shard-leader=true; overrides shard.leader_address", EnvVars: []string{"NSTANCE_LEADER_POD"}},
			&ucli.StringFlag{Name: "leader-interface", Usage: "EC2 network interface (eni-...) the shard leader attaches; overrides shard.leader_address", EnvVars: []string{"NSTANCE_LEADER_ENI"}},
			&ucli.StringSliceFlag{Name: "advertise-host", Usage: "host name or IP clients use; added to the server certificate", EnvVars: []string{"NSTANCE_ADVERTISE_HOST"}},
			&ucli.IntFlag{Name: "port-offset", Usage: "added to every configured port (dev stack: 10*(N-1))", EnvVars: []string{"NSTANCE_PORT_OFFSET"}},
			&ucli.StringFlag{Name: "bind-health", Usage: "health address (default 0.0.0.0:8990 plus offset)", EnvVars: []string{"NSTANCE_BIND_HEALTH"}},
			&ucli.StringFlag{Name: "bind-election", Usage: "override shard.bind.election_addr", EnvVars: []string{"NSTANCE_BIND_ELECTION"}},
			&ucli.StringFlag{Name: "bind-registration", Usage: "override shard.bind.registration_addr", EnvVars: []string{"NSTANCE_BIND_REGISTRATION"}},
			&ucli.StringFlag{Name: "bind-operator", Usage: "override shard.bind.operator_addr", EnvVars: []string{"NSTANCE_BIND_OPERATOR"}},
			&ucli.StringFlag{Name: "bind-agent", Usage: "override shard.bind.agent_addr", EnvVars: []string{"NSTANCE_BIND_AGENT"}},
			&ucli.StringFlag{Name: "metrics-token-file", Usage: "file holding the bearer token a /metrics scrape presents to see tenant and group labels (without it: aggregated series only)", EnvVars: []string{"NSTANCE_METRICS_TOKEN_FILE"}},
			&ucli.StringFlag{Name: "pprof-addr", Usage: "serve net/http/pprof on this address, e.g. 127.0.0.1:6060 (default off; keep it on loopback)", EnvVars: []string{"NSTANCE_PPROF_ADDR"}},
			&ucli.BoolFlag{Name: "validate", Usage: "validate the shard config (from storage, or --config-file) and exit"},
			&ucli.StringFlag{Name: "config-file", Usage: "with --validate: check this local file instead of storage"},
			&ucli.BoolFlag{Name: "debug", Usage: "deprecated: use --log-level debug", EnvVars: []string{"NSTANCE_DEBUG"}, Hidden: true},
			&ucli.DurationFlag{Name: "nonce-sweep-interval", Usage: "how often the leader deletes expired nonce markers (default 10m; tests use seconds)", EnvVars: []string{"NSTANCE_NONCE_SWEEP_INTERVAL"}, Hidden: true},
			&ucli.StringFlag{Name: "agent-command", Usage: "tmux/process providers: command each instance runs (overrides shard.infra.options.command)", EnvVars: []string{"NSTANCE_AGENT_COMMAND"}},
			&ucli.StringFlag{Name: "agent-state-dir", Usage: "tmux/process providers: per-instance identity directories (default temp/agents)", EnvVars: []string{"NSTANCE_AGENT_STATE_DIR"}},
			&ucli.StringFlag{Name: "node-dir", Usage: "tmux/process providers: fake Node JSON directory (default temp/dev-k8s/nodes; - disables)", EnvVars: []string{"NSTANCE_NODE_DIR"}},
			&ucli.StringFlag{Name: "tmux-session", Usage: "tmux provider: session of the agent windows (default nstance-dev-agents)", EnvVars: []string{"NSTANCE_TMUX_SESSION"}},
			&ucli.StringFlag{Name: "tmux-socket", Usage: "tmux provider: tmux socket name (-L)", EnvVars: []string{"NSTANCE_TMUX_SOCKET"}},
		),
		Action: run,
	})
}

// Name is the binary's name.
const Name = "nstance-server"

// Main runs the server with the process's arguments (args[0] is the program
// name) and returns the exit code (internal/cliconv).
func Main(args []string) int {
	return cliconv.Report(os.Stderr, Name, App().Run(args))
}

func run(c *ucli.Context) error {
	log, flush, err := logging.New(logOptions(c), c.App.ErrWriter)
	if err != nil {
		return cliconv.Usage(err)
	}
	defer flush()
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()

	if c.Bool("validate") {
		return validate(ctx, c, c.App.Writer)
	}
	if c.String("config-file") != "" {
		return cliconv.Usagef("--config-file is only used with --validate")
	}
	logging.Started(log, "nstance-server", version.Version, "shard", c.String("shard"))
	// Start-up failures are logged once, as errors, in the chosen format;
	// the exit code tells a supervisor what happened.
	fail := func(err error, msg string, code int) error {
		log.Error(err, msg)
		return ucli.Exit("", code)
	}
	if addr := c.String("pprof-addr"); addr != "" {
		_, stopPprof, err := pprofserve.Start(addr, log.WithName("pprof"))
		if err != nil {
			return fail(err, "starting pprof", 1)
		}
		defer stopPprof()
	}
	store, keys, err := storage.Open(ctx, storageOptions(c))
	if err != nil {
		return fail(err, "opening object storage", 2)
	}
	id := c.String("id")
	if id == "" {
		if id, err = os.Hostname(); err != nil {
			return fail(err, "--id not given and the host name is unknown", 1)
		}
	}
	// The server: app.Run is the start-up sequence, app.Assemble builds the
	// services, the provider and the reconciler from the config.
	a, err := app.New(app.Options{
		ServerID: id, Shard: c.String("shard"), Store: store, Keys: keys, CacheDir: c.String("cache-dir"),
		AdvertiseHosts: c.StringSlice("advertise-host"), LeaderInterfaceID: c.String("leader-interface"),
		LeaderPod:          c.String("leader-pod"),
		NonceSweepInterval: c.Duration("nonce-sweep-interval"),
		Bind: app.BindOverrides{
			PortOffset: c.Int("port-offset"), Health: c.String("bind-health"), Election: c.String("bind-election"),
			Registration: c.String("bind-registration"), Operator: c.String("bind-operator"), Agent: c.String("bind-agent"),
		},
		Log:              log.WithValues("server", id, "shard", c.String("shard")),
		MetricsTokenFile: c.String("metrics-token-file"),
		Local: provider.Local{
			Command: c.String("agent-command"), StateDir: c.String("agent-state-dir"), NodeDir: c.String("node-dir"),
			Session: c.String("tmux-session"), Socket: c.String("tmux-socket"),
		},
	})
	if err != nil {
		return fail(err, "invalid server options", 2)
	}
	if err := a.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fail(err, "server stopped", 1)
	}
	log.Info("server stopped")
	return nil
}

func storageOptions(c *ucli.Context) storage.Options {
	return storage.Options{Kind: c.String("storage"), Bucket: c.String("bucket"), Dir: c.String("storage-dir"), Prefix: c.String("prefix")}
}

// validate checks one config document and reports every problem.
func validate(ctx context.Context, c *ucli.Context, out io.Writer) error {
	var data []byte
	var source string
	if f := c.String("config-file"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("reading %s: %w", f, err)
		}
		data, source = b, f
	} else {
		store, keys, err := storage.Open(ctx, storageOptions(c))
		if err != nil {
			return cliconv.Usage(err)
		}
		key := keys.Config(c.String("shard"))
		obj, err := store.Get(ctx, key)
		if err != nil {
			return fmt.Errorf("reading %s: %w", key, err)
		}
		data, source = obj.Body, key
	}
	cfg, err := config.Parse(data, app.DefaultProviders().Check, app.DefaultLoadBalancers().Check)
	if err != nil {
		if es, ok := config.AsErrors(err); ok {
			for _, e := range es {
				fmt.Fprintf(out, "%s: %s\n", source, e.Error())
			}
			return ucli.Exit(fmt.Sprintf("%s: %d problem(s)", source, len(es)), 1)
		}
		return ucli.Exit(fmt.Sprintf("%s: %v", source, err), 1)
	}
	if cfg.Shard.ID != c.String("shard") {
		fmt.Fprintf(out, "%s: shard.id: is %q, but --shard is %q\n", source, cfg.Shard.ID, c.String("shard"))
		return ucli.Exit(fmt.Sprintf("%s: 1 problem(s)", source), 1)
	}
	fmt.Fprintf(out, "%s: valid\n", source)
	return nil
}
