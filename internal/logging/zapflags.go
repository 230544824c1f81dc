package logging

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
)

// BindZapFlags registers controller-runtime's zap flags (those of
// sigs.k8s.io/controller-runtime/pkg/log/zap.Options.BindFlags), which a
// kubebuilder or Cluster API deployment passes, as other spellings of the
// same options: one logger, whichever flags set it. Call it after BindFlags.
//
//	--zap-log-level        = --log-level (debug, info, error, panic, or a verbosity N > 0)
//	--zap-encoder          = --log-format (json, or console = text)
//	--zap-devel            development defaults: debug, text, stack traces from warn
//	--zap-stacktrace-level attach stack traces from this level (info, error, panic); default never
//	--zap-time-encoding    epoch, millis, nano, iso8601 (default), rfc3339, rfc3339nano
//
// Where two flags set the same option, the last one given wins.
func (o *Options) BindZapFlags(fs *flag.FlagSet) {
	fs.Func("zap-log-level", "controller-runtime's spelling of --log-level: debug, info, error, panic, or a verbosity number N > 0", func(v string) error {
		if _, err := ParseLevel(v); err != nil {
			return err
		}
		o.Level = v
		return nil
	})
	fs.Func("zap-encoder", "controller-runtime's spelling of --log-format: json or console (= text)", func(v string) error {
		switch strings.ToLower(v) {
		case "json":
			o.Format = FormatJSON
		case "console":
			o.Format = FormatText
		default:
			return fmt.Errorf("%q: want json or console", v)
		}
		return nil
	})
	fs.BoolFunc("zap-devel", "development logging defaults: level debug, text format, stack traces from warn (explicit --log-level and --log-format win)", func(v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return err
		}
		o.Devel = b
		return nil
	})
	fs.Func("zap-stacktrace-level", "attach a stack trace to entries at this level and above: info, error or panic (default: never)", func(v string) error {
		if _, err := ParseLevel(v); err != nil {
			return err
		}
		o.StacktraceLevel = v
		return nil
	})
	fs.Func("zap-time-encoding", "time format of log entries: epoch, millis, nano, iso8601 (default), rfc3339 or rfc3339nano", func(v string) error {
		if _, err := timeEncoder(v); err != nil {
			return err
		}
		o.TimeEncoding = v
		return nil
	})
}

// ZapFlags names the flags BindZapFlags registers.
func ZapFlags() []string {
	return []string{"zap-log-level", "zap-encoder", "zap-devel", "zap-stacktrace-level", "zap-time-encoding"}
}
