package localagent

import (
	"path/filepath"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
)

// Development defaults of the local providers' directories, relative to the
// server's working directory (the repository root in the dev stack).
var (
	// DefaultStateDir holds the per-instance identity directories.
	DefaultStateDir = filepath.Join("temp", "agents")
	// DefaultNodeDir is where dev-k8s reads Node JSON files.
	DefaultNodeDir = filepath.Join("temp", "dev-k8s", "nodes")
)

// NoNodes as node_dir turns the fake Node files off.
const NoNodes = "-"

// Dirs are the directory options both local kinds take.
type Dirs struct {
	StateDir string
	NodeDir  string
	WorkDir  string
}

// DefaultDirs returns the development defaults.
func DefaultDirs() Dirs { return Dirs{StateDir: DefaultStateDir, NodeDir: DefaultNodeDir} }

// Override replaces every directory the command line sets.
func (d *Dirs) Override(l provider.Local) {
	if l.StateDir != "" {
		d.StateDir = l.StateDir
	}
	if l.NodeDir != "" {
		d.NodeDir = l.NodeDir
	}
	if l.WorkDir != "" {
		d.WorkDir = l.WorkDir
	}
}

// NodeDirOrEmpty is NodeDir with NoNodes (or empty) meaning none.
func (d Dirs) NodeDirOrEmpty() string {
	if d.NodeDir == NoNodes {
		return ""
	}
	return d.NodeDir
}

// Validate reports a missing state directory (keys relative to shard.infra).
func (d Dirs) Validate() config.Errors {
	if d.StateDir == "" {
		return config.Errors{{Key: "shard.infra.options.state_dir", Reason: "must not be empty (default " + DefaultStateDir + ")"}}
	}
	return nil
}
