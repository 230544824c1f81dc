package contextcmd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/admin/cmdutil"
	"github.com/nstance-dev/nstance/internal/admin/conn"
	"github.com/nstance-dev/nstance/internal/admin/contextfile"
	"github.com/nstance-dev/nstance/internal/admin/output"
	"github.com/nstance-dev/nstance/internal/admin/shard"
)

// Command returns the `context` command.
func Command() *cli.Command {
	return &cli.Command{
		Name:        "context",
		Usage:       "named connection settings (shard servers, CA, client certificate and key) kept in the context file",
		Subcommands: []*cli.Command{setCommand(), useCommand(), listCommand(), showCommand(), deleteCommand()},
	}
}

func pathFlag() cli.Flag {
	return &cli.StringFlag{Name: conn.FlagAdminConfig, EnvVars: []string{contextfile.EnvPath},
		Usage: "context file (default $XDG_CONFIG_HOME/nstance/admin.yaml, i.e. ~/.config/nstance/admin.yaml)"}
}

func flags(extra ...cli.Flag) []cli.Flag {
	return append(append([]cli.Flag{pathFlag(), output.Flag()}, extra...), cmdutil.LogFlags()...)
}

// view is a context as list, show, set and use print it.
type view struct {
	Name    string            `json:"name"`
	Current bool              `json:"current"`
	Servers map[string]string `json:"servers"`
	CACert  string            `json:"ca-cert"`
	Cert    string            `json:"cert"`
	Key     string            `json:"key"`
}

func viewOf(path string, f *contextfile.File, cx *contextfile.Context) view {
	servers := cx.Servers
	if servers == nil {
		servers = map[string]string{}
	}
	return view{Name: cx.Name, Current: f.CurrentContext == cx.Name, Servers: servers,
		CACert: contextfile.Resolve(path, cx.CACert), Cert: contextfile.Resolve(path, cx.Cert), Key: contextfile.Resolve(path, cx.Key)}
}

func printView(p *output.Printer, path string, v view) error {
	if p.Machine() {
		return p.Document(v)
	}
	return p.Fields("name", v.Name, "current", fmt.Sprint(v.Current), "servers", orDash(shard.FormatServers(v.Servers)),
		"ca-cert", orDash(v.CACert), "cert", orDash(v.Cert), "key", orDash(v.Key), "file", path)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// edit loads the file (an empty one when it does not exist yet), applies
// fn and saves the result. A file that does not parse is never written.
func edit(c *cli.Context, fn func(f *contextfile.File) error) (string, *contextfile.File, error) {
	path, err := conn.Path(c)
	if err != nil {
		return "", nil, err
	}
	f, err := contextfile.LoadOrEmpty(path)
	if err != nil {
		return "", nil, fmt.Errorf("%w; fix or move the file, it was left unchanged", err)
	}
	if err := fn(f); err != nil {
		return "", nil, err
	}
	if err := f.Save(path); err != nil {
		return "", nil, err
	}
	return path, f, nil
}

func oneName(c *cli.Context) (string, error) {
	if c.NArg() != 1 {
		return "", fmt.Errorf("want exactly one NAME argument, got %d", c.NArg())
	}
	name := c.Args().First()
	return name, contextfile.ValidateName(name)
}

// absFile turns a --ca-cert/--cert/--key value into an absolute path of a readable file.
func absFile(flag, p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("--%s %s: %w", flag, p, err)
	}
	fh, err := os.Open(abs)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", flag, err)
	}
	defer fh.Close()
	if st, err := fh.Stat(); err != nil || st.IsDir() {
		return "", fmt.Errorf("--%s %s is not a file", flag, abs)
	}
	return abs, nil
}

