package app

import (
	"context"
	"fmt"
	"math"
	"os"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/agent/config"
	"github.com/nstance-dev/nstance/internal/agent/files"
	"github.com/nstance-dev/nstance/internal/agent/health"
	"github.com/nstance-dev/nstance/internal/agent/healthz"
	"github.com/nstance-dev/nstance/internal/agent/hostdown"
	"github.com/nstance-dev/nstance/internal/agent/identity"
	"github.com/nstance-dev/nstance/internal/agent/keys"
	"github.com/nstance-dev/nstance/internal/agent/register"
	"github.com/nstance-dev/nstance/internal/agent/session"
	"github.com/nstance-dev/nstance/internal/agent/spot"
	"github.com/nstance-dev/nstance/internal/agent/userdata"
)

// Run registers if needed and keeps the agent session alive until ctx ends.
func Run(ctx context.Context, cfg config.Config, version string, log logr.Logger) error {
	id, err := identity.Open(cfg.IdentityDir)
	if err != nil {
		return err
	}
	if cfg.HealthAddr != "" {
		// Served from the start (registration included): a load balancer
		// gets the instance only after its first health report anyway.
		ln, err := healthz.Listen(cfg.HealthAddr)
		if err != nil {
			return err
		}
		hz := &healthz.Server{InstanceID: cfg.InstanceID, Log: log.WithName("healthz")}
		hctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := hz.Serve(hctx, ln); err != nil {
				log.Error(err, "health endpoint stopped")
			}
		}()
		defer func() { stop(); <-done }()
	}
	// Reconnects double from ReconnectMin to ReconnectMax, each wait
	// stretched by up to 100 % at random so a shard's agents spread out
	// after a failover.
	bo := wait.Backoff{Duration: cfg.ReconnectMin, Factor: 2, Jitter: 1, Cap: cfg.ReconnectMax, Steps: math.MaxInt32}
	if err := register.Ensure(ctx, register.Options{
		Addr: cfg.RegistrationAddr, ServerName: cfg.ServerNameFor(cfg.RegistrationAddr), Identity: id,
		Backoff: wait.Backoff{Duration: cfg.ReconnectMin, Factor: 2, Jitter: 0.2, Cap: cfg.ReconnectMax}, Log: log.WithName("register"),
	}); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("registration: %w", err)
	}
	ks, err := keys.NewStore(cfg.KeysDir, cfg.KeyFileMode)
	if err != nil {
		return err
	}
	fw, err := files.New(cfg.FilesDir, files.Options{MaxSize: cfg.MaxFileSize, FileMode: cfg.FileMode, DirMode: cfg.DirMode})
	if err != nil {
		return err
	}
	opts := session.Options{
		Addr: cfg.AgentAddr, ServerName: cfg.ServerNameFor(cfg.AgentAddr), Identity: id, Keys: ks, Files: fw,
		Sampler: health.NewSampler("", cfg.DiskPaths), Interval: cfg.MetricsInterval, TerminationFile: cfg.TerminationFile,
		Backoff: bo, AgentVersion: version, Log: log.WithName("session"),
		Shutdown: (&hostdown.Detector{Mode: cfg.ShutdownDetect}).Check,
	}
	var watcher *spot.Watcher
	if cfg.SpotNotice != "" {
		watcher = &spot.Watcher{Source: spot.IMDS{Client: spot.NewClient(cfg.IMDSEndpoint)}, Interval: cfg.SpotPollInterval, Log: log.WithName("spot"),
			Detect: cfg.SpotNotice == config.SpotNoticeAuto}
		if cfg.SpotNotice == config.SpotNoticeGCP {
			watcher.Source, watcher.Detect = &spot.GCP{Endpoint: cfg.IMDSEndpoint}, true
		}
		opts.Termination = watcher.Notice
	}
	if cfg.UserData != "" {
		// The instance's own bootstrap runs after the agent's first files,
		// as a child that cannot touch the agent; it ends with the agent.
		env := append(os.Environ(), config.EnvFilesDir+"="+cfg.FilesDir, config.EnvKeysDir+"="+cfg.KeysDir)
		ud := &userdata.Runner{Path: cfg.UserData, Env: env, Stdout: os.Stdout, Stderr: os.Stderr, Log: log.WithName("userdata")}
		opts.OnApplied = func() { ud.Start(ctx) }
		defer func() { _ = ud.Wait() }()
	}
	s, err := session.New(opts)
	if err != nil {
		return err
	}
	if watcher != nil {
		// The first report after the notice goes out at once.
		watcher.Notified = s.ReportSoon
		wctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); watcher.Run(wctx) }()
		defer func() { stop(); <-done }()
	}
	log.Info("agent running", "instance", cfg.InstanceID, "agent_addr", cfg.AgentAddr, "files", cfg.FilesDir, "keys", cfg.KeysDir)
	return s.Run(ctx)
}
