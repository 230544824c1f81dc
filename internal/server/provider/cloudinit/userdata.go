package cloudinit

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/localagent"
)

// Defaults of Agent.
const (
	DefaultAgentStateDir = "/var/lib/nstance-agent"
	DefaultAgentEnvFile  = "/etc/nstance/agent.env"
	DefaultAgentStart    = "systemctl enable --now nstance-agent.service"
)

// Agent says where the bootstrap script puts the agent's files and how it
// starts the agent the image carries.
type Agent struct {
	// StateDir is the agent's data directory; identity files go to
	// {StateDir}/identity (default /var/lib/nstance-agent).
	StateDir string `json:"state_dir"`
	// EnvFile receives the NSTANCE_* settings as KEY=VALUE lines (a systemd
	// EnvironmentFile; default /etc/nstance/agent.env).
	EnvFile string `json:"env_file"`
	// Start is the shell command that starts the agent (default
	// "systemctl enable --now nstance-agent.service").
	Start string `json:"start"`
}

// DefaultAgent returns the agent settings with every default set.
func DefaultAgent() Agent {
	return Agent{StateDir: DefaultAgentStateDir, EnvFile: DefaultAgentEnvFile, Start: DefaultAgentStart}
}

// Validate returns what is wrong with a, by field name (state_dir,
// env_file, start).
func (a Agent) Validate() map[string]string {
	out := map[string]string{}
	for _, f := range []struct{ key, v string }{{"state_dir", a.StateDir}, {"env_file", a.EnvFile}} {
		if !path.IsAbs(f.v) || strings.ContainsAny(f.v, "'\n") {
			out[f.key] = fmt.Sprintf("want an absolute path without quotes or newlines, got %q", f.v)
		}
	}
	if strings.TrimSpace(a.Start) == "" {
		out["start"] = "must not be empty"
	}
	return out
}

// AgentEnv returns the agent's settings for req as sorted KEY=VALUE lines:
// the variables the local providers pass (localagent.Env, with the identity
// directory under agent.StateDir) plus extra (e.g. the metrics interval).
func AgentEnv(agent Agent, req provider.CreateRequest, extra []string) []string {
	m := map[string]string{}
	for _, kv := range localagent.Env(agent.StateDir, req) {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	// localagent puts identity under {StateDir}/{id}/identity; on a machine
	// of its own the agent's directory holds one instance.
	m[localagent.EnvIdentityDir] = path.Join(agent.StateDir, "identity")
	// The instance's own bootstrap data is cloud-init's (Compose),
	// not the agent's to run.
	delete(m, localagent.EnvUserData)
	// extra wins (e.g. NSTANCE_SPOT_NOTICE=off, the metrics interval).
	for _, kv := range extra {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// AgentScript renders the cloud-init compatible user-data script (a "#!"
// script, which cloud-init runs once on first boot) that hands the agent
// what it needs: the registration nonce ({StateDir}/identity/nonce.jwt, mode
// 0600), the cluster CA bundle (ca.crt), and its settings (instance id,
// provider id, shard, server addresses) in agent.EnvFile; then it runs
// agent.Start. File contents travel base64-encoded, so nothing in them can
// break out of the script.
func AgentScript(agent Agent, req provider.CreateRequest, extra []string) ([]byte, error) {
	if req.AgentNonce == "" {
		return nil, fmt.Errorf("user data: no agent nonce")
	}
	for _, kv := range extra {
		if strings.ContainsAny(kv, "\n\r") || !strings.Contains(kv, "=") {
			return nil, fmt.Errorf("user data: bad agent environment entry %q", kv)
		}
	}
	identity := path.Join(agent.StateDir, "identity")
	env := strings.Join(AgentEnv(agent, req, extra), "\n") + "\n"
	var b bytes.Buffer
	b.WriteString("#!/bin/sh\n")
	b.WriteString("# nstance agent bootstrap, written by nstance-server for instance " + req.InstanceID + "\n")
	b.WriteString("set -eu\numask 077\n")
	fmt.Fprintf(&b, "mkdir -p '%s' '%s'\n", identity, path.Dir(agent.EnvFile))
	file := func(name string, mode string, content []byte) {
		fmt.Fprintf(&b, "printf '%%s' '%s' | base64 -d > '%s.tmp'\n", base64.StdEncoding.EncodeToString(content), name)
		fmt.Fprintf(&b, "chmod %s '%s.tmp'\nmv -f '%s.tmp' '%s'\n", mode, name, name, name)
	}
	file(path.Join(identity, localagent.NonceFile), "0600", []byte(req.AgentNonce))
	file(path.Join(identity, localagent.CAFile), "0644", req.CACertPEM)
	file(agent.EnvFile, "0600", []byte(env))
	b.WriteString(agent.Start + "\n")
	return b.Bytes(), nil
}
