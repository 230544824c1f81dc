package cliconv

import (
	"fmt"

	ucli "github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/version"
)

// Configure makes a urfave/cli application follow the convention and
// returns it:
//   - a flag that does not parse is returned as a UsageError, with no help
//     dump (urfave/cli prints the whole help otherwise);
//   - required flags are checked without a help dump (a flag set by its
//     environment variable counts);
//   - --version prints version.String; an application with commands gets
//     a version command printing the same, and an unknown command is a
//     usage error;
//   - an application without commands refuses positional arguments;
//   - no error ends the process inside Run (ExitErrHandler does nothing):
//     main passes Run's error to Report.
func Configure(app *ucli.App) *ucli.App {
	ucli.VersionPrinter = func(c *ucli.Context) { fmt.Fprintln(c.App.Writer, version.String(c.App.Name)) }
	app.Version = version.Version
	app.ExitErrHandler = func(*ucli.Context, error) {}
	app.OnUsageError = onUsageError
	app.Before = checkRequired(app.Flags, app.Before)
	if len(app.Commands) == 0 {
		app.HideHelpCommand = true
		app.Action = noArguments(app.Action)
		return app
	}
	app.Commands = append(app.Commands, &ucli.Command{
		Name:  "version",
		Usage: "print the version",
		Action: func(c *ucli.Context) error {
			if c.NArg() > 0 {
				return Usagef("version: unexpected argument %q", c.Args().First())
			}
			_, err := fmt.Fprintln(c.App.Writer, version.String(c.App.Name))
			return err
		},
	})
	if app.Action == nil {
		app.Action = unknownCommand("")
	}
	for _, cmd := range app.Commands {
		configureCommand(cmd, "")
	}
	return app
}

func configureCommand(cmd *ucli.Command, parent string) {
	path := cmd.Name
	if parent != "" {
		path = parent + " " + cmd.Name
	}
	cmd.OnUsageError = func(c *ucli.Context, err error, _ bool) error {
		return Usagef("%s: %w", path, err)
	}
	cmd.Before = checkRequired(cmd.Flags, cmd.Before)
	if len(cmd.Subcommands) > 0 && cmd.Action == nil {
		cmd.Action = unknownCommand(path)
	}
	for _, sub := range cmd.Subcommands {
		configureCommand(sub, path)
	}
}

func onUsageError(_ *ucli.Context, err error, _ bool) error { return Usage(err) }

// checkRequired moves urfave/cli's required-flag check (which prints the
// help) into Before.
func checkRequired(flags []ucli.Flag, before ucli.BeforeFunc) ucli.BeforeFunc {
	var required []string
	for _, f := range flags {
		rf, ok := f.(ucli.RequiredFlag)
		if !ok || !rf.IsRequired() {
			continue
		}
		required = append(required, f.Names()[0])
		switch t := f.(type) {
		case *ucli.StringFlag:
			t.Required = false
		case *ucli.StringSliceFlag:
			t.Required = false
		case *ucli.IntFlag:
			t.Required = false
		case *ucli.BoolFlag:
			t.Required = false
		case *ucli.DurationFlag:
			t.Required = false
		default:
			panic(fmt.Sprintf("cliconv: required flag --%s of type %T", f.Names()[0], f))
		}
	}
	if len(required) == 0 {
		return before
	}
	return func(c *ucli.Context) error {
		for _, name := range required {
			if !c.IsSet(name) {
				msg := fmt.Sprintf("required flag --%s not set", name)
				for _, f := range flags {
					if f.Names()[0] != name {
						continue
					}
					if ev, ok := f.(interface{ GetEnvVars() []string }); ok && len(ev.GetEnvVars()) > 0 {
						msg += fmt.Sprintf(" (or %s)", ev.GetEnvVars()[0])
					}
				}
				return Usagef("%s", msg)
			}
		}
		if before != nil {
			return before(c)
		}
		return nil
	}
}

// noArguments refuses positional arguments before running action.
func noArguments(action ucli.ActionFunc) ucli.ActionFunc {
	return func(c *ucli.Context) error {
		if c.NArg() > 0 {
			return Usagef("unexpected argument %q (only flags are taken)", c.Args().First())
		}
		if action == nil {
			return nil
		}
		return action(c)
	}
}

// unknownCommand shows the help of a command group run without a command,
// and refuses a command that does not exist.
func unknownCommand(path string) ucli.ActionFunc {
	return func(c *ucli.Context) error {
		if c.NArg() == 0 {
			if path == "" {
				return ucli.ShowAppHelp(c)
			}
			return ucli.ShowSubcommandHelp(c)
		}
		if path == "" {
			return Usagef("unknown command %q", c.Args().First())
		}
		return Usagef("%s: unknown command %q", path, c.Args().First())
	}
}
