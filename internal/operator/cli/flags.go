package cli

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	cliflag "k8s.io/component-base/cli/flag"

	"github.com/nstance-dev/nstance/internal/logging"
	"github.com/nstance-dev/nstance/internal/operator/config"
	"github.com/nstance-dev/nstance/internal/operator/manager"
	"github.com/nstance-dev/nstance/internal/operator/nodejoin"
	"github.com/nstance-dev/nstance/internal/operator/watchfilter"
	"github.com/nstance-dev/nstance/internal/operator/workload"
)

// Name is the binary's name.
const Name = "nstance-operator"

// envPrefix names every variable of the operator.
const envPrefix = "NSTANCE"

// Environment variables of the flags. NSTANCE_NAMESPACE and the object names
// are defined by internal/operator/config, which reads them.
const (
	EnvConfig          = "NSTANCE_CONFIG"
	EnvWatchNamespace  = "NSTANCE_WATCH_NAMESPACE"
	EnvWatchFilter     = "NSTANCE_WATCH_FILTER"
	EnvProbeAddr       = "NSTANCE_HEALTH_PROBE_BIND_ADDRESS"
	EnvDiagnosticsAddr = "NSTANCE_DIAGNOSTICS_ADDRESS"
	// EnvMetricsAddr is the deprecated spelling of EnvDiagnosticsAddr
	// (read when that is unset).
	EnvMetricsAddr         = "NSTANCE_METRICS_BIND_ADDRESS"
	EnvInsecureDiagnostics = "NSTANCE_INSECURE_DIAGNOSTICS"
	EnvTLSMinVersion       = "NSTANCE_TLS_MIN_VERSION"
	EnvTLSCipherSuites     = "NSTANCE_TLS_CIPHER_SUITES"
	EnvSyncPeriod          = "NSTANCE_SYNC_PERIOD"
	EnvKubeAPIQPS          = "NSTANCE_KUBE_API_QPS"
	EnvKubeAPIBurst        = "NSTANCE_KUBE_API_BURST"
	EnvPprofAddr           = "NSTANCE_PPROF_ADDR"
	EnvLeaderElect         = "NSTANCE_LEADER_ELECT"
	EnvDisableWebhooks     = "NSTANCE_DISABLE_WEBHOOKS"
	EnvWebhookHost         = "NSTANCE_WEBHOOK_HOST"
	EnvWebhookPort         = "NSTANCE_WEBHOOK_PORT"
	EnvWebhookCertDir      = "NSTANCE_WEBHOOK_CERT_DIR"
	EnvWorkloadCluster     = "NSTANCE_WORKLOAD_CLUSTER"
	EnvJoinTimeout         = "NSTANCE_JOIN_TIMEOUT"
	// EnvKubeconfig is client-go's variable; --kubeconfig wins over it.
	EnvKubeconfig = "KUBECONFIG"
)

// Defaults of the flags.
const (
	DefaultProbeAddr = ":8081"
	// DefaultDiagnosticsAddr is Cluster API's: HTTPS with authentication
	// and authorization, unless --insecure-diagnostics.
	DefaultDiagnosticsAddr = ":8443"
	DefaultWebhookPort     = 9443
	DefaultTLSMinVersion   = "VersionTLS12"
	// DefaultSyncPeriod, DefaultKubeAPIQPS and DefaultKubeAPIBurst are
	// Cluster API's defaults.
	DefaultSyncPeriod   = 10 * time.Minute
	DefaultKubeAPIQPS   = 20
	DefaultKubeAPIBurst = 30
	DefaultConcurrency  = 4
)

// concurrencyFlags are the per-controller worker flags, named after the
// kind each controller reconciles as Cluster API's are
// (--machine-concurrency, ...).
func concurrencyFlags(c *manager.Concurrency) []struct {
	flag, env string
	v         *int
} {
	return []struct {
		flag, env string
		v         *int
	}{
		{"nstanceshardgroup-concurrency", "NSTANCE_NSTANCESHARDGROUP_CONCURRENCY", &c.ShardGroup},
		{"nstancemachinepool-concurrency", "NSTANCE_NSTANCEMACHINEPOOL_CONCURRENCY", &c.MachinePool},
		{"nstancemachine-concurrency", "NSTANCE_NSTANCEMACHINE_CONCURRENCY", &c.Machine},
		{"ondemand-concurrency", "NSTANCE_ONDEMAND_CONCURRENCY", &c.OnDemand}, // on-demand Pods
	}
}

// DefaultWebhookCertDir is controller-runtime's default serving-certificate
// directory, /tmp/k8s-webhook-server/serving-certs.
func DefaultWebhookCertDir() string {
	return filepath.Join(os.TempDir(), "k8s-webhook-server", "serving-certs")
}

