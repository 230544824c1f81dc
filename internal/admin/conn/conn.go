package conn

import (
	"errors"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/admin/contextfile"
	"github.com/nstance-dev/nstance/internal/admin/shard"
)

// Flag names.
const (
	FlagServers     = "servers"
	FlagCACert      = "ca-cert"
	FlagCert        = "cert"
	FlagKey         = "key"
	FlagAdminConfig = "admin-config"
	FlagContext     = "context"
	FlagShard       = "shard"
	FlagAllShards   = "all-shards"
)

// FileFlags are --admin-config and --context.
func FileFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: FlagAdminConfig, EnvVars: []string{contextfile.EnvPath},
			Usage: "context file (default $XDG_CONFIG_HOME/nstance/admin.yaml, i.e. ~/.config/nstance/admin.yaml)"},
		&cli.StringFlag{Name: FlagContext, EnvVars: []string{"NSTANCE_ADMIN_CONTEXT"}, Usage: "context to use instead of the current one"},
	}
}

// SettingFlags are the four connection settings a context holds, each with
// its NSTANCE_ADMIN_* variable.
func SettingFlags() []cli.Flag { return settingFlags(true) }

// ContextSettingFlags are SettingFlags without the variables, for `context
// set`: a context holds what was typed, not what the shell happened to export.
func ContextSettingFlags() []cli.Flag { return settingFlags(false) }

func settingFlags(withEnv bool) []cli.Flag {
	env := func(v string) []string {
		if withEnv {
			return []string{v}
		}
		return nil
	}
	return []cli.Flag{
		&cli.StringFlag{Name: FlagServers, Usage: "shard Operator endpoints, shard=host:port,...", EnvVars: env("NSTANCE_ADMIN_SERVERS")},
		&cli.StringFlag{Name: FlagCACert, Usage: "cluster CA certificate (PEM)", EnvVars: env("NSTANCE_ADMIN_CA_CERT")},
		&cli.StringFlag{Name: FlagCert, Usage: "operator client certificate (PEM)", EnvVars: env("NSTANCE_ADMIN_CERT")},
		&cli.StringFlag{Name: FlagKey, Usage: "operator client key (PEM)", EnvVars: env("NSTANCE_ADMIN_KEY")},
	}
}

// Flags are the connection flags of a command acting on shards; with
// selectMany it also takes --all-shards.
func Flags(selectMany bool) []cli.Flag {
	fs := append(SettingFlags(), FileFlags()...)
	if selectMany {
		return append(fs,
			&cli.StringFlag{Name: FlagShard, Usage: "shard to act on (optional when only one is configured)"},
			&cli.BoolFlag{Name: FlagAllShards, Usage: "act on every configured shard"})
	}
	return append(fs, &cli.StringFlag{Name: FlagShard, Usage: "look only on this shard (default: every configured shard)"})
}

// Path returns the context file path: --admin-config, $NSTANCE_ADMIN_CONFIG, or the default.
func Path(c *cli.Context) (string, error) {
	if p := c.String(FlagAdminConfig); p != "" {
		return p, nil
	}
	return contextfile.DefaultPath()
}

// Settings are the resolved connection settings.
type Settings struct {
	Servers           map[string]string
	CACert, Cert, Key string
	// Context is the name of the context that filled in settings, if any.
	Context string
}

// Resolve applies flag > environment > context. The context file is read
// only when a setting is still missing or --context names a context; a
// file that does not parse is then an error, never ignored.
func Resolve(c *cli.Context) (Settings, error) {
	var s Settings
	if c.IsSet(FlagServers) {
		servers, err := shard.ParseServers(c.String(FlagServers))
		if err != nil {
			return s, err
		}
		s.Servers = servers
	}
	if c.IsSet(FlagCACert) {
		s.CACert = c.String(FlagCACert)
	}
	if c.IsSet(FlagCert) {
		s.Cert = c.String(FlagCert)
	}
	if c.IsSet(FlagKey) {
		s.Key = c.String(FlagKey)
	}
	complete := func() bool { return len(s.Servers) > 0 && s.CACert != "" && s.Cert != "" && s.Key != "" }
	fileNote := ""
	if !complete() || c.String(FlagContext) != "" {
		path, err := Path(c)
		if err != nil {
			return s, err
		}
		f, err := contextfile.Load(path)
		switch {
		case errors.Is(err, contextfile.ErrNotExist) && c.String(FlagContext) == "":
			fileNote = fmt.Sprintf(" (no context file at %s)", path)
		case err != nil:
			return s, err
		default:
			cx, err := f.Current(c.String(FlagContext))
			if err != nil {
				return s, fmt.Errorf("context file %s: %w", path, err)
			}
			s.Context = cx.Name
			if len(s.Servers) == 0 {
				s.Servers = cx.Servers
			}
			for _, p := range []struct {
				dst *string
				v   string
			}{{&s.CACert, cx.CACert}, {&s.Cert, cx.Cert}, {&s.Key, cx.Key}} {
				if *p.dst == "" {
					*p.dst = contextfile.Resolve(path, p.v)
				}
			}
			fileNote = fmt.Sprintf(" (context %q in %s does not set it)", cx.Name, path)
		}
	}
	if len(s.Servers) == 0 {
		return s, fmt.Errorf("no shard servers: pass --servers shard=host:port,... or set them in a context (nstance-admin context set NAME --servers ...)%s", fileNote)
	}
	var missing []string
	for _, m := range []struct{ name, v string }{{"--" + FlagCACert, s.CACert}, {"--" + FlagCert, s.Cert}, {"--" + FlagKey, s.Key}} {
		if m.v == "" {
			missing = append(missing, m.name)
		}
	}
	if len(missing) > 0 {
		return s, fmt.Errorf("--ca-cert, --cert and --key are required (operator certificate from registration); missing %s%s", strings.Join(missing, ", "), fileNote)
	}
	return s, nil
}

// Dial resolves the settings and connects to every configured shard.
func Dial(c *cli.Context) (*shard.Set, Settings, error) {
	s, err := Resolve(c)
	if err != nil {
		return nil, s, err
	}
	tc, err := shard.Credentials{CACertFile: s.CACert, CertFile: s.Cert, KeyFile: s.Key}.TLSConfig()
	if err != nil {
		return nil, s, err
	}
	set, err := shard.Dial(s.Servers, tc)
	if err != nil {
		return nil, s, err
	}
	return set, s, nil
}

// Select picks the shards a command acts on from --shard and --all-shards.
func Select(c *cli.Context, set *shard.Set) ([]string, error) {
	return set.Select(c.String(FlagShard), c.Bool(FlagAllShards))
}
