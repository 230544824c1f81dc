package process

import (
	"context"
	"strings"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/localagent"
)

// KindName selects this provider in shard.infra.provider.
const KindName = "process"

// DefaultCommand is the agent binary `make build` produces.
const DefaultCommand = "bin/nstance-agent"

// Options is shard.infra.options of the process kind. Every field may be
// overridden from the server's command line (provider.Local).
type Options struct {
	// Command is the agent command line, split on white space (default DefaultCommand).
	Command string `json:"command"`
	// StateDir holds per-instance identity directories and process records (default temp/agents).
	StateDir string `json:"state_dir"`
	// NodeDir receives fake Node JSON files (default temp/dev-k8s/nodes; "-" disables).
	NodeDir string `json:"node_dir"`
	// WorkDir is the children's working directory (default: the server's).
	WorkDir string `json:"work_dir"`
	// Nice (0-19) lowers the agents' CPU priority below the server's
	// (process.Config.Nice; default 0).
	Nice int `json:"nice"`
}

// Kind registers the process provider with its development defaults.
func Kind() provider.Kind {
	return provider.Kind{Name: KindName, Config: func() provider.KindConfig {
		d := localagent.DefaultDirs()
		return &Options{Command: DefaultCommand, StateDir: d.StateDir, NodeDir: d.NodeDir}
	}}
}

// Validate implements provider.KindConfig.
func (o *Options) Validate(*config.Config) config.Errors {
	errs := localagent.Dirs{StateDir: o.StateDir}.Validate()
	if len(strings.Fields(o.Command)) == 0 {
		errs = append(errs, config.FieldError{Key: "shard.infra.options.command", Reason: "must not be empty (default " + DefaultCommand + ")"})
	}
	if o.Nice < 0 || o.Nice > 19 {
		errs = append(errs, config.FieldError{Key: "shard.infra.options.nice", Reason: "must be within 0-19"})
	}
	return errs
}

// New implements provider.KindConfig.
func (o *Options) New(_ context.Context, env provider.Env) (provider.Provider, error) {
	d := localagent.Dirs{StateDir: o.StateDir, NodeDir: o.NodeDir, WorkDir: o.WorkDir}
	d.Override(env.Local)
	cmd := o.Command
	if env.Local.Command != "" {
		cmd = env.Local.Command
	}
	return New(Config{Command: strings.Fields(cmd), StateDir: d.StateDir, NodeDir: d.NodeDirOrEmpty(), WorkDir: d.WorkDir, Env: env.Local.Env, Nice: o.Nice})
}