// Flags are the parsed command line.
type Flags struct {
	ConfigPath string
	// Kubeconfig is an explicit kubeconfig file; empty means KUBECONFIG,
	// then the in-cluster configuration, then ~/.kube/config.
	Kubeconfig string
	// Namespace holds the Cluster API and Nstance objects the operator
	// reconciles; empty means every namespace, as clusterctl expects. The
	// operator's own Secrets, ConfigMaps and Lease are in NSTANCE_NAMESPACE,
	// else the pod's namespace (config.ParseEnv).
	Namespace string
	// WatchFilter, when set, restricts the operator to Nstance objects
	// labelled cluster.x-k8s.io/watch-filter with it (Cluster API's
	// --watch-filter).
	WatchFilter string
	ProbeAddr   string
	// DiagnosticsAddr serves /metrics (and, secure, /debug/pprof/);
	// --metrics-bind-address is its deprecated alias.
	DiagnosticsAddr     string
	InsecureDiagnostics bool
	TLSMinVersion       string
	// TLSCipherSuites is a comma-separated list of Go cipher suite names.
	TLSCipherSuites string
	SyncPeriod      time.Duration
	KubeAPIQPS      float64
	KubeAPIBurst    int
	Concurrency     manager.Concurrency
	PprofAddr       string
	LeaderElect     bool
	DisableWebhooks bool
	WebhookHost     string
	WebhookPort     int
	WebhookCertDir  string
	// WorkloadCluster is where Nodes and Pods are: in-cluster (the
	// operator's own API server) or management (the cluster of the
	// <cluster>-kubeconfig Secret). Never guessed.
	WorkloadCluster string
	// JoinTimeout is how long after its agent's first health report an
	// instance's Node has to become Ready before the instance is replaced;
	// zero disables the join deadline.
	JoinTimeout time.Duration
	Log         logging.Options
	Version     bool
}

// envVar documents one environment variable that is not a flag's.
type envVar struct{ name, usage string }

// objectVars are the variables internal/operator/config reads besides
// NSTANCE_NAMESPACE.
func objectVars() []envVar {
	return []envVar{
		{config.EnvNamespace, "namespace of the operator's own Secrets, ConfigMaps and leader-election Lease (default: the pod's namespace)"},
		{config.EnvCAConfigMap, fmt.Sprintf("ConfigMap holding the cluster CA under ca.crt (default %s)", config.DefaultCAConfigMap)},
		{config.EnvNonceSecret, fmt.Sprintf("Secret holding the one-time registration nonce under nonce.jwt (default %s)", config.DefaultNonceSecret)},
		{config.EnvCertSecret, fmt.Sprintf("Secret the operator stores its client certificate in (default %s)", config.DefaultCertSecret)},
		{config.EnvKeySecret, fmt.Sprintf("Secret the operator stores its Ed25519 keypair in (default %s)", config.DefaultKeySecret)},
		{config.EnvCAPIEndpoint, "workload API server URL; when set, the operator does not manage the <cluster>-kubeconfig Secret"},
		{config.EnvCAPIServiceAccount, fmt.Sprintf("ServiceAccount whose tokens go into the managed kubeconfig Secret (default %s)", config.DefaultCAPIServiceAccount)},
		{config.EnvK8sJSON, "true: talk JSON instead of protobuf to the Kubernetes API (dev-k8s needs it)"},
	}
}

// envDefaults turns environment values into flag defaults, collecting every bad
// value.
type envDefaults struct {
	lookup func(string) (string, bool)
	errs   []error
}

func (p *envDefaults) str(name, def string) string {
	if v, ok := p.lookup(name); ok && strings.TrimSpace(v) != "" {
		return strings.TrimSpace(v)
	}
	return def
}

func (p *envDefaults) boolean(name string, def bool) bool {
	raw := p.str(name, "")
	if raw == "" {
		return def
	}
	v, err := strconv.ParseBool(raw)
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s=%q: want true or false", name, raw))
		return def
	}
	return v
}

func (p *envDefaults) duration(name string, def time.Duration) time.Duration {
	raw := p.str(name, "")
	if raw == "" {
		return def
	}
	v, err := time.ParseDuration(raw)
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s=%q: want a duration such as 10m", name, raw))
		return def
	}
	return v
}

func (p *envDefaults) float(name string, def float64) float64 {
	raw := p.str(name, "")
	if raw == "" {
		return def
	}
	v, err := strconv.ParseFloat(raw, 64)
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s=%q: not a number", name, raw))
		return def
	}
	return v
}