func setCommand() *cli.Command {
	return &cli.Command{
		Name:      "set",
		Usage:     "create a context or change the settings given; the first context becomes the current one",
		ArgsUsage: "NAME",
		Flags:     flags(conn.ContextSettingFlags()...),
		Action: func(c *cli.Context) error {
			p, err := output.New(c)
			if err != nil {
				return err
			}
			name, err := oneName(c)
			if err != nil {
				return err
			}
			// Check every value before touching the file.
			var servers map[string]string
			if c.IsSet(conn.FlagServers) {
				if servers, err = shard.ParseServers(c.String(conn.FlagServers)); err != nil {
					return err
				}
			}
			files := map[string]string{}
			for _, fl := range []string{conn.FlagCACert, conn.FlagCert, conn.FlagKey} {
				if c.IsSet(fl) {
					if files[fl], err = absFile(fl, c.String(fl)); err != nil {
						return err
					}
				}
			}
			created := false
			path, f, err := edit(c, func(f *contextfile.File) error {
				cx := contextfile.Context{Name: name}
				if old, err := f.Get(name); err == nil {
					cx = *old
				} else {
					created = true
				}
				if servers != nil {
					cx.Servers = servers
				}
				for fl, v := range files {
					switch fl {
					case conn.FlagCACert:
						cx.CACert = v
					case conn.FlagCert:
						cx.Cert = v
					case conn.FlagKey:
						cx.Key = v
					}
				}
				f.Upsert(cx)
				if f.CurrentContext == "" {
					f.CurrentContext = name
				}
				return nil
			})
			if err != nil {
				return err
			}
			cx, _ := f.Get(name)
			if p.Machine() {
				return p.Document(viewOf(path, f, cx))
			}
			verb := "updated"
			if created {
				verb = "created"
			}
			note := ""
			if f.CurrentContext == name {
				note = " (current)"
			}
			_, err = fmt.Fprintf(p.W, "context %s %s in %s%s\n", name, verb, path, note)
			return err
		},
	}
}

func useCommand() *cli.Command {
	return &cli.Command{
		Name: "use", Usage: "make a context the current one", ArgsUsage: "NAME", Flags: flags(),
		Action: func(c *cli.Context) error {
			p, err := output.New(c)
			if err != nil {
				return err
			}
			name, err := oneName(c)
			if err != nil {
				return err
			}
			path, f, err := edit(c, func(f *contextfile.File) error {
				if _, err := f.Get(name); err != nil {
					return err
				}
				f.CurrentContext = name
				return nil
			})
			if err != nil {
				return err
			}
			cx, _ := f.Get(name)
			if p.Machine() {
				return p.Document(viewOf(path, f, cx))
			}
			_, err = fmt.Fprintf(p.W, "current context is now %s (%s)\n", name, path)
			return err
		},
	}
}

func deleteCommand() *cli.Command {
	return &cli.Command{
		Name: "delete", Usage: "remove a context", ArgsUsage: "NAME", Flags: flags(),
		Action: func(c *cli.Context) error {
			p, err := output.New(c)
			if err != nil {
				return err
			}
			name, err := oneName(c)
			if err != nil {
				return err
			}
			path, _, err := edit(c, func(f *contextfile.File) error { return f.Delete(name) })
			if err != nil {
				return err
			}
			if p.Machine() {
				return p.Document(struct {
					Deleted string `json:"deleted"`
					File    string `json:"file"`
				}{name, path})
			}
			_, err = fmt.Fprintf(p.W, "context %s deleted from %s\n", name, path)
			return err
		},
	}
}

// load reads the file for the read-only commands; a missing file is an error.
func load(c *cli.Context) (string, *contextfile.File, error) {
	path, err := conn.Path(c)
	if err != nil {
		return "", nil, err
	}
	f, err := contextfile.Load(path)
	return path, f, err
}

func listCommand() *cli.Command {
	return &cli.Command{
		Name: "list", Usage: "list the contexts", Flags: flags(),
		Action: func(c *cli.Context) error {
			p, err := output.New(c)
			if err != nil {
				return err
			}
			path, f, err := load(c)
			if errors.Is(err, contextfile.ErrNotExist) {
				f, err = &contextfile.File{}, nil
			}
			if err != nil {
				return err
			}
			if p.Machine() {
				list := output.List{Items: []output.Object{}}
				for i := range f.Contexts {
					list.Items = append(list.Items, viewOf(path, f, &f.Contexts[i]))
				}
				return p.Document(list)
			}
			rows := output.Rows{Header: []string{"CURRENT", "NAME", "SERVERS"}}
			for i := range f.Contexts {
				cx := &f.Contexts[i]
				mark := ""
				if cx.Name == f.CurrentContext {
					mark = "*"
				}
				rows.Add(mark, cx.Name, orDash(shard.FormatServers(cx.Servers)))
			}
			return p.Table(rows)
		},
	}
}

func showCommand() *cli.Command {
	return &cli.Command{
		Name: "show", Usage: "show a context (default: the current one)", ArgsUsage: "[NAME]", Flags: flags(),
		Action: func(c *cli.Context) error {
			p, err := output.New(c)
			if err != nil {
				return err
			}
			if c.NArg() > 1 {
				return fmt.Errorf("want at most one NAME argument, got %d", c.NArg())
			}
			path, f, err := load(c)
			if err != nil {
				return err
			}
			cx, err := f.Current(c.Args().First())
			if err != nil {
				return fmt.Errorf("context file %s: %w", path, err)
			}
			return printView(p, path, viewOf(path, f, cx))
		},
	}
}
