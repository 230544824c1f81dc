// Command dev-s3 serves one S3 bucket from a directory of plain files for
// development. See cmd/dev-s3/README.md and internal/devs3.
package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/cliconv"
	"github.com/nstance-dev/nstance/internal/devs3"
	"github.com/nstance-dev/nstance/internal/logging"
	"github.com/nstance-dev/nstance/internal/version"
)

const envPrefix = "DEV_S3"

func env(name string) []string { return []string{envPrefix + "_" + name} }

func main() {
	app := &cli.App{
		Name:  "dev-s3",
		Usage: "S3 server for development: one bucket mapped onto a directory",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "addr", Value: devs3.DefaultAddr, EnvVars: env("ADDR"), Usage: "listen address; loopback by default (e.g. 0.0.0.0:8989 to accept other machines)"},
			&cli.StringFlag{Name: "bucket", Value: devs3.DefaultBucket, EnvVars: env("BUCKET"), Usage: "bucket name"},
			&cli.StringFlag{Name: "dir", Value: devs3.DefaultDir, EnvVars: env("DIR"), Usage: "directory holding the objects (created when missing)"},
			&cli.StringFlag{Name: "access-key", EnvVars: env("ACCESS_KEY"), Usage: "require AWS Signature V4 with this access key (with --secret-key); unset: any credentials work"},
			&cli.StringFlag{Name: "secret-key", EnvVars: env("SECRET_KEY"), Usage: "secret key for --access-key"},
			&cli.StringSliceFlag{Name: "allowed-host", EnvVars: env("ALLOWED_HOST"), Usage: "host name (or host:port) clients use besides IP addresses and localhost (repeatable; comma-separated in the variable); requests naming any other Host are refused (DNS rebinding)"},
			&cli.DurationFlag{Name: "upload-expiry", Value: devs3.DefaultUploadExpiry, EnvVars: env("UPLOAD_EXPIRY"), Usage: "remove multipart uploads not completed within this time"},
		}, logging.CLIFlags(envPrefix)...),
		Action: run,
	}
	os.Exit(cliconv.Report(os.Stderr, app.Name, cliconv.Configure(app).Run(os.Args)))
}

func run(c *cli.Context) error {
	log, flush, err := logging.New(logging.FromCLI(c), nil)
	if err != nil {
		return cliconv.Usage(err)
	}
	defer flush()
	logging.Started(log, "dev-s3", version.Version)
	// Before anything is announced, so a SIGTERM right after start stops
	// gracefully.
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if c.Duration("upload-expiry") <= 0 {
		return cliconv.Usagef("--upload-expiry must be positive, got %s", c.Duration("upload-expiry"))
	}
	srv, err := devs3.New(devs3.Config{
		Bucket: c.String("bucket"), Dir: c.String("dir"), Log: log,
		AccessKey: c.String("access-key"), SecretKey: c.String("secret-key"),
		UploadExpiry: c.Duration("upload-expiry"), AllowedHosts: c.StringSlice("allowed-host"),
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.String("addr"))
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.String("addr"), err)
	}
	fmt.Fprint(c.App.Writer, srv.Usage(ln.Addr()))
	return srv.Serve(ctx, ln)
}
