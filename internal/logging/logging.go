package logging

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	ucli "github.com/urfave/cli/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Formats accepted by --log-format.
const (
	FormatAuto = "auto"
	FormatJSON = "json"
	FormatText = "text"
)

// Options are the values of the two logging flags.
type Options struct {
	// Level is debug, info, warn, error or a verbosity number (V(N) enabled).
	Level string
	// Format is json, text or auto (text on a terminal, json otherwise).
	Format string
	// The rest are set only by controller-runtime's zap flags
	// (BindZapFlags), which the operator accepts as every kubebuilder
	// project does.

	// Devel (--zap-devel) turns the defaults into development ones: level
	// debug, text, stack traces from warn. Values given explicitly (other
	// than the defaults) are kept.
	Devel bool
	// StacktraceLevel (--zap-stacktrace-level) attaches a stack trace to
	// entries at this level and above; empty means never (our default).
	StacktraceLevel string
	// TimeEncoding (--zap-time-encoding) is epoch, millis, nano, iso8601
	// (empty: the default), rfc3339 or rfc3339nano.
	TimeEncoding string
}

// Defaults returns the options used when no flag or variable is set.
func Defaults() Options { return Options{Level: "info", Format: FormatAuto} }

// EnvLevel and EnvFormat name the variables read for a binary's prefix.
func EnvLevel(prefix string) string  { return prefix + "_LOG_LEVEL" }
func EnvFormat(prefix string) string { return prefix + "_LOG_FORMAT" }

// CLIFlags returns the two flags for a urfave/cli application; envPrefix is
// e.g. "NSTANCE" or "DEV_K8S".
func CLIFlags(envPrefix string) []ucli.Flag {
	d := Defaults()
	return []ucli.Flag{
		&ucli.StringFlag{Name: "log-level", Value: d.Level, EnvVars: []string{EnvLevel(envPrefix)},
			Usage: "log level: debug, info, warn, error, or a verbosity number N"},
		&ucli.StringFlag{Name: "log-format", Value: d.Format, EnvVars: []string{EnvFormat(envPrefix)},
			Usage: "log format: json, text, or auto (text on a terminal, json otherwise)"},
	}
}

// FromCLI reads the options set by CLIFlags.
func FromCLI(c *ucli.Context) Options {
	return Options{Level: c.String("log-level"), Format: c.String("log-format")}
}

// BindFlags registers the two flags on a standard library FlagSet. Their
// defaults come from the environment variables of envPrefix, so a flag given
// on the command line wins over the variable.
func (o *Options) BindFlags(fs *flag.FlagSet, envPrefix string, getenv func(string) string) {
	d := Defaults()
	if v := getenv(EnvLevel(envPrefix)); v != "" {
		d.Level = v
	}
	if v := getenv(EnvFormat(envPrefix)); v != "" {
		d.Format = v
	}
	fs.StringVar(&o.Level, "log-level", d.Level,
		fmt.Sprintf("log level: debug, info, warn, error, or a verbosity number N (env %s)", EnvLevel(envPrefix)))
	fs.StringVar(&o.Format, "log-format", d.Format,
		fmt.Sprintf("log format: json, text, or auto: text on a terminal, json otherwise (env %s)", EnvFormat(envPrefix)))
}

// ParseLevel turns a level name or verbosity number into a zap level. A
// verbosity N maps to zap level -N, which is how zapr enables V(N).
func ParseLevel(s string) (zapcore.Level, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" {
		return zapcore.InfoLevel, nil
	}
	if n, err := strconv.Atoi(s); err == nil {
		if n < 0 || n > 127 {
			return 0, fmt.Errorf("log level %q: a verbosity must be between 0 and 127", s)
		}
		return zapcore.Level(-n), nil
	}
	switch s {
	case "debug":
		return zapcore.DebugLevel, nil
	case "info":
		return zapcore.InfoLevel, nil
	case "warn", "warning":
		return zapcore.WarnLevel, nil
	case "error":
		return zapcore.ErrorLevel, nil
	case "panic":
		// controller-runtime's --zap-log-level accepts it: errors are
		// hidden too. (Nothing panics because of a level.)
		return zapcore.PanicLevel, nil
	}
	return 0, fmt.Errorf("log level %q: want debug, info, warn, error or a verbosity number", s)
}

