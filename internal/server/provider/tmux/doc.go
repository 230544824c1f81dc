// Package tmux is the development provider: each instance is a tmux window
// named nstance-agent-{instanceID} in a dedicated session (default
// nstance-dev-agents) running the agent command (in the dev stack
// `air -c scripts/air/agent.toml`; any long-running command works). The
// agent's nonce and CA are written to {StateDir}/{instanceID}/identity and
// passed through NSTANCE_* environment variables. A fake Kubernetes Node
// {NodeDir}/{instanceID}.json is written with spec.providerID equal to the
// provider id the server reports. Delete kills the window and removes both.
// Status comes from tmux itself (window present, pane alive).
//
// Several shards may share one session (the dev stack's two do): every
// window carries its shard in the window option @nstance-shard
// (ShardOption), and a provider lists, reports and deletes only windows of
// its own shard, so one shard's orphan collection never deletes another's
// agents. Windows without the marker (made before it existed) are listed by
// no shard and logged once; the shard holding the instance's record adopts
// such a window when it asks for its Status or creates it again.
package tmux
