// Package localagent holds what the tmux and process providers share: the
// per-instance directory with the agent's identity files, the environment the
// agent is started with, and the fake Kubernetes Node JSON file written for
// dev-k8s.
package localagent
