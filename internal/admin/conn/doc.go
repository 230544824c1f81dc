// Package conn resolves how an nstance-admin command reaches the shard
// servers: --servers, --ca-cert, --cert and --key, each from its flag, else
// its NSTANCE_ADMIN_* variable, else the selected context of the context
// file (--context, else the file's current context). It also picks the
// shards a command acts on (--shard, --all-shards).
package conn
