package tmux

import (
	"context"
	"strconv"
	"strings"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/localagent"
)

// KindName selects this provider in shard.infra.provider.
const KindName = "tmux"

// DefaultCommand is what each window runs in the dev stack: the agent under
// Air, rebuilt on source changes.
const DefaultCommand = "air -c scripts/air/agent.toml"

// Options is shard.infra.options of the tmux kind. Every field may be
// overridden from the server's command line (provider.Local).
type Options struct {
	// Command is the shell command of each window (default DefaultCommand).
	Command string `json:"command"`
	// Session is the tmux session (default DefaultSession).
	Session string `json:"session"`
	// Socket is a private tmux server socket name (tmux -L); empty: the default server.
	Socket string `json:"socket"`
	// StateDir holds per-instance identity directories (default temp/agents).
	StateDir string `json:"state_dir"`
	// NodeDir receives fake Node JSON files (default temp/dev-k8s/nodes; "-" disables).
	NodeDir string `json:"node_dir"`
	// WorkDir is where windows start (default: the server's directory).
	WorkDir string `json:"work_dir"`
	// HealthPort gives each agent NSTANCE_HEALTH_ADDR on a loopback address
	// of its own with this port (Config.HealthPort); 0: none.
	HealthPort int `json:"health_port"`
}

// Kind registers the tmux provider with its development defaults.
func Kind() provider.Kind {
	return provider.Kind{Name: KindName, Config: func() provider.KindConfig {
		d := localagent.DefaultDirs()
		return &Options{Command: DefaultCommand, Session: DefaultSession, StateDir: d.StateDir, NodeDir: d.NodeDir}
	}}
}

func (o *Options) dirs() localagent.Dirs {
	return localagent.Dirs{StateDir: o.StateDir, NodeDir: o.NodeDir, WorkDir: o.WorkDir}
}

// Validate implements provider.KindConfig.
func (o *Options) Validate(*config.Config) config.Errors {
	errs := o.dirs().Validate()
	if strings.TrimSpace(o.Command) == "" {
		errs = append(errs, config.FieldError{Key: "shard.infra.options.command", Reason: "must not be empty (default " + DefaultCommand + ")"})
	}
	if o.Session == "" || strings.ContainsAny(o.Session, ":.=") {
		errs = append(errs, config.FieldError{Key: "shard.infra.options.session", Reason: "must be a non-empty name without ':', '.' or '=', got " + strconv.Quote(o.Session)})
	}
	if o.HealthPort < 0 || o.HealthPort > 65535 {
		errs = append(errs, config.FieldError{Key: "shard.infra.options.health_port", Reason: "must be a port (1-65535) or 0, got " + strconv.Itoa(o.HealthPort)})
	}
	return errs
}

// New implements provider.KindConfig.
func (o *Options) New(_ context.Context, env provider.Env) (provider.Provider, error) {
	c, d := *o, o.dirs()
	d.Override(env.Local)
	if env.Local.Command != "" {
		c.Command = env.Local.Command
	}
	if env.Local.Session != "" {
		c.Session = env.Local.Session
	}
	if env.Local.Socket != "" {
		c.Socket = env.Local.Socket
	}
	var shard string
	if env.Config != nil {
		shard = env.Config().Shard.ID
	}
	return New(Config{Command: c.Command, Session: c.Session, Socket: c.Socket, StateDir: d.StateDir,
		NodeDir: d.NodeDirOrEmpty(), WorkDir: d.WorkDir, Env: env.Local.Env, HealthPort: c.HealthPort, Shard: shard, Log: env.Log.WithName("tmux")})
}
