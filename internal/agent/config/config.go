package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nstance-dev/nstance/internal/agent/hostdown"
	"github.com/nstance-dev/nstance/internal/logging"
)

// Environment variables read by the agent. The first six are the ones the
// local providers set (internal/server/provider/localagent).
const (
	EnvInstanceID       = "NSTANCE_INSTANCE_ID"
	EnvProviderID       = "NSTANCE_PROVIDER_ID"
	EnvShard            = "NSTANCE_SHARD"
	EnvIdentityDir      = "NSTANCE_IDENTITY_DIR"
	EnvRegistrationAddr = "NSTANCE_REGISTRATION_ADDR"
	EnvAgentAddr        = "NSTANCE_AGENT_ADDR"
	EnvServerName       = "NSTANCE_SERVER_NAME"
	EnvKeysDir          = "NSTANCE_KEYS_DIR"
	EnvFilesDir         = "NSTANCE_FILES_DIR"
	EnvKeyFileMode      = "NSTANCE_KEY_FILE_MODE"
	EnvFileMode         = "NSTANCE_FILE_MODE"
	EnvDirMode          = "NSTANCE_DIR_MODE"
	EnvMaxFileSize      = "NSTANCE_MAX_FILE_SIZE"
	EnvMetricsInterval  = "NSTANCE_METRICS_INTERVAL"
	EnvReconnectMin     = "NSTANCE_RECONNECT_MIN"
	EnvReconnectMax     = "NSTANCE_RECONNECT_MAX"
	EnvDiskPaths        = "NSTANCE_DISK_PATHS"
	EnvTerminationFile  = "NSTANCE_TERMINATION_FILE"
	// EnvUserData names the instance's own bootstrap script, run once the
	// first files are applied (local providers; cloud-init runs it on VMs).
	EnvUserData = "NSTANCE_USER_DATA"
	// EnvSpotNotice "auto" (the default) polls the EC2 instance metadata
	// service for a spot interruption notice when instance-life-cycle says
	// the instance is spot; "imds" polls whatever it says; "gcp" polls the
	// Google Cloud metadata server's instance/preempted when the
	// provisioning model is SPOT (the gcp provider sets it); "off" never.
	EnvSpotNotice       = "NSTANCE_SPOT_NOTICE"
	EnvSpotPollInterval = "NSTANCE_SPOT_POLL_INTERVAL"
	// EnvShutdownDetect says how the agent tells a host shutdown from its
	// own restart when it is stopped (hostdown: auto, always, never).
	EnvShutdownDetect = "NSTANCE_SHUTDOWN_DETECT"
	// EnvIMDSEndpoint overrides the instance metadata address.
	EnvIMDSEndpoint = "NSTANCE_IMDS_ENDPOINT"
	// EnvHealthAddr, when set, is the host:port the agent serves /healthz
	// on (load balancer health checks).
	EnvHealthAddr = "NSTANCE_HEALTH_ADDR"
	EnvLogLevel   = "NSTANCE_LOG_LEVEL"
	EnvLogFormat  = "NSTANCE_LOG_FORMAT"
)

// Config is the agent's configuration.
type Config struct {
	InstanceID       string
	ProviderID       string
	Shard            string
	RegistrationAddr string
	AgentAddr        string
	// ServerName overrides the TLS server name (default: host of the address).
	ServerName string

	IdentityDir string
	KeysDir     string
	FilesDir    string
	KeyFileMode fs.FileMode
	FileMode    fs.FileMode
	DirMode     fs.FileMode
	MaxFileSize int64

	MetricsInterval time.Duration
	ReconnectMin    time.Duration
	ReconnectMax    time.Duration
	DiskPaths       []string
	// TerminationFile, when set, is polled for a JSON termination notice.
	TerminationFile string
	// UserData, when set, is the instance's bootstrap script (absolute
	// path), run after the first delivery of files is applied.
	UserData string
	// SpotNotice is "auto" to poll the EC2 instance metadata service for a
	// spot interruption notice every SpotPollInterval, at IMDSEndpoint
	// (empty: the SDK's default), when its instance-life-cycle is spot;
	// "imds" to poll without asking; "gcp" to poll the Google Cloud
	// metadata server (IMDSEndpoint: its address) when the instance is
	// spot; "" turns it off.
	SpotNotice       string
	SpotPollInterval time.Duration
	IMDSEndpoint     string
	// HealthAddr, when set, is where /healthz is served ("" : not served).
	HealthAddr string
	// ShutdownDetect is hostdown's mode: auto, always or never.
	ShutdownDetect string
	// Log is the logging set-up (NSTANCE_LOG_LEVEL, NSTANCE_LOG_FORMAT).
	Log logging.Options
}