func (p *envDefaults) integer(name string, def int) int {
	raw := p.str(name, "")
	if raw == "" {
		return def
	}
	v, err := strconv.Atoi(raw)
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s=%q: not a number", name, raw))
		return def
	}
	return v
}

// newFlagSet registers every flag on a fresh FlagSet; defaults come from the
// environment through p.
func newFlagSet(f *Flags, p *envDefaults) *flag.FlagSet {
	fs := flag.NewFlagSet(Name, flag.ContinueOnError)
	fs.StringVar(&f.ConfigPath, "config", p.str(EnvConfig, config.DefaultPath),
		"operator configuration file: cluster, tenant and shard endpoints")
	fs.StringVar(&f.Kubeconfig, "kubeconfig", "",
		"kubeconfig file of the management cluster; without it: $KUBECONFIG, the pod's ServiceAccount, then ~/.kube/config")
	fs.StringVar(&f.Namespace, "namespace", p.str(EnvWatchNamespace, ""),
		"namespace whose Cluster API and Nstance objects the operator reconciles (default: every namespace); the operator's Cluster, imported pools and on-demand objects live there, or in "+config.EnvNamespace+" when it is empty")
	fs.StringVar(&f.WatchFilter, "watch-filter", p.str(EnvWatchFilter, ""),
		"reconcile only Nstance objects labelled "+watchfilter.Label+" with this value, and label the objects the operator creates with it (default: every object)")
	fs.StringVar(&f.ProbeAddr, "health-probe-bind-address", p.str(EnvProbeAddr, DefaultProbeAddr),
		"address of /healthz and /readyz (0 disables them)")
	fs.StringVar(&f.DiagnosticsAddr, "diagnostics-address", p.str(EnvDiagnosticsAddr, p.str(EnvMetricsAddr, DefaultDiagnosticsAddr)),
		"address of /metrics, served over HTTPS with authentication (TokenReview) and authorization (SubjectAccessReview), which then also serves /debug/pprof/; 0 disables it")
	fs.Func("metrics-bind-address", "deprecated alias of --diagnostics-address (secure too unless --insecure-diagnostics)", func(v string) error {
		f.DiagnosticsAddr = v
		return nil
	})
	fs.BoolVar(&f.InsecureDiagnostics, "insecure-diagnostics", p.boolean(EnvInsecureDiagnostics, false),
		"serve --diagnostics-address over plain HTTP without authentication or authorization (and without pprof)")
	fs.StringVar(&f.TLSMinVersion, "tls-min-version", p.str(EnvTLSMinVersion, DefaultTLSMinVersion),
		"minimum TLS version of the webhook and diagnostics servers: "+strings.Join(cliflag.TLSPossibleVersions(), ", "))
	fs.StringVar(&f.TLSCipherSuites, "tls-cipher-suites", p.str(EnvTLSCipherSuites, ""),
		"comma-separated cipher suites of the webhook and diagnostics servers for TLS 1.2 (default: Go's); preferred: "+strings.Join(cliflag.PreferredTLSCipherNames(), ", "))
	fs.DurationVar(&f.SyncPeriod, "sync-period", p.duration(EnvSyncPeriod, DefaultSyncPeriod),
		"how often every watched object is reconciled again, even without a change")
	fs.Float64Var(&f.KubeAPIQPS, "kube-api-qps", p.float(EnvKubeAPIQPS, DefaultKubeAPIQPS),
		"queries per second to the Kubernetes API server (-1: no client-side limit)")
	fs.IntVar(&f.KubeAPIBurst, "kube-api-burst", p.integer(EnvKubeAPIBurst, DefaultKubeAPIBurst),
		"burst of queries to the Kubernetes API server")
	for _, c := range concurrencyFlags(&f.Concurrency) {
		what := strings.TrimSuffix(c.flag, "-concurrency") + " objects"
		if c.v == &f.Concurrency.OnDemand {
			what = "on-demand Pods"
		}
		fs.IntVar(c.v, c.flag, p.integer(c.env, DefaultConcurrency), "number of "+what+" reconciled at once")
	}
	fs.StringVar(&f.PprofAddr, "pprof-addr", p.str(EnvPprofAddr, ""),
		"address of net/http/pprof under /debug/pprof/, e.g. 127.0.0.1:6061 (empty disables it; keep it on loopback)")
	fs.BoolVar(&f.LeaderElect, "leader-elect", p.boolean(EnvLeaderElect, false),
		"run under leader election, so only one replica reconciles")
	fs.BoolVar(&f.DisableWebhooks, "disable-webhooks", p.boolean(EnvDisableWebhooks, false),
		"do not serve the admission webhooks (development without serving certificates)")
	fs.StringVar(&f.WebhookHost, "webhook-host", p.str(EnvWebhookHost, ""),
		"address the webhook server binds to (default: every interface)")
	fs.IntVar(&f.WebhookPort, "webhook-port", p.integer(EnvWebhookPort, DefaultWebhookPort),
		"port of the webhook server")
	fs.StringVar(&f.WebhookCertDir, "webhook-cert-dir", p.str(EnvWebhookCertDir, DefaultWebhookCertDir()),
		"directory holding the webhook serving certificate (tls.crt, tls.key)")
	fs.StringVar(&f.WorkloadCluster, "workload-cluster", p.str(EnvWorkloadCluster, string(workload.InCluster)),
		"where the Nodes and Pods of the cluster are: in-cluster (the operator runs in the workload cluster) or management (the operator runs in a management cluster and reaches the workload cluster through the <cluster>-kubeconfig Secret, which it then does not write)")
	fs.DurationVar(&f.JoinTimeout, "join-timeout", p.duration(EnvJoinTimeout, nodejoin.DefaultTimeout),
		"how long after its agent's first health report an instance's Node has to be Ready; an instance that misses it is marked (NodeJoined=False, JoinTimeout) and replaced (0 disables)")
	fs.BoolVar(&f.Version, "version", false, "print the version and exit")
	f.Log.BindFlags(fs, envPrefix, func(k string) string { v, _ := p.lookup(k); return v })
	f.Log.BindZapFlags(fs)
	return fs
}

