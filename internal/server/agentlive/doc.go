// Package agentlive is the live table of a leadership term's agents: what
// the Agent service heard from each instance (the latest health report,
// its agent version and termination notice, how many streams are open).
//
// The Agent service writes it; the reconciler reads it and holds the one
// change subscription, which tells it when an instance reported for the
// first time in the term, runs a new agent version or announced its
// termination. A table is built for one term and dropped with it: a server
// that leads again starts from an empty one and learns the fleet again
// from the agents' next reports.
package agentlive
