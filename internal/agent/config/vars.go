package config

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Var documents one environment variable the agent reads.
type Var struct {
	Name string
	// Default is shown as the default ("" when there is none).
	Default string
	Usage   string
	// Required variables have no default.
	Required bool
}

func dur(d time.Duration) string { return d.String() }

// Vars is every variable Load reads, in the order of the help. It is the
// one table the agent's --help and docs/agent.md are written from (a test
// checks that every NSTANCE_* name the agent's code mentions is here).
func Vars() []Var {
	return []Var{
		{Name: EnvInstanceID, Required: true, Usage: "the instance id"},
		{Name: EnvIdentityDir, Required: true, Usage: "identity directory: nonce.jwt and ca.crt from the provider; the agent's key and certificate"},
		{Name: EnvRegistrationAddr, Required: true, Usage: "host:port of the shard's Registration service"},
		{Name: EnvAgentAddr, Required: true, Usage: "host:port of the shard's Agent service"},
		{Name: EnvProviderID, Usage: "the provider's id of the instance, as the provider set it"},
		{Name: EnvShard, Usage: "the shard, as the provider set it"},
		{Name: EnvServerName, Default: "host of the address", Usage: "TLS server name to verify"},
		{Name: EnvKeysDir, Default: "keys beside the identity directory", Usage: "where generated keys are written"},
		{Name: EnvFilesDir, Default: "files beside the identity directory", Usage: "where delivered files are written; identity, keys and files must differ"},
		{Name: EnvKeyFileMode, Default: fmt.Sprintf("%04o", DefaultKeyFileMode), Usage: "mode of key files (octal)"},
		{Name: EnvFileMode, Default: fmt.Sprintf("%04o", DefaultFileMode), Usage: "mode of delivered files (octal)"},
		{Name: EnvDirMode, Default: fmt.Sprintf("%04o", DefaultDirMode), Usage: "mode of created directories (octal)"},
		{Name: EnvMaxFileSize, Default: fmt.Sprint(DefaultMaxFileSize), Usage: "largest file written, in bytes; as the server's default max_file_bytes"},
		{Name: EnvMetricsInterval, Default: dur(DefaultMetricsInterval), Usage: "health report interval"},
		{Name: EnvReconnectMin, Default: dur(DefaultReconnectMin), Usage: "first reconnect backoff"},
		{Name: EnvReconnectMax, Default: dur(DefaultReconnectMax), Usage: "largest reconnect backoff"},
		{Name: EnvDiskPaths, Default: "/", Usage: "comma-separated absolute mount points whose usage is reported"},
		{Name: EnvTerminationFile, Usage: "absolute path of a file polled for a JSON termination notice"},
		{Name: EnvUserData, Usage: "absolute path of the instance's boot script, run after the first delivery (local providers)"},
		{Name: EnvSpotNotice, Default: "auto", Usage: "spot interruption notices from the EC2 instance metadata service: auto (when its instance-life-cycle is spot), imds (always) or off"},
		{Name: EnvSpotPollInterval, Default: dur(DefaultSpotPollInterval), Usage: "spot notice poll interval"},
		{Name: EnvShutdownDetect, Default: "auto", Usage: "whether a stop means the host is going down (reported at once, so the server replaces the instance): auto (systemd says stopping), always or never"},
		{Name: EnvIMDSEndpoint, Default: "the AWS SDK's", Usage: "http(s) URL of the instance metadata service"},
		{Name: EnvHealthAddr, Default: "off", Usage: "host:port to serve GET /healthz on (load balancer health checks; answers the instance id)"},
		{Name: EnvLogLevel, Default: "info", Usage: "log level: debug, info, warn, error, or a verbosity number N"},
		{Name: EnvLogFormat, Default: "auto", Usage: "log format: json, text, or auto (text on a terminal, json otherwise)"},
	}
}

// WriteUsage writes the agent's --help, generated from Vars.
func WriteUsage(w io.Writer, prog string) {
	fmt.Fprintf(w, "Usage: %s [--version | --help]\n\n", prog)
	fmt.Fprintf(w, "Runs the Nstance agent of one instance. It takes no other arguments: it is\n")
	fmt.Fprintf(w, "configured by these environment variables, normally set by the provider that\n")
	fmt.Fprintf(w, "started the instance.\n\n")
	width := 0
	for _, v := range Vars() {
		width = max(width, len(v.Name))
	}
	for _, v := range Vars() {
		note := ""
		switch {
		case v.Required:
			note = " (required)"
		case v.Default != "":
			note = " (default " + v.Default + ")"
		}
		fmt.Fprintf(w, "  %-*s  %s%s\n", width, v.Name, v.Usage, note)
	}
	fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(`
Exit codes: 0 stopped by SIGTERM or SIGINT; 1 a runtime failure (registration
refused, a file that cannot be written); 2 a bad argument or variable.`))
}
