package adminapp

import (
	"github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/admin/clustercmd"
	"github.com/nstance-dev/nstance/internal/admin/contextcmd"
	"github.com/nstance-dev/nstance/internal/admin/shardcmd"
	"github.com/nstance-dev/nstance/internal/version"
)

// New returns the nstance-admin app. Flags follow the command they belong
// to (`nstance-admin group list -o json`); results go to the app's Writer,
// logs and errors to its ErrWriter.
func New() *cli.App {
	cmds := []*cli.Command{clustercmd.Command(), contextcmd.Command()}
	return &cli.App{
		Name:     "nstance-admin",
		Usage:    "administer an Nstance cluster and its shards",
		Version:  version.Version,
		Commands: append(cmds, shardcmd.Commands()...),
		// Errors are returned to main, which prints them once.
		ExitErrHandler: func(*cli.Context, error) {},
	}
}
