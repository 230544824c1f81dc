// Command nstance-server runs the control plane of one zone shard.
//
// Where things are: internal/server/cli reads the flags and calls app.New;
// internal/server/app is the server. Its Run (app.go) is the start-up
// sequence (config, cache, elections, bootstrap, leadership terms) and its
// Assemble (assemble.go) builds every service, the provider and the
// reconciler from the config, in one function.
package main

import (
	"os"

	"github.com/nstance-dev/nstance/internal/server/cli"
)

func main() {
	os.Exit(cli.Main(os.Args))
}