// Validate checks the options without building a logger.
func (o Options) Validate() error {
	if _, err := ParseLevel(o.Level); err != nil {
		return err
	}
	if o.StacktraceLevel != "" {
		if _, err := ParseLevel(o.StacktraceLevel); err != nil {
			return fmt.Errorf("stack trace %w", err)
		}
	}
	if _, err := timeEncoder(o.TimeEncoding); err != nil {
		return err
	}
	switch strings.ToLower(o.Format) {
	case "", FormatAuto, FormatJSON, FormatText:
		return nil
	}
	return fmt.Errorf("log format %q: want json, text or auto", o.Format)
}

// effective applies Devel to the options still at their defaults.
func (o Options) effective() Options {
	if !o.Devel {
		return o
	}
	d := Defaults()
	if o.Level == "" || o.Level == d.Level {
		o.Level = "debug"
	}
	if o.Format == "" || o.Format == d.Format {
		o.Format = FormatText
	}
	if o.StacktraceLevel == "" {
		o.StacktraceLevel = "warn"
	}
	return o
}

// timeEncoder maps --zap-time-encoding's names (controller-runtime's) onto
// zap's encoders; empty is ISO 8601, our default.
func timeEncoder(name string) (zapcore.TimeEncoder, error) {
	switch strings.ToLower(name) {
	case "", "iso8601":
		return zapcore.ISO8601TimeEncoder, nil
	case "epoch":
		return zapcore.EpochTimeEncoder, nil
	case "millis":
		return zapcore.EpochMillisTimeEncoder, nil
	case "nano":
		return zapcore.EpochNanosTimeEncoder, nil
	case "rfc3339":
		return zapcore.RFC3339TimeEncoder, nil
	case "rfc3339nano":
		return zapcore.RFC3339NanoTimeEncoder, nil
	}
	return nil, fmt.Errorf("time encoding %q: want epoch, millis, nano, iso8601, rfc3339 or rfc3339nano", name)
}

// New builds the logger writing to w (os.Stderr when nil). The returned func
// flushes buffered entries; call it before the process exits.
func New(o Options, w io.Writer) (logr.Logger, func(), error) {
	if err := o.Validate(); err != nil {
		return logr.Discard(), func() {}, err
	}
	if w == nil {
		w = os.Stderr
	}
	o = o.effective()
	lvl, _ := ParseLevel(o.Level)
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = "ts"
	enc.EncodeTime, _ = timeEncoder(o.TimeEncoding)
	enc.EncodeDuration = zapcore.StringDurationEncoder
	var encoder zapcore.Encoder
	if resolveFormat(o.Format, w) == FormatJSON {
		encoder = zapcore.NewJSONEncoder(enc)
	} else {
		enc.EncodeLevel = zapcore.CapitalLevelEncoder
		encoder = zapcore.NewConsoleEncoder(enc)
	}
	ws := zapcore.Lock(zapcore.AddSync(w))
	// No zap.AddStacktrace unless asked for: an error is one line,
	// whatever its level.
	zopts := []zap.Option{zap.AddCaller(), zap.ErrorOutput(ws)}
	if o.StacktraceLevel != "" {
		st, _ := ParseLevel(o.StacktraceLevel)
		zopts = append(zopts, zap.AddStacktrace(st))
	}
	z := zap.New(zapcore.NewCore(encoder, ws, zap.NewAtomicLevelAt(lvl)), zopts...)
	return zapr.NewLogger(z), func() { _ = z.Sync() }, nil
}

// resolveFormat decides auto: text when w is a terminal, json otherwise.
func resolveFormat(format string, w io.Writer) string {
	switch strings.ToLower(format) {
	case FormatJSON:
		return FormatJSON
	case FormatText:
		return FormatText
	}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			return FormatText
		}
	}
	return FormatJSON
}

// Started logs the binary's name and version; every binary calls it first.
func Started(log logr.Logger, binary, version string, keysAndValues ...any) {
	log.WithCallDepth(1).Info("starting", append([]any{"binary", binary, "version", version}, keysAndValues...)...)
}
