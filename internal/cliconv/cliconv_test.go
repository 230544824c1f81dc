package cliconv

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
	ucli "github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/version"
)

func TestReport(t *testing.T) {
	tests := []struct {
		name string
		err  error
		code int
		out  string
	}{
		{"nil", nil, 0, ""},
		{"usage", Usagef("--port %d: out of range", 0), 2, "p: --port 0: out of range\nRun 'p --help' for usage.\n"},
		{"wrapped usage, several lines", fmt.Errorf("parse: %w", Usage(errors.Join(errors.New("a"), errors.New("b")))), 2, "p: parse: a; b\nRun 'p --help' for usage.\n"},
		{"runtime", errors.New("reading /x: no such file"), 1, "p: reading /x: no such file\n"},
		{"already prefixed", errors.New("p: bucket directory /x is a file"), 1, "p: bucket directory /x is a file\n"},
		{"exit coder without a message", ucli.Exit("", 3), 3, ""},
		{"exit coder 2 gets the hint", ucli.Exit("bad", 2), 2, "p: bad\nRun 'p --help' for usage.\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			require.Equal(t, tc.code, Report(&out, "p", tc.err))
			require.Equal(t, tc.out, out.String())
		})
	}
	require.Nil(t, Usage(nil))
	u := Usagef("x")
	require.Same(t, u, Usage(u), "not wrapped twice")
}

func run(t *testing.T, app *ucli.App, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	app.Writer, app.ErrWriter = &out, &errOut
	code := Report(&errOut, app.Name, Configure(app).Run(append([]string{app.Name}, args...)))
	return code, out.String(), errOut.String()
}

func TestConfigureFlagsOnly(t *testing.T) {
	newApp := func() *ucli.App {
		return &ucli.App{
			Name: "flagsonly",
			Flags: []ucli.Flag{
				&ucli.StringFlag{Name: "shard", Required: true, EnvVars: []string{"FLAGSONLY_SHARD"}},
				&ucli.IntFlag{Name: "port"},
			},
			Action: func(c *ucli.Context) error { fmt.Fprintln(c.App.Writer, "ran", c.String("shard")); return nil },
		}
	}
	tests := []struct {
		name      string
		args      []string
		code      int
		out, errs string
	}{
		{"runs", []string{"--shard", "s"}, 0, "ran s\n", ""},
		{"bad flag", []string{"--bogus"}, 2, "", "flagsonly: flag provided but not defined: -bogus\nRun 'flagsonly --help' for usage.\n"},
		{"bad value", []string{"--shard=s", "--port=x"}, 2, "", "flagsonly: invalid value \"x\" for flag -port: parse error\nRun 'flagsonly --help' for usage.\n"},
		{"missing required", nil, 2, "", "flagsonly: required flag --shard not set (or FLAGSONLY_SHARD)\nRun 'flagsonly --help' for usage.\n"},
		{"argument", []string{"--shard", "s", "extra"}, 2, "", "flagsonly: unexpected argument \"extra\" (only flags are taken)\nRun 'flagsonly --help' for usage.\n"},
		{"help", []string{"--help"}, 0, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := run(t, newApp(), tc.args...)
			require.Equal(t, tc.code, code, "stdout %q stderr %q", out, errs)
			require.Equal(t, tc.errs, errs)
			if tc.name == "help" {
				require.Contains(t, out, "--shard")
			} else {
				require.Equal(t, tc.out, out)
			}
		})
	}
	t.Setenv("FLAGSONLY_SHARD", "env")
	code, out, _ := run(t, newApp())
	require.Equal(t, 0, code)
	require.Equal(t, "ran env\n", out, "a required flag set by its variable counts")

	code, out, _ = run(t, newApp(), "--version")
	require.Equal(t, 0, code)
	require.Regexp(t, regexp.MustCompile(version.Pattern("flagsonly")), out[:len(out)-1])
}

func TestConfigureCommands(t *testing.T) {
	newApp := func() *ucli.App {
		return &ucli.App{Name: "cmds", Commands: []*ucli.Command{{
			Name: "group", Subcommands: []*ucli.Command{{
				Name: "get", Flags: []ucli.Flag{&ucli.StringFlag{Name: "o"}},
				Action: func(c *ucli.Context) error { fmt.Fprintln(c.App.Writer, "got", c.Args().Slice()); return nil },
			}},
		}}}
	}
	tests := []struct {
		args []string
		code int
		errs string
	}{
		{[]string{"group", "get", "a"}, 0, ""},
		{[]string{"nope"}, 2, "cmds: unknown command \"nope\"\nRun 'cmds --help' for usage.\n"},
		{[]string{"group", "nope"}, 2, "cmds: group: unknown command \"nope\"\nRun 'cmds --help' for usage.\n"},
		{[]string{"group", "get", "--bogus"}, 2, "cmds: group get: flag provided but not defined: -bogus\nRun 'cmds --help' for usage.\n"},
		{[]string{"version", "x"}, 2, "cmds: version: unexpected argument \"x\"\nRun 'cmds --help' for usage.\n"},
		{[]string{"--bogus"}, 2, "cmds: flag provided but not defined: -bogus\nRun 'cmds --help' for usage.\n"},
	}
	for _, tc := range tests {
		code, out, errs := run(t, newApp(), tc.args...)
		require.Equal(t, tc.code, code, "%v: stdout %q stderr %q", tc.args, out, errs)
		require.Equal(t, tc.errs, errs, "%v", tc.args)
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, _ := run(t, newApp(), args...)
		require.Equal(t, 0, code)
		require.Regexp(t, regexp.MustCompile(version.Pattern("cmds")), out[:len(out)-1], "%v", args)
	}
	code, out, _ := run(t, newApp())
	require.Equal(t, 0, code)
	require.Contains(t, out, "group", "no command: the help")
}
