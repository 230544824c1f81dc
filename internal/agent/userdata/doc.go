// Package userdata runs an instance's own bootstrap script after the agent
// applied its first delivery of files, on providers without cloud-init (the
// development tmux and process providers hand the agent the script's path
// in NSTANCE_USER_DATA). The agent's own bootstrap has already happened by
// then, so nothing in the script can break it: the script runs as a child
// process in its own directory with the agent's environment, its output
// goes to the agent's log (the instance's log) and its exit status is
// logged. It runs once per agent start, the way a boot script runs once
// per boot: a local instance whose agent restarts has "rebooted", and what
// the script started (a kubelet) ended with the old agent. Data that is not
// a script ("#!" first) is left alone: on a cloud VM cloud-init consumes it.
package userdata
