// Package clustercmd implements `nstance-admin cluster ...`: `nonce` mints an
// operator registration nonce with the cluster's encrypted nonce-signing key
// read from object storage, and `register-operator` registers an operator
// identity with a shard's Registration service and writes the CA, key and
// certificate for CLI use.
package clustercmd
