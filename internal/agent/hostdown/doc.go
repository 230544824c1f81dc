// Package hostdown tells, when the agent is asked to stop, whether the host
// itself is shutting down: then the agent's last report carries a
// TERMINATION_KIND_SHUTDOWN notice and the server checks with the provider
// at once and replaces the instance, instead of waiting for missed reports.
// An agent that merely restarts (an upgrade, Air rebuilding it) says
// nothing, and the server replaces nothing.
//
// Mode auto asks systemd (`systemctl is-system-running` answers "stopping"
// while the system goes down) where systemd runs the host; always treats
// every stop as a host shutdown (a VM whose only reason to stop the agent is
// its own end); never says nothing.
package hostdown
