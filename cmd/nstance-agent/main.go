// Command nstance-agent runs on every managed instance: it registers with the
// shard server, generates the keys its template asks for, writes the files the
// server delivers and streams health reports. It is configured entirely by
// NSTANCE_* environment variables (see internal/agent/config).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/nstance-dev/nstance/internal/agent/app"
	"github.com/nstance-dev/nstance/internal/agent/config"
	"github.com/nstance-dev/nstance/internal/version"
)

func main() {
	cfg, err := config.Load(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	level := zapcore.InfoLevel
	if cfg.LogLevel != "" {
		_ = level.Set(cfg.LogLevel)
	}
	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(level)
	zl, err := zc.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, "logger:", err)
		os.Exit(1)
	}
	defer zl.Sync() //nolint:errcheck
	log := zapr.NewLogger(zl).WithValues("instance", cfg.InstanceID)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.Run(ctx, cfg, version.Version, log); err != nil {
		log.Error(err, "agent stopped")
		zl.Sync() //nolint:errcheck
		os.Exit(1)
	}
	log.Info("agent stopped")
}
