package cmdutil

import (
	"github.com/go-logr/logr"
	"github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/logging"
)

// EnvPrefix is the environment prefix of nstance-admin's shared flags.
const EnvPrefix = "NSTANCE"

// LogFlags are --log-level and --log-format.
func LogFlags() []cli.Flag { return logging.CLIFlags(EnvPrefix) }

// Logger builds the logger from the logging flags; it writes to the app's
// ErrWriter (stderr). Call the returned function before exiting.
func Logger(c *cli.Context) (logr.Logger, func(), error) {
	return logging.New(logging.FromCLI(c), c.App.ErrWriter)
}
