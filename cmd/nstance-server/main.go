// Command nstance-server runs the control plane of one zone shard.
package main

import (
	"fmt"
	"os"

	"github.com/nstance-dev/nstance/internal/server/cli"
)

func main() {
	if err := cli.App().Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
