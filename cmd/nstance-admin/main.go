// Command nstance-admin is the Nstance administration CLI.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/nstance-dev/nstance/internal/admin/adminapp"
	"github.com/nstance-dev/nstance/internal/cliconv"
)

func main() {
	// SIGINT and SIGTERM end watches and `serve` cleanly (exit code 0); a
	// second signal kills the process.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() { <-ctx.Done(); stop() }()
	err := adminapp.Run(ctx, adminapp.New(), os.Args)
	stop()
	os.Exit(cliconv.Report(os.Stderr, adminapp.Name, err))
}