// flagEnv maps each flag to the variable it is read from.
func flagEnv() map[string]string {
	m := map[string]string{
		"config": EnvConfig, "kubeconfig": EnvKubeconfig, "namespace": EnvWatchNamespace, "watch-filter": EnvWatchFilter,
		"health-probe-bind-address": EnvProbeAddr, "diagnostics-address": EnvDiagnosticsAddr, "metrics-bind-address": EnvMetricsAddr,
		"insecure-diagnostics": EnvInsecureDiagnostics, "tls-min-version": EnvTLSMinVersion, "tls-cipher-suites": EnvTLSCipherSuites,
		"sync-period": EnvSyncPeriod, "kube-api-qps": EnvKubeAPIQPS, "kube-api-burst": EnvKubeAPIBurst, "pprof-addr": EnvPprofAddr,
		"leader-elect": EnvLeaderElect, "disable-webhooks": EnvDisableWebhooks,
		"webhook-host": EnvWebhookHost, "webhook-port": EnvWebhookPort, "webhook-cert-dir": EnvWebhookCertDir,
		"workload-cluster": EnvWorkloadCluster, "join-timeout": EnvJoinTimeout,
		"log-level": logging.EnvLevel(envPrefix), "log-format": logging.EnvFormat(envPrefix),
	}
	for _, c := range concurrencyFlags(&manager.Concurrency{}) {
		m[c.flag] = c.env
	}
	return m
}

// Parse reads the command line (without the program name) over the
// environment seen through lookupEnv: a flag wins over its variable, which
// wins over the default. -h and --help write the usage to out and return
// flag.ErrHelp. Every bad value is reported at once.
func Parse(args []string, lookupEnv func(string) (string, bool), out io.Writer) (Flags, error) {
	var f Flags
	p := &envDefaults{lookup: lookupEnv}
	fs := newFlagSet(&f, p)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			Usage(out, fs)
		}
		return Flags{}, err
	}
	if fs.NArg() > 0 {
		p.errs = append(p.errs, fmt.Errorf("unexpected argument %q (the operator takes only flags)", fs.Arg(0)))
	}
	p.errs = append(p.errs, f.validate()...)
	if len(p.errs) > 0 {
		return Flags{}, errors.Join(p.errs...)
	}
	return f, nil
}

