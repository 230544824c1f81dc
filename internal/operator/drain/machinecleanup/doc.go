// Package machinecleanup removes the Cluster API objects that stood for an
// instance the Nstance server deleted: the owning Machine when there is one
// (core Cluster API then deletes the NstanceMachine and the Node), else the
// NstanceMachine itself. The Machine is first annotated so that Cluster API
// neither drains the Node of the gone VM again nor waits for its volumes to
// detach.
package machinecleanup
