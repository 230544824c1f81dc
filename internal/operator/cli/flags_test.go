package cli

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"

	"github.com/nstance-dev/nstance/internal/logging"
	"github.com/nstance-dev/nstance/internal/operator/config"
	"github.com/nstance-dev/nstance/internal/operator/manager"
	"github.com/nstance-dev/nstance/internal/operator/workload"
	"github.com/nstance-dev/nstance/internal/testing/envscan"
	"github.com/nstance-dev/nstance/internal/version"
)

func lookup(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestDefaults(t *testing.T) {
	f, err := Parse(nil, lookup(nil), nil)
	require.NoError(t, err)
	require.Equal(t, Flags{
		ConfigPath: config.DefaultPath, ProbeAddr: ":8081", DiagnosticsAddr: ":8443", WebhookPort: 9443,
		TLSMinVersion: "VersionTLS12", SyncPeriod: 10 * time.Minute, KubeAPIQPS: 20, KubeAPIBurst: 30,
		Concurrency:    manager.Concurrency{ShardGroup: 4, MachinePool: 4, Machine: 4, OnDemand: 4},
		WebhookCertDir: filepath.Join(os.TempDir(), "k8s-webhook-server", "serving-certs"), Log: logging.Defaults(),
		WorkloadCluster: "in-cluster", JoinTimeout: 10 * time.Minute,
	}, f)
}

// TestFlagBeatsEnvBeatsDefault checks every flag both ways: set only by its
// variable, and set by the flag while the variable says something else.
func TestFlagBeatsEnvBeatsDefault(t *testing.T) {
	tests := []struct {
		flag, env, envValue, flagValue string
		get                            func(Flags) any
		fromEnv, fromFlag              any
	}{
		{"config", EnvConfig, "/env.yaml", "/flag.yaml", func(f Flags) any { return f.ConfigPath }, "/env.yaml", "/flag.yaml"},
		{"namespace", EnvWatchNamespace, "env-ns", "flag-ns", func(f Flags) any { return f.Namespace }, "env-ns", "flag-ns"},
		{"watch-filter", EnvWatchFilter, "tenant-a", "tenant-b", func(f Flags) any { return f.WatchFilter }, "tenant-a", "tenant-b"},
		{"health-probe-bind-address", EnvProbeAddr, "127.0.0.1:1", ":2", func(f Flags) any { return f.ProbeAddr }, "127.0.0.1:1", ":2"},
		{"diagnostics-address", EnvDiagnosticsAddr, ":3", "0", func(f Flags) any { return f.DiagnosticsAddr }, ":3", "0"},
		{"metrics-bind-address", EnvMetricsAddr, ":3", "0", func(f Flags) any { return f.DiagnosticsAddr }, ":3", "0"},
		{"insecure-diagnostics", EnvInsecureDiagnostics, "true", "false", func(f Flags) any { return f.InsecureDiagnostics }, true, false},
		{"tls-min-version", EnvTLSMinVersion, "VersionTLS13", "VersionTLS12", func(f Flags) any { return f.TLSMinVersion }, "VersionTLS13", "VersionTLS12"},
		{"tls-cipher-suites", EnvTLSCipherSuites, "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "", func(f Flags) any { return f.TLSCipherSuites }, "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", ""},
		{"sync-period", EnvSyncPeriod, "1h", "5m", func(f Flags) any { return f.SyncPeriod }, time.Hour, 5 * time.Minute},
		{"kube-api-qps", EnvKubeAPIQPS, "50.5", "-1", func(f Flags) any { return f.KubeAPIQPS }, 50.5, -1.0},
		{"kube-api-burst", EnvKubeAPIBurst, "100", "7", func(f Flags) any { return f.KubeAPIBurst }, 100, 7},
		{"nstanceshardgroup-concurrency", "NSTANCE_NSTANCESHARDGROUP_CONCURRENCY", "2", "3", func(f Flags) any { return f.Concurrency.ShardGroup }, 2, 3},
		{"nstancemachinepool-concurrency", "NSTANCE_NSTANCEMACHINEPOOL_CONCURRENCY", "2", "3", func(f Flags) any { return f.Concurrency.MachinePool }, 2, 3},
		{"nstancemachine-concurrency", "NSTANCE_NSTANCEMACHINE_CONCURRENCY", "2", "3", func(f Flags) any { return f.Concurrency.Machine }, 2, 3},
		{"ondemand-concurrency", "NSTANCE_ONDEMAND_CONCURRENCY", "2", "3", func(f Flags) any { return f.Concurrency.OnDemand }, 2, 3},
		{"pprof-addr", EnvPprofAddr, "127.0.0.1:6061", "", func(f Flags) any { return f.PprofAddr }, "127.0.0.1:6061", ""},
		{"leader-elect", EnvLeaderElect, "true", "false", func(f Flags) any { return f.LeaderElect }, true, false},
		{"disable-webhooks", EnvDisableWebhooks, "1", "false", func(f Flags) any { return f.DisableWebhooks }, true, false},
		{"webhook-host", EnvWebhookHost, "127.0.0.1", "::1", func(f Flags) any { return f.WebhookHost }, "127.0.0.1", "::1"},
		{"webhook-port", EnvWebhookPort, "9555", "9666", func(f Flags) any { return f.WebhookPort }, 9555, 9666},
		{"webhook-cert-dir", EnvWebhookCertDir, "/env/certs", "/flag/certs", func(f Flags) any { return f.WebhookCertDir }, "/env/certs", "/flag/certs"},
		{"workload-cluster", EnvWorkloadCluster, "management", "in-cluster", func(f Flags) any { return f.WorkloadCluster }, "management", "in-cluster"},
		{"join-timeout", EnvJoinTimeout, "2m", "0", func(f Flags) any { return f.JoinTimeout }, 2 * time.Minute, time.Duration(0)},
		{"log-level", "NSTANCE_LOG_LEVEL", "debug", "3", func(f Flags) any { return f.Log.Level }, "debug", "3"},
		{"log-format", "NSTANCE_LOG_FORMAT", "text", "json", func(f Flags) any { return f.Log.Format }, "text", "json"},
	}
	covered := map[string]bool{}
	for _, tc := range tests {
		covered[tc.flag] = true
		t.Run(tc.flag, func(t *testing.T) {
			env := lookup(map[string]string{tc.env: tc.envValue})
			f, err := Parse(nil, env, nil)
			require.NoError(t, err)
			require.Equal(t, tc.fromEnv, tc.get(f))
			f, err = Parse([]string{"--" + tc.flag + "=" + tc.flagValue}, env, nil)
			require.NoError(t, err)
			require.Equal(t, tc.fromFlag, tc.get(f))
		})
	}
	// Every flag with a variable is covered above (kubeconfig's is client-go's
	// KUBECONFIG, checked by TestRestConfig).
	for name, env := range flagEnv() {
		if env != EnvKubeconfig {
			require.True(t, covered[name], "flag --%s (%s) has no precedence case", name, env)
		}
	}
}

func TestBadValuesAreRefused(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{"port not a number in env", nil, map[string]string{EnvWebhookPort: "https"}, []string{`NSTANCE_WEBHOOK_PORT="https": not a number`}},
		{"port out of range", []string{"--webhook-port=70000"}, nil, []string{"--webhook-port 70000: must be between 1 and 65535"}},
		{"port zero", []string{"--webhook-port", "0"}, nil, []string{"--webhook-port 0"}},
		{"port not a number", []string{"--webhook-port=x"}, nil, []string{`invalid value "x" for flag -webhook-port`}},
		{"bool in env", nil, map[string]string{EnvLeaderElect: "maybe"}, []string{`NSTANCE_LEADER_ELECT="maybe": want true or false`}},
		{"namespace", []string{"--namespace", "Not_A_Namespace"}, nil, []string{`--namespace "Not_A_Namespace"`}},
		{"namespace in env", nil, map[string]string{EnvWatchNamespace: "a/b"}, []string{`--namespace "a/b"`}},
		{"watch filter", []string{"--watch-filter", "tenant a"}, nil, []string{`--watch-filter: watch filter "tenant a"`}},
		{"watch filter in env", nil, map[string]string{EnvWatchFilter: "-a"}, []string{`--watch-filter: watch filter "-a"`}},
		{"probe address", []string{"--health-probe-bind-address", "8081"}, nil, []string{`--health-probe-bind-address "8081": want host:port`}},
		{"metrics port", nil, map[string]string{EnvMetricsAddr: ":http"}, []string{`--diagnostics-address ":http": port must be a number`}},
		{"diagnostics address", []string{"--diagnostics-address=8443"}, nil, []string{`--diagnostics-address "8443": want host:port`}},
		{"tls version", []string{"--tls-min-version=VersionTLS9"}, nil, []string{"--tls-min-version: unknown tls version"}},
		{"cipher suite", nil, map[string]string{EnvTLSCipherSuites: "TLS_NOPE"}, []string{"--tls-cipher-suites: "}},
		{"sync period", []string{"--sync-period=0"}, nil, []string{"--sync-period 0s: must be positive"}},
		{"qps", []string{"--kube-api-qps=0"}, nil, []string{"--kube-api-qps 0: must be positive"}},
		{"qps in env", nil, map[string]string{EnvKubeAPIQPS: "fast"}, []string{`NSTANCE_KUBE_API_QPS="fast": not a number`}},
		{"burst", []string{"--kube-api-burst=0"}, nil, []string{"--kube-api-burst 0: must be at least 1"}},
		{"concurrency", []string{"--nstancemachine-concurrency=0"}, nil, []string{"--nstancemachine-concurrency 0: must be at least 1"}},
		{"zap level", []string{"--zap-log-level=loud"}, nil, []string{`invalid value "loud" for flag -zap-log-level`}},
		{"zap encoder", []string{"--zap-encoder=xml"}, nil, []string{`invalid value "xml" for flag -zap-encoder`}},
		{"pprof address", []string{"--pprof-addr", "6061"}, nil, []string{`--pprof-addr "6061": want host:port`}},
		{"log level", []string{"--log-level", "loud"}, nil, []string{`log level "loud"`}},
		{"log format in env", nil, map[string]string{"NSTANCE_LOG_FORMAT": "xml"}, []string{`log format "xml"`}},
		{"empty config", []string{"--config="}, nil, []string{"--config: a file is required"}},
		{"empty cert dir", []string{"--webhook-cert-dir="}, nil, []string{"--webhook-cert-dir: a directory is required"}},
		{"workload cluster", []string{"--workload-cluster", "auto"}, nil, []string{`--workload-cluster "auto": want in-cluster or management`}},
		{"empty workload cluster", []string{"--workload-cluster="}, nil, []string{`--workload-cluster "": want in-cluster or management`}},
		{"join timeout in env", nil, map[string]string{EnvJoinTimeout: "ten minutes"}, []string{`NSTANCE_JOIN_TIMEOUT="ten minutes": want a duration`}},
		{"negative join timeout", []string{"--join-timeout=-1s"}, nil, []string{"--join-timeout -1s: must not be negative"}},
		{"positional argument", []string{"run"}, nil, []string{`unexpected argument "run"`}},
		{"unknown flag", []string{"--zap-level=debug"}, nil, []string{"flag provided but not defined: -zap-level"}},
		{"every problem at once", []string{"--webhook-port=0", "--log-level=loud"}, map[string]string{EnvLeaderElect: "maybe"},
			[]string{"--webhook-port 0", `log level "loud"`, "NSTANCE_LEADER_ELECT"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.args, lookup(tc.env), nil)
			require.Error(t, err)
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
	// Without webhooks no certificate directory is needed.
	_, err := Parse([]string{"--disable-webhooks", "--webhook-cert-dir="}, lookup(nil), nil)
	require.NoError(t, err)
}

// operatorVariables is every NSTANCE_* string literal in the non-test Go
// files of this module's packages that nstance-operator links, i.e. every
// variable the operator can read by name.
func operatorVariables(t *testing.T) []string {
	t.Helper()
	found, err := envscan.Literals("github.com/nstance-dev/nstance/cmd/nstance-operator", envscan.Names)
	require.NoError(t, err)
	vars := make([]string, 0, len(found))
	for name := range found {
		vars = append(vars, name)
	}
	return vars
}

func TestHelpListsEveryVariable(t *testing.T) {
	var out bytes.Buffer
	_, err := Parse([]string{"--help"}, lookup(nil), &out)
	require.ErrorIs(t, err, flag.ErrHelp)
	help := out.String()

	vars := operatorVariables(t)
	// Sanity: the scan finds the variables internal/operator/config reads.
	require.Contains(t, vars, config.EnvNamespace)
	require.Contains(t, vars, config.EnvK8sJSON)
	require.Contains(t, vars, EnvWebhookPort)
	for _, v := range flagEnv() {
		vars = append(vars, v)
	}
	for _, v := range vars {
		require.Regexp(t, `(?m)\b`+regexp.QuoteMeta(v)+`\b`, help, "--help does not list %s", v)
	}
	// Every flag is listed, and every flag but --version has a variable.
	fs := newFlagSet(&Flags{}, &envDefaults{lookup: lookup(nil)})
	fs.VisitAll(func(fl *flag.Flag) {
		require.Regexp(t, `(?m)^\s+--`+regexp.QuoteMeta(fl.Name)+`\b`, help)
		if fl.Name != "version" && !slices.Contains(logging.ZapFlags(), fl.Name) {
			require.Contains(t, flagEnv(), fl.Name, "--%s has no environment variable", fl.Name)
		}
	})
}

func TestMainVersionHelpAndUsageErrors(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, ExitOK, Main([]string{"--version"}, &out, &errOut))
	require.Regexp(t, version.Pattern(Name), strings.TrimSpace(out.String()))
	require.Empty(t, errOut.String())

	out.Reset()
	require.Equal(t, ExitOK, Main([]string{"--help"}, &out, &errOut))
	require.Contains(t, out.String(), "Usage: "+Name)

	out.Reset()
	require.Equal(t, ExitUsage, Main([]string{"--webhook-port=0"}, &out, &errOut))
	require.Equal(t, "nstance-operator: --webhook-port 0: must be between 1 and 65535\nRun 'nstance-operator --help' for usage.\n", errOut.String())

	// Several problems: one line all the same.
	errOut.Reset()
	require.Equal(t, ExitUsage, Main([]string{"--webhook-port=0", "--sync-period=0"}, &out, &errOut))
	require.Equal(t, "nstance-operator: --webhook-port 0: must be between 1 and 65535; --sync-period 0s: must be positive\nRun 'nstance-operator --help' for usage.\n", errOut.String())
}

// TestZapFlagsSetTheOneLogger: the seed's controller-runtime flags are
// accepted and land on the same options as --log-level and --log-format.
func TestZapFlagsSetTheOneLogger(t *testing.T) {
	f, err := Parse([]string{"--zap-log-level=debug", "--zap-encoder=console", "--zap-devel", "--zap-stacktrace-level=error", "--zap-time-encoding=rfc3339"},
		lookup(map[string]string{"NSTANCE_LOG_LEVEL": "warn"}), nil)
	require.NoError(t, err)
	require.Equal(t, logging.Options{Level: "debug", Format: "text", Devel: true, StacktraceLevel: "error", TimeEncoding: "rfc3339"}, f.Log)
}

func TestTLSOptions(t *testing.T) {
	f, err := Parse([]string{"--tls-min-version=VersionTLS13", "--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"}, lookup(nil), nil)
	require.NoError(t, err)
	opts, err := f.TLSOptions()
	require.NoError(t, err)
	var c tls.Config
	for _, o := range opts {
		o(&c)
	}
	require.Equal(t, uint16(tls.VersionTLS13), c.MinVersion)
	require.Equal(t, []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256}, c.CipherSuites)
	o := f.ManagerOptions(&config.Config{}, config.Env{}, &rest.Config{}, logr.Discard())
	require.Len(t, o.TLSOpts, 2)
	require.False(t, o.InsecureMetrics)
	require.Equal(t, ":8443", o.MetricsAddr)
	require.Equal(t, 10*time.Minute, o.SyncPeriod)
}

// TestMainLogsStartAndOneErrorLine: the version comes first, and a typo in
// the configuration file is one error line, without a stack trace.
func TestMainLogsStartAndOneErrorLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(path, []byte("cluster_id: c1\ntenant: t\nshardz: {}\n"), 0o600))
	var out, logs bytes.Buffer
	require.Equal(t, ExitError, Main([]string{"--config", path, "--log-format", "json"}, &out, &logs))
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	require.Len(t, lines, 2, logs.String())
	var started, failed map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &started))
	require.Equal(t, "starting", started["msg"])
	require.Equal(t, Name, started["binary"])
	require.Equal(t, version.Version, started["version"])
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &failed))
	require.Equal(t, "error", failed["level"])
	require.Equal(t, "invalid operator configuration", failed["msg"])
	require.Contains(t, failed["error"], "shardz")
	require.NotContains(t, failed, "stacktrace")
}

