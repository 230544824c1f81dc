// Command nstance-agent runs on every managed instance: it registers with the
// shard server, generates the keys its template asks for, writes the files the
// server delivers and streams health reports. It is configured entirely by
// NSTANCE_* environment variables (internal/agent/config.Vars, listed by
// --help); the only arguments are --version and --help.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/nstance-dev/nstance/internal/agent/app"
	"github.com/nstance-dev/nstance/internal/agent/config"
	"github.com/nstance-dev/nstance/internal/cliconv"
	"github.com/nstance-dev/nstance/internal/logging"
	"github.com/nstance-dev/nstance/internal/version"
)

// name is the binary's name.
const name = "nstance-agent"

func main() { os.Exit(run()) }

// run is the agent's life; its result is the exit code (deferred calls run
// before the process exits).
func run() int {
	if len(os.Args) > 1 {
		switch a := os.Args[1]; {
		case len(os.Args) > 2:
			return cliconv.Report(os.Stderr, name, cliconv.Usagef("unexpected argument %q (the agent takes only --version or --help; configuration comes from NSTANCE_* variables)", os.Args[2]))
		case a == "--version" || a == "-version" || a == "-v":
			fmt.Println(version.String(name))
			return cliconv.ExitOK
		case a == "--help" || a == "-help" || a == "-h":
			config.WriteUsage(os.Stdout, name)
			return cliconv.ExitOK
		default:
			return cliconv.Report(os.Stderr, name, cliconv.Usagef("unknown argument %q (configuration comes from NSTANCE_* variables)", a))
		}
	}
	cfg, err := config.Load(os.LookupEnv)
	if err != nil {
		return cliconv.Report(os.Stderr, name, cliconv.Usage(err))
	}
	base, flush, err := logging.New(cfg.Log, nil)
	if err != nil {
		return cliconv.Report(os.Stderr, name, cliconv.Usage(err))
	}
	defer flush()
	log := base.WithValues("instance", cfg.InstanceID)
	logging.Started(log, name, version.Version)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.Run(ctx, cfg, version.Version, log); err != nil {
		log.Error(err, "agent stopped")
		return 1
	}
	log.Info("agent stopped")
	return 0
}
