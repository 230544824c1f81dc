// Package contextfile reads and writes nstance-admin's context file, the
// kubeconfig of the admin CLI: named contexts, each holding the four
// connection settings (shard servers, CA certificate, client certificate and
// key), and the name of the current one. The file is YAML, read strictly
// (unknown keys and duplicates are errors), written atomically with mode
// 0600, and never written when the existing file does not parse.
package contextfile
