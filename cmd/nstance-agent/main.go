// Command nstance-agent runs on every managed instance: it registers with the
// shard server, generates the keys its template asks for, writes the files the
// server delivers and streams health reports. It is configured entirely by
// NSTANCE_* environment variables (see internal/agent/config); the only
// arguments are --version and --help.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/nstance-dev/nstance/internal/agent/app"
	"github.com/nstance-dev/nstance/internal/agent/config"
	"github.com/nstance-dev/nstance/internal/logging"
	"github.com/nstance-dev/nstance/internal/version"
)

const usage = `Usage: nstance-agent [--version | --help]

Runs the Nstance agent of one instance. It is configured by environment
variables, normally set by the provider that started the instance:
  required: NSTANCE_INSTANCE_ID, NSTANCE_IDENTITY_DIR, NSTANCE_REGISTRATION_ADDR, NSTANCE_AGENT_ADDR
  logging:  NSTANCE_LOG_LEVEL (debug, info, warn, error or a verbosity N),
            NSTANCE_LOG_FORMAT (json, text, or auto: text on a terminal)
The full list is in internal/agent/config and docs/agent.md.
`

func main() { os.Exit(run()) }

// run is the agent's life; its result is the exit code (deferred calls run
// before the process exits).
func run() int {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "--version", "-version", "-v":
			fmt.Println("nstance-agent", version.Version)
			return 0
		case "--help", "-help", "-h":
			fmt.Print(usage)
			return 0
		default:
			fmt.Fprintf(os.Stderr, "nstance-agent: unknown argument %q (configuration comes from NSTANCE_* variables)\n\n%s", os.Args[1], usage)
			return 2
		}
	}
	cfg, err := config.Load(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	base, flush, err := logging.New(cfg.Log, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nstance-agent:", err)
		return 2
	}
	defer flush()
	log := base.WithValues("instance", cfg.InstanceID)
	logging.Started(log, "nstance-agent", version.Version)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.Run(ctx, cfg, version.Version, log); err != nil {
		log.Error(err, "agent stopped")
		return 1
	}
	log.Info("agent stopped")
	return 0
}
