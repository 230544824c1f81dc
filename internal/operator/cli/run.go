package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/nstance-dev/nstance/internal/cliconv"
	"github.com/nstance-dev/nstance/internal/logging"
	"github.com/nstance-dev/nstance/internal/operator/config"
	"github.com/nstance-dev/nstance/internal/operator/manager"
	"github.com/nstance-dev/nstance/internal/operator/watchfilter"
	"github.com/nstance-dev/nstance/internal/operator/workload"
	"github.com/nstance-dev/nstance/internal/version"
)

// Exit codes of Main (internal/cliconv).
const (
	ExitOK    = cliconv.ExitOK
	ExitError = cliconv.ExitError
	ExitUsage = cliconv.ExitUsage
)

// Main runs the operator with the process's arguments (without the program
// name) and environment until a signal or a fatal error, and returns the
// exit code. Start-up problems are one log line each.
func Main(args []string, stdout, stderr io.Writer) int {
	f, err := Parse(args, os.LookupEnv, stdout)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return ExitOK
	case err != nil:
		return cliconv.Report(stderr, Name, cliconv.Usage(err))
	case f.Version:
		fmt.Fprintln(stdout, version.String(Name))
		return ExitOK
	}
	log, flush, err := logging.New(f.Log, stderr)
	if err != nil {
		return cliconv.Report(stderr, Name, cliconv.Usage(err))
	}
	defer flush()
	ctrl.SetLogger(log)
	klog.SetLogger(log)
	logging.Started(log, Name, version.Version)
	log.V(1).Info("flags", "diagnosticsAddress", f.DiagnosticsAddr, "insecureDiagnostics", f.InsecureDiagnostics,
		"tlsMinVersion", f.TLSMinVersion, "syncPeriod", f.SyncPeriod, "kubeAPIQPS", f.KubeAPIQPS, "kubeAPIBurst", f.KubeAPIBurst,
		"concurrency", f.Concurrency)

	cfg, err := config.Load(f.ConfigPath)
	if err != nil {
		log.Error(err, "invalid operator configuration")
		return ExitError
	}
	env, err := f.Env(os.Getenv, config.PodNamespace)
	if err != nil {
		log.Error(err, "invalid environment")
		return ExitError
	}
	restCfg, err := RestConfig(f.Kubeconfig)
	if err != nil {
		log.Error(err, "no Kubernetes client configuration")
		return ExitError
	}
	restCfg.QPS, restCfg.Burst = float32(f.KubeAPIQPS), f.KubeAPIBurst
	ctx := ctrl.SetupSignalHandler()
	op, err := manager.New(ctx, f.ManagerOptions(cfg, env, restCfg, log))
	if err != nil {
		log.Error(err, "setting up the operator")
		return ExitError
	}
	log.Info("running", "cluster", cfg.ClusterID, "tenant", cfg.Tenant, "shards", cfg.ShardIDs(),
		"namespace", env.Namespace, "watchNamespace", f.Namespace, "watchFilter", f.WatchFilter, "apiServer", restCfg.Host, "leaderElect", f.LeaderElect,
		"webhooks", !f.DisableWebhooks, "webhookPort", f.WebhookPort, "workloadCluster", f.WorkloadCluster)
	// Start returns an error on a fatal sync failure and when leadership is
	// lost; either way the process exits so a fresh start resumes cleanly.
	if err := op.Start(ctx); err != nil && !errors.Is(err, context.Canceled) {
		log.Error(err, "operator stopped")
		return ExitError
	}
	log.Info("operator stopped")
	return ExitOK
}

// Env reads the environment configuration: the operator's own namespace is
// NSTANCE_NAMESPACE, else the pod's; --namespace (what is watched) does not
// change it.
func (f Flags) Env(getenv func(string) string, podNamespace func() (string, error)) (config.Env, error) {
	return config.ParseEnv(getenv, podNamespace)
}

// ManagerOptions builds the manager's options from the flags.
// Parse has validated the TLS flags.
func (f Flags) ManagerOptions(cfg *config.Config, env config.Env, restCfg *rest.Config, log logr.Logger) manager.Options {
	tlsOpts, _ := f.TLSOptions()
	return manager.Options{
		Config: cfg, Env: env, WatchNamespace: f.Namespace, WatchFilter: watchfilter.Filter(f.WatchFilter), RestConfig: restCfg, Log: log,
		MetricsAddr: f.DiagnosticsAddr, InsecureMetrics: f.InsecureDiagnostics, TLSOpts: tlsOpts,
		SyncPeriod: f.SyncPeriod, Concurrency: f.Concurrency,
		ProbeAddr: f.ProbeAddr, PprofAddr: f.PprofAddr, LeaderElect: f.LeaderElect,
		DisableWebhooks: f.DisableWebhooks,
		WebhookHost:     f.WebhookHost, WebhookPort: f.WebhookPort, WebhookCertDir: f.WebhookCertDir,
		WorkloadMode: workload.Mode(f.WorkloadCluster), JoinTimeout: f.JoinTimeout,
	}
}

// RestConfig loads the client configuration of the management cluster: the
// kubeconfig file when one is given, otherwise controller-runtime's search
// ($KUBECONFIG, the pod's ServiceAccount, ~/.kube/config).
func RestConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := ctrlconfig.GetConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig, no usable $KUBECONFIG, not in a pod and no ~/.kube/config: %w", err)
		}
		return cfg, nil
	}
	if _, err := os.Stat(kubeconfig); err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
	}
	if cfg.QPS == 0 {
		// As controller-runtime's GetConfig: no client-side rate limit, the
		// API server's priority and fairness applies.
		cfg.QPS = -1
	}
	return cfg, nil
}