func (f Flags) validate() []error {
	var errs []error
	if f.ConfigPath == "" {
		errs = append(errs, errors.New("--config: a file is required"))
	}
	if f.Namespace != "" {
		for _, msg := range validation.IsDNS1123Label(f.Namespace) {
			errs = append(errs, fmt.Errorf("--namespace %q: %s", f.Namespace, msg))
		}
	}
	if err := watchfilter.Filter(f.WatchFilter).Validate(); err != nil {
		errs = append(errs, fmt.Errorf("--watch-filter: %w", err))
	}
	for _, a := range []struct{ name, addr string }{
		{"--health-probe-bind-address", f.ProbeAddr}, {"--diagnostics-address", f.DiagnosticsAddr}, {"--pprof-addr", f.PprofAddr},
	} {
		if a.addr == "0" || a.addr == "" && a.name == "--pprof-addr" {
			continue
		}
		if _, port, err := net.SplitHostPort(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: want host:port, :port or 0", a.name, a.addr))
		} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			errs = append(errs, fmt.Errorf("%s %q: port must be a number between 0 and 65535", a.name, a.addr))
		}
	}
	if f.WebhookPort < 1 || f.WebhookPort > 65535 {
		errs = append(errs, fmt.Errorf("--webhook-port %d: must be between 1 and 65535", f.WebhookPort))
	}
	if !f.DisableWebhooks && f.WebhookCertDir == "" {
		errs = append(errs, errors.New("--webhook-cert-dir: a directory is required while webhooks are enabled"))
	}
	if _, err := workload.ParseMode(f.WorkloadCluster); err != nil || f.WorkloadCluster == "" {
		errs = append(errs, fmt.Errorf("--workload-cluster %q: want %s or %s", f.WorkloadCluster, workload.InCluster, workload.Management))
	}
	if f.JoinTimeout < 0 {
		errs = append(errs, fmt.Errorf("--join-timeout %s: must not be negative (0 disables)", f.JoinTimeout))
	}
	if _, err := f.TLSOptions(); err != nil {
		errs = append(errs, err)
	}
	if f.SyncPeriod <= 0 {
		errs = append(errs, fmt.Errorf("--sync-period %s: must be positive", f.SyncPeriod))
	}
	if f.KubeAPIQPS <= 0 && f.KubeAPIQPS != -1 {
		errs = append(errs, fmt.Errorf("--kube-api-qps %v: must be positive, or -1 for no limit", f.KubeAPIQPS))
	}
	if f.KubeAPIBurst < 1 {
		errs = append(errs, fmt.Errorf("--kube-api-burst %d: must be at least 1", f.KubeAPIBurst))
	}
	for _, c := range concurrencyFlags(&f.Concurrency) {
		if *c.v < 1 {
			errs = append(errs, fmt.Errorf("--%s %d: must be at least 1", c.flag, *c.v))
		}
	}
	if err := f.Log.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// TLSOptions turns --tls-min-version and --tls-cipher-suites into options
// of the webhook and diagnostics servers (component-base's parsers, as
// Cluster API's manager flags use).
func (f Flags) TLSOptions() ([]func(*tls.Config), error) {
	v, err := cliflag.TLSVersion(f.TLSMinVersion)
	if err != nil {
		return nil, fmt.Errorf("--tls-min-version: %w", err)
	}
	opts := []func(*tls.Config){func(c *tls.Config) { c.MinVersion = v }}
	if strings.TrimSpace(f.TLSCipherSuites) != "" {
		var names []string
		for _, n := range strings.Split(f.TLSCipherSuites, ",") {
			names = append(names, strings.TrimSpace(n))
		}
		suites, err := cliflag.TLSCipherSuites(names)
		if err != nil {
			return nil, fmt.Errorf("--tls-cipher-suites: %w", err)
		}
		opts = append(opts, func(c *tls.Config) { c.CipherSuites = suites })
	}
	return opts, nil
}

// Usage writes the help: every flag with its variable, then every other
// variable the operator reads.
func Usage(w io.Writer, fs *flag.FlagSet) {
	env := flagEnv()
	fmt.Fprintf(w, "Usage: %s [flags]\n\n", Name)
	fmt.Fprintf(w, "The Nstance Cluster API infrastructure provider: keeps the Cluster API and Nstance\n")
	fmt.Fprintf(w, "objects in sync with the nstance-server of every shard.\n\n")
	fmt.Fprintf(w, "Flags (each also read from the variable named; a flag given here wins):\n")
	fs.VisitAll(func(fl *flag.Flag) {
		typ, usage := flag.UnquoteUsage(fl)
		head := "  --" + fl.Name
		if typ != "" {
			head += " " + typ
		}
		fmt.Fprintln(w, head)
		var notes []string
		if v, ok := env[fl.Name]; ok && !strings.Contains(usage, v) {
			notes = append(notes, "env "+v)
		}
		if fl.DefValue != "" && fl.DefValue != "false" && !strings.Contains(usage, "(default") {
			notes = append(notes, "default "+fl.DefValue)
		}
		if len(notes) > 0 {
			usage += " [" + strings.Join(notes, "; ") + "]"
		}
		fmt.Fprintf(w, "      %s\n", usage)
	})
	fmt.Fprintf(w, "\nEnvironment variables naming the operator's namespace and the objects it uses there:\n")
	for _, v := range objectVars() {
		fmt.Fprintf(w, "  %s\n      %s\n", v.name, v.usage)
	}
}
