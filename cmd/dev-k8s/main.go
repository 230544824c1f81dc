// Command dev-k8s is a development Kubernetes API server whose objects are
// JSON files under --dir.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/zapr"
	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/nstance-dev/nstance/internal/devk8s/app"
)

func main() {
	cliApp := &cli.App{
		Name:  "dev-k8s",
		Usage: "Kubernetes API server for development; objects are JSON files",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "addr", Value: ":6443", Usage: "listen address"},
			&cli.StringFlag{Name: "dir", Value: "temp/dev-k8s", Usage: "data directory"},
			&cli.BoolFlag{Name: "tls", Value: true, Usage: "serve HTTPS with a generated CA (false: plain HTTP)"},
			&cli.StringFlag{Name: "kubeconfig-out", Usage: "write a kubeconfig for clients to this path"},
			&cli.StringSliceFlag{Name: "crd-dir", Usage: "CRD file or directory to install at start (repeatable)"},
			&cli.BoolFlag{Name: "controllers", Value: true, Usage: "run garbage collection, namespace deletion, pod termination and PDB status"},
		},
		Action: run,
	}
	if err := cliApp.Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "dev-k8s:", err)
		os.Exit(1)
	}
}

func run(c *cli.Context) error {
	zl, err := zap.NewDevelopment()
	if err != nil {
		return fmt.Errorf("create logger: %w", err)
	}
	defer func() { _ = zl.Sync() }()
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	running, err := app.Start(ctx, zapr.NewLogger(zl), app.Config{
		Addr:          c.String("addr"),
		Dir:           c.String("dir"),
		TLS:           c.Bool("tls"),
		KubeconfigOut: c.String("kubeconfig-out"),
		CRDPaths:      c.StringSlice("crd-dir"),
		Controllers:   c.Bool("controllers"),
	})
	if err != nil {
		return err
	}
	return running.Wait()
}
