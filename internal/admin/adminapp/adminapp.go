package adminapp

import (
	"context"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/admin/clustercmd"
	"github.com/nstance-dev/nstance/internal/admin/contextcmd"
	"github.com/nstance-dev/nstance/internal/admin/shardcmd"
	"github.com/nstance-dev/nstance/internal/cliconv"
)

// Name is the binary's name.
const Name = "nstance-admin"

// New returns the nstance-admin app. Results go to the app's Writer, logs
// and errors to its ErrWriter. Run it with Run so flags may follow the
// command's arguments.
func New() *cli.App {
	cmds := []*cli.Command{clustercmd.Command(), contextcmd.Command()}
	// Errors are returned to main, which prints them once
	// (cliconv.Report); Configure adds the version command.
	return cliconv.Configure(&cli.App{
		Name:     Name,
		Usage:    "administer an Nstance cluster and its shards",
		Commands: append(cmds, shardcmd.Commands()...),
	})
}

// Run runs app with args (args[0] is the program name) after Reorder.
func Run(ctx context.Context, app *cli.App, args []string) error {
	return app.RunContext(ctx, Reorder(app, args))
}

// Reorder moves the flags of the command named by args in front of its
// positional arguments, so `instance get ID -o json` works like
// `instance get -o json ID` (the flag package stops at the first
// positional argument). Positional arguments then follow "--", so none is
// ever taken for a flag.
func Reorder(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	cmds := app.Commands
	var leaf *cli.Command
	i := 1
	for ; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "-") {
			out = append(out, a)
			continue
		}
		c := find(cmds, a)
		if c == nil {
			break
		}
		out = append(out, a)
		leaf, cmds = c, c.Subcommands
		if len(c.Subcommands) == 0 {
			i++
			break
		}
	}
	if leaf == nil || len(leaf.Subcommands) > 0 {
		return args
	}
	var flags, pos []string
	rest := args[i:]
	for j := 0; j < len(rest); j++ {
		a := rest[j]
		if a == "--" {
			pos = append(pos, rest[j+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if !strings.Contains(name, "=") && takesValue(leaf, name) && j+1 < len(rest) {
			flags = append(flags, rest[j+1])
			j++
		}
	}
	out = append(out, flags...)
	if len(pos) > 0 {
		out = append(append(out, "--"), pos...)
	}
	return out
}

func find(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// takesValue reports whether the command's flag called name reads the next argument.
func takesValue(c *cli.Command, name string) bool {
	for _, f := range c.Flags {
		for _, n := range f.Names() {
			if n != name {
				continue
			}
			_, isBool := f.(*cli.BoolFlag)
			return !isBool
		}
	}
	return false
}
