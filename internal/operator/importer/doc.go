// Package importer runs once when the operator becomes leader: groups found
// on the shards that Kubernetes does not know yet become an
// NstanceMachinePool plus a MachinePool; static groups (from a shard's config
// file) too, with the pool annotated static so the webhook refuses changes
// the server would refuse. Groups recorded in the ledger —
// every group the operator ever managed, including pools being or already
// deleted — are never imported again, so after the import Kubernetes alone
// decides what the servers run.
package importer