// Spot notice modes (NSTANCE_SPOT_NOTICE; "off" is "").
const (
	SpotNoticeAuto = "auto"
	SpotNoticeIMDS = "imds"
	SpotNoticeGCP  = "gcp"
)

// Defaults.
const (
	DefaultKeyFileMode fs.FileMode = 0o600
	DefaultFileMode    fs.FileMode = 0o644
	DefaultDirMode     fs.FileMode = 0o755
	// DefaultMaxFileSize matches the server's default
	// shard.limits.max_file_bytes, so any delivery the server sends by
	// default is written (raise both together).
	DefaultMaxFileSize     = 8 << 20
	DefaultMetricsInterval = 10 * time.Second
	DefaultReconnectMin    = 500 * time.Millisecond
	DefaultReconnectMax    = 30 * time.Second
	// DefaultSpotPollInterval is how often the spot notice is polled.
	DefaultSpotPollInterval = 5 * time.Second
)

// Error lists every invalid variable.
type Error struct{ Problems []string }

func (e *Error) Error() string {
	return "agent configuration: " + strings.Join(e.Problems, "; ")
}

type parser struct {
	lookup func(string) (string, bool)
	errs   []string
}

func (p *parser) get(name string) string {
	v, _ := p.lookup(name)
	return strings.TrimSpace(v)
}

func (p *parser) fail(name, format string, args ...any) {
	p.errs = append(p.errs, name+": "+fmt.Sprintf(format, args...))
}

func (p *parser) required(name string) string {
	v := p.get(name)
	if v == "" {
		p.fail(name, "required")
	}
	return v
}

func (p *parser) addr(name string) string {
	v := p.required(name)
	if v == "" {
		return ""
	}
	host, port, err := net.SplitHostPort(v)
	if err != nil || host == "" {
		p.fail(name, "%q is not host:port", v)
		return v
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		p.fail(name, "port %q is not 1-65535", port)
	}
	return v
}

func (p *parser) dir(name, def string) string {
	v := p.get(name)
	if v == "" {
		v = def
	}
	if v == "" {
		return ""
	}
	if !filepath.IsAbs(v) {
		abs, err := filepath.Abs(v)
		if err != nil {
			p.fail(name, "cannot make %q absolute: %v", v, err)
			return v
		}
		v = abs
	}
	return filepath.Clean(v)
}

