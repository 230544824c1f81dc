// Command nstance-admin is the Nstance administration CLI.
package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/admin/clustercmd"
	"github.com/nstance-dev/nstance/internal/admin/shardcmd"
	"github.com/nstance-dev/nstance/internal/version"
)

func main() {
	app := &cli.App{
		Name:     "nstance-admin",
		Usage:    "administer an Nstance cluster and its shards",
		Version:  version.Version,
		Commands: append([]*cli.Command{clustercmd.Command()}, shardcmd.Commands()...),
	}
	if err := app.Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "nstance-admin:", err)
		os.Exit(1)
	}
}
