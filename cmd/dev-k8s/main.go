// Command dev-k8s is a development Kubernetes API server whose objects are
// JSON files under --dir. See cmd/dev-k8s/README.md and internal/devk8s.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/cliconv"
	"github.com/nstance-dev/nstance/internal/devk8s/app"
	"github.com/nstance-dev/nstance/internal/logging"
	"github.com/nstance-dev/nstance/internal/version"
)

const envPrefix = "DEV_K8S"

func env(name string) []string { return []string{envPrefix + "_" + name} }

func main() {
	cliApp := &cli.App{
		Name:  "dev-k8s",
		Usage: "Kubernetes API server for development; objects are JSON files",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "addr", Value: app.DefaultAddr, EnvVars: env("ADDR"), Usage: "listen address; loopback by default (e.g. 0.0.0.0:6443 to accept other machines)"},
			&cli.StringFlag{Name: "dir", Value: "temp/dev-k8s", EnvVars: env("DIR"), Usage: "data directory: objects as JSON files, state, and the kubeconfig"},
			&cli.BoolFlag{Name: "tls", Value: true, EnvVars: env("TLS"), Usage: "serve HTTPS with a generated CA (false: plain HTTP, where client-go sends no token)"},
			&cli.StringSliceFlag{Name: "tls-san", EnvVars: env("TLS_SAN"), Usage: "extra host name or IP for the serving certificate (repeatable)"},
			&cli.StringSliceFlag{Name: "allowed-host", EnvVars: env("ALLOWED_HOST"), Usage: "host name (or host:port) clients use besides IP addresses, localhost and --tls-san names (repeatable; comma-separated in the variable); requests naming any other Host are refused (DNS rebinding)"},
			&cli.StringFlag{Name: "kubeconfig-out", EnvVars: env("KUBECONFIG_OUT"), Usage: "also write the kubeconfig to this path (<dir>/kubeconfig is always written)"},
			&cli.StringFlag{Name: "token-file", EnvVars: env("TOKEN_FILE"), Usage: `extra users: kube-apiserver static token file, lines token,user,uid,"group1,group2"`},
			&cli.StringFlag{Name: "client-ca-file", EnvVars: env("CLIENT_CA_FILE"), Usage: "authenticate client certificates signed by this PEM CA bundle (user = CN, groups = O; members of system:nodes get a kubelet's permissions only); reloaded when it changes, may be written after the start"},
			&cli.StringSliceFlag{Name: "crd-dir", EnvVars: env("CRD_DIR"), Usage: "CRD file or directory to install at start (repeatable; comma-separated in the variable)"},
			&cli.BoolFlag{Name: "controllers", Value: true, EnvVars: env("CONTROLLERS"), Usage: "run garbage collection, namespace deletion, pod termination and PDB status"},
		}, logging.CLIFlags(envPrefix)...),
		Action: run,
	}
	os.Exit(cliconv.Report(os.Stderr, cliApp.Name, cliconv.Configure(cliApp).Run(os.Args)))
}

func run(c *cli.Context) error {
	log, flush, err := logging.New(logging.FromCLI(c), nil)
	if err != nil {
		return cliconv.Usage(err)
	}
	defer flush()
	logging.Started(log, "dev-k8s", version.Version)
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	running, err := app.Start(ctx, log, app.Config{
		Addr:          c.String("addr"),
		Dir:           c.String("dir"),
		TLS:           c.Bool("tls"),
		TLSSANs:       c.StringSlice("tls-san"),
		AllowedHosts:  c.StringSlice("allowed-host"),
		KubeconfigOut: c.String("kubeconfig-out"),
		TokenFile:     c.String("token-file"),
		ClientCAFile:  c.String("client-ca-file"),
		CRDPaths:      c.StringSlice("crd-dir"),
		Controllers:   c.Bool("controllers"),
	})
	if err != nil {
		return err
	}
	fmt.Fprint(c.App.Writer, running.Usage())
	return running.Wait()
}