// TestEnvNamespace: the operator's own namespace is NSTANCE_NAMESPACE, else
// the pod's; --namespace (what is watched) never changes it.
func TestEnvNamespace(t *testing.T) {
	getenv := func(k string) string { return map[string]string{config.EnvNamespace: "from-env"}[k] }
	pod := func() (string, error) { return "from-pod", nil }
	noPod := func() (string, error) { return "", errors.New("not in a pod") }

	e, err := Flags{Namespace: "watched"}.Env(getenv, pod)
	require.NoError(t, err)
	require.Equal(t, "from-env", e.Namespace)
	e, err = Flags{}.Env(getenv, pod)
	require.NoError(t, err)
	require.Equal(t, "from-env", e.Namespace)
	e, err = Flags{Namespace: "watched"}.Env(func(string) string { return "" }, pod)
	require.NoError(t, err)
	require.Equal(t, "from-pod", e.Namespace)
	_, err = Flags{Namespace: "watched"}.Env(func(string) string { return "" }, noPod)
	require.ErrorContains(t, err, config.EnvNamespace, "outside a pod NSTANCE_NAMESPACE is needed")
}

func TestManagerOptions(t *testing.T) {
	f, err := Parse([]string{"--leader-elect", "--webhook-port=9555", "--webhook-cert-dir=/c", "--webhook-host=127.0.0.1",
		"--health-probe-bind-address=:1", "--metrics-bind-address=:2", "--workload-cluster=management", "--join-timeout=90s"}, lookup(nil), nil)
	require.NoError(t, err)
	cfg, rc := &config.Config{ClusterID: "c"}, &rest.Config{Host: "https://h"}
	o := f.ManagerOptions(cfg, config.Env{Namespace: "ns"}, rc, logr.Discard())
	require.Same(t, cfg, o.Config)
	require.Same(t, rc, o.RestConfig)
	require.Equal(t, "ns", o.Env.Namespace)
	require.Empty(t, o.WatchNamespace, "no --namespace: every namespace")
	f, err = Parse([]string{"--namespace=team-a"}, lookup(nil), nil)
	require.NoError(t, err)
	require.Equal(t, "team-a", f.ManagerOptions(cfg, config.Env{Namespace: "ns"}, rc, logr.Discard()).WatchNamespace)
	require.True(t, o.LeaderElect)
	require.False(t, o.DisableWebhooks)
	require.Equal(t, 9555, o.WebhookPort)
	require.Equal(t, "/c", o.WebhookCertDir)
	require.Equal(t, "127.0.0.1", o.WebhookHost)
	require.Equal(t, ":1", o.ProbeAddr)
	require.Equal(t, ":2", o.MetricsAddr, "--metrics-bind-address is --diagnostics-address")
	require.Equal(t, workload.Management, o.WorkloadMode)
	require.Equal(t, 90*time.Second, o.JoinTimeout)
}

func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+server+`"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600))
	return path
}

func TestRestConfig(t *testing.T) {
	flagFile := writeKubeconfig(t, "https://from-flag:6443")
	envFile := writeKubeconfig(t, "https://from-env:6443")
	t.Setenv(EnvKubeconfig, envFile)

	cfg, err := RestConfig(flagFile)
	require.NoError(t, err)
	require.Equal(t, "https://from-flag:6443", cfg.Host, "--kubeconfig wins over KUBECONFIG")
	require.Equal(t, "t", cfg.BearerToken)
	cfg, err = RestConfig("")
	require.NoError(t, err)
	require.Equal(t, "https://from-env:6443", cfg.Host)

	_, err = RestConfig(filepath.Join(t.TempDir(), "missing"))
	require.ErrorContains(t, err, "--kubeconfig")
	require.ErrorContains(t, err, "no such file")
	bad := filepath.Join(t.TempDir(), "bad")
	require.NoError(t, os.WriteFile(bad, []byte("clusters: ["), 0o600))
	_, err = RestConfig(bad)
	require.ErrorContains(t, err, "--kubeconfig "+bad)
}
