// Command nstance-operator syncs Cluster API resources to the Nstance
// servers of every shard. See docs/seeds/nstance-operator.md for flags,
// environment variables and the configuration file.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/nstance-dev/nstance/internal/operator/config"
	"github.com/nstance-dev/nstance/internal/operator/manager"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "nstance-operator: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		configPath     string
		probeAddr      string
		metricsAddr    string
		leaderElect    bool
		disableWebhook bool
	)
	fs := flag.NewFlagSet("nstance-operator", flag.ContinueOnError)
	fs.StringVar(&configPath, "config", config.DefaultPath, "Path to the operator configuration file")
	fs.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "The address the health probe endpoint binds to")
	fs.StringVar(&metricsAddr, "metrics-bind-address", "0", "The address the metrics endpoint binds to (0 disables it)")
	fs.BoolVar(&leaderElect, "leader-elect", false, "Enable leader election for controller manager")
	fs.BoolVar(&disableWebhook, "disable-webhooks", false, "Disable admission webhooks (useful for development)")
	zopts := zap.Options{}
	zopts.BindFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	log := zap.New(zap.UseFlagOptions(&zopts))
	ctrl.SetLogger(log)

	cfg, err := config.Load(configPath)
	if err != nil {
		return err
	}
	env, err := config.EnvFromOS()
	if err != nil {
		return err
	}
	restCfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubernetes client configuration: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	op, err := manager.New(ctx, manager.Options{
		Config: cfg, Env: env, RestConfig: restCfg,
		MetricsAddr: metricsAddr, ProbeAddr: probeAddr, LeaderElect: leaderElect,
		DisableWebhooks: disableWebhook, Log: log,
	})
	if err != nil {
		return err
	}
	log.Info("starting nstance-operator", "cluster", cfg.ClusterID, "tenant", cfg.Tenant, "shards", cfg.ShardIDs(),
		"namespace", env.Namespace, "leaderElect", leaderElect)
	// Start returns an error on a fatal sync failure and when leadership is
	// lost; either way the process exits so a fresh start resumes cleanly.
	if err := op.Start(ctx); err != nil {
		return err
	}
	return nil
}
