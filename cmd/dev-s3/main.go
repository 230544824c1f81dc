// Command dev-s3 serves one S3 bucket from a directory of plain files for
// development. See internal/devs3.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/devs3"
)

func main() {
	app := &cli.App{
		Name:  "dev-s3",
		Usage: "S3 server for development: one bucket mapped onto a directory",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "addr", Value: devs3.DefaultAddr, EnvVars: []string{"DEV_S3_ADDR"}, Usage: "listen address"},
			&cli.StringFlag{Name: "bucket", Value: devs3.DefaultBucket, EnvVars: []string{"DEV_S3_BUCKET"}, Usage: "bucket name"},
			&cli.StringFlag{Name: "dir", Value: devs3.DefaultDir, EnvVars: []string{"DEV_S3_DIR"}, Usage: "directory holding the objects (created when missing)"},
			&cli.StringFlag{Name: "log-level", Value: "info", EnvVars: []string{"DEV_S3_LOG_LEVEL"}, Usage: "debug (logs every request), info, warn or error"},
		},
		Action: run,
	}
	if err := app.Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "dev-s3:", err)
		os.Exit(1)
	}
}

func run(c *cli.Context) error {
	log, sync, err := devs3.NewLogger(c.String("log-level"))
	if err != nil {
		return err
	}
	defer sync()
	srv, err := devs3.New(devs3.Config{Bucket: c.String("bucket"), Dir: c.String("dir"), Log: log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.String("addr"))
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.String("addr"), err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return srv.Serve(ctx, ln)
}
