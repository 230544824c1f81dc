// Package machine reconciles NstanceMachines (individual instances): it
// creates the instance on the shard named by the owning Machine's
// failureDomain, polls it until it runs, reports providerID, readiness and
// addresses per the Cluster API contract, and deletes the instance behind a
// finalizer. An NstanceMachine that mirrors an instance of a pool's group
// (poolmachine.go) creates nothing; deleting it removes exactly that
// instance and lowers the MachinePool by one.
package machine
