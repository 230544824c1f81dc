// Package importer runs once when the operator becomes leader: groups found
// on the shards that Kubernetes does not know yet become an
// NstanceMachinePool plus a MachinePool. Groups recorded in the ledger —
// every group the operator ever managed, including pools being or already
// deleted — are never imported again, so after the import Kubernetes alone
// decides what the servers run.
package importer
