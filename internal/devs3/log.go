package devs3

import (
	"fmt"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// NewLogger builds the zap-backed logr.Logger used by cmd/dev-s3. level is
// debug (every request is logged), info, warn or error. The returned func
// flushes the log.
func NewLogger(level string) (logr.Logger, func(), error) {
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return logr.Discard(), func() {}, fmt.Errorf("log level %q: %w", level, err)
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.Encoding = "console"
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	cfg.Sampling = nil
	z, err := cfg.Build()
	if err != nil {
		return logr.Discard(), func() {}, fmt.Errorf("build logger: %w", err)
	}
	return zapr.NewLogger(z), func() { _ = z.Sync() }, nil
}
