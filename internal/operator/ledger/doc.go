// Package ledger durably records the names of every group the operator has
// managed (created from Kubernetes or imported from a server), in a
// ConfigMap. The startup import skips recorded groups, so a group whose pool
// was deleted — while the server is still winding it down, or after a
// restart — is never imported again. It also records groups left on a shard without
// DeleteGroup (StateOrphaned: the shard was removed from the configuration, or
// abandoned while unreachable), which are deleted when the shard is back.
package ledger
