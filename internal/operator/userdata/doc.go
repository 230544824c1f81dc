// Package userdata reads the bootstrap data Cluster API hands an
// infrastructure provider: the Secret named by a Machine's (or a
// MachinePool template's) spec.bootstrap.dataSecretName, key "value" (the
// data, required) and key "format" ("cloud-config", the default, or
// "ignition"). The machine controller sends it with CreateInstance, the
// shard group controller with UpsertGroup; the server keeps the bytes and
// reports their SHA256 (Hash), which is how the operator tells whether a
// group already carries the data it wants.
//
// The content is never logged, nor put into events, conditions or errors:
// only the Secret's name, its size and its hash are.
package userdata