func (p *parser) mode(name string, def fs.FileMode) fs.FileMode {
	v := p.get(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseUint(strings.TrimPrefix(v, "0o"), 8, 32)
	if err != nil || n == 0 || n > 0o777 {
		p.fail(name, "%q is not an octal permission between 0001 and 0777", v)
		return def
	}
	if n&0o400 == 0 {
		p.fail(name, "%q does not let the owner read", v)
	}
	return fs.FileMode(n)
}

func (p *parser) duration(name string, def time.Duration) time.Duration {
	v := p.get(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		p.fail(name, "%q is not a positive duration", v)
		return def
	}
	return d
}

// Load reads the configuration through lookup (os.LookupEnv in production).
func Load(lookup func(string) (string, bool)) (Config, error) {
	if lookup == nil {
		return Config{}, errors.New("agent configuration: no environment lookup")
	}
	p := &parser{lookup: lookup}
	c := Config{
		InstanceID:       p.required(EnvInstanceID),
		ProviderID:       p.get(EnvProviderID),
		Shard:            p.get(EnvShard),
		RegistrationAddr: p.addr(EnvRegistrationAddr),
		AgentAddr:        p.addr(EnvAgentAddr),
		ServerName:       p.get(EnvServerName),
		IdentityDir:      p.dir(EnvIdentityDir, ""),
		KeyFileMode:      p.mode(EnvKeyFileMode, DefaultKeyFileMode),
		FileMode:         p.mode(EnvFileMode, DefaultFileMode),
		DirMode:          p.mode(EnvDirMode, DefaultDirMode),
		MetricsInterval:  p.duration(EnvMetricsInterval, DefaultMetricsInterval),
		ReconnectMin:     p.duration(EnvReconnectMin, DefaultReconnectMin),
		ReconnectMax:     p.duration(EnvReconnectMax, DefaultReconnectMax),
		TerminationFile:  p.get(EnvTerminationFile),
		UserData:         p.get(EnvUserData),
		SpotNotice:       p.get(EnvSpotNotice),
		SpotPollInterval: p.duration(EnvSpotPollInterval, DefaultSpotPollInterval),
		IMDSEndpoint:     p.get(EnvIMDSEndpoint),
		HealthAddr:       p.get(EnvHealthAddr),
		ShutdownDetect:   p.get(EnvShutdownDetect),
		Log:              logging.Defaults(),
		MaxFileSize:      DefaultMaxFileSize,
	}
	if c.IdentityDir == "" {
		p.fail(EnvIdentityDir, "required")
	} else {
		base := filepath.Dir(c.IdentityDir)
		c.KeysDir = p.dir(EnvKeysDir, filepath.Join(base, "keys"))
		c.FilesDir = p.dir(EnvFilesDir, filepath.Join(base, "files"))
		seen := map[string]string{}
		for _, d := range []struct{ name, v string }{{EnvIdentityDir, c.IdentityDir}, {EnvKeysDir, c.KeysDir}, {EnvFilesDir, c.FilesDir}} {
			if other, ok := seen[d.v]; ok {
				p.fail(d.name, "must differ from %s (%s)", other, d.v)
			}
			seen[d.v] = d.name
		}
	}
	if v := p.get(EnvMaxFileSize); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 || n > 64<<20 {
			p.fail(EnvMaxFileSize, "%q is not a byte count between 1 and 67108864", v)
		} else {
			c.MaxFileSize = n
		}
	}
	if c.ReconnectMax < c.ReconnectMin {
		p.fail(EnvReconnectMax, "%s is below %s (%s)", c.ReconnectMax, EnvReconnectMin, c.ReconnectMin)
	}
	c.DiskPaths = []string{"/"}
	if v := p.get(EnvDiskPaths); v != "" {
		c.DiskPaths = nil
		for _, d := range strings.Split(v, ",") {
			if d = strings.TrimSpace(d); d == "" {
				continue
			}
			if !filepath.IsAbs(d) {
				p.fail(EnvDiskPaths, "%q is not an absolute path", d)
				continue
			}
			c.DiskPaths = append(c.DiskPaths, filepath.Clean(d))
		}
		sort.Strings(c.DiskPaths)
	}
	if v := p.get(EnvLogLevel); v != "" {
		if _, err := logging.ParseLevel(v); err != nil {
			p.fail(EnvLogLevel, "%v", err)
		}
		c.Log.Level = v
	}
	if v := p.get(EnvLogFormat); v != "" {
		if err := (logging.Options{Format: v}).Validate(); err != nil {
			p.fail(EnvLogFormat, "%v", err)
		}
		c.Log.Format = v
	}
	if m, err := hostdown.ParseMode(c.ShutdownDetect); err != nil {
		p.fail(EnvShutdownDetect, "%v", err)
	} else {
		c.ShutdownDetect = m
	}
	switch c.SpotNotice {
	case "auto", "imds", "gcp":
	case "":
		c.SpotNotice = SpotNoticeAuto
	case "off":
		c.SpotNotice = ""
	default:
		p.fail(EnvSpotNotice, "%q is not auto, imds, gcp or off", c.SpotNotice)
	}
	if c.IMDSEndpoint != "" {
		if u, err := url.Parse(c.IMDSEndpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			p.fail(EnvIMDSEndpoint, "%q is not an http(s) URL", c.IMDSEndpoint)
		}
	}
	if c.HealthAddr != "" {
		if _, port, err := net.SplitHostPort(c.HealthAddr); err != nil || port == "" {
			p.fail(EnvHealthAddr, "%q is not host:port (an empty host listens on every address)", c.HealthAddr)
		}
	}
	if c.TerminationFile != "" && !filepath.IsAbs(c.TerminationFile) {
		p.fail(EnvTerminationFile, "%q is not an absolute path", c.TerminationFile)
	}
	if c.UserData != "" && !filepath.IsAbs(c.UserData) {
		p.fail(EnvUserData, "%q is not an absolute path", c.UserData)
	}
	if len(p.errs) > 0 {
		return Config{}, &Error{Problems: p.errs}
	}
	return c, nil
}

// ServerNameFor returns the TLS server name to verify for addr.
func (c Config) ServerNameFor(addr string) string {
	if c.ServerName != "" {
		return c.ServerName
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return host
}
