// Command nstance-operator is the Nstance Cluster API infrastructure
// provider: it syncs Cluster API resources to the Nstance servers of every
// shard. Flags and environment variables: nstance-operator --help
// (internal/operator/cli).
package main

import (
	"os"

	"github.com/nstance-dev/nstance/internal/operator/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
