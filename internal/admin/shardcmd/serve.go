package shardcmd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/admin/cmdutil"
	"github.com/nstance-dev/nstance/internal/admin/conn"
	"github.com/nstance-dev/nstance/internal/admin/shard"
	"github.com/nstance-dev/nstance/internal/admin/status"
	"github.com/nstance-dev/nstance/internal/logging"
	"github.com/nstance-dev/nstance/internal/version"
)

func serveCommand() *cli.Command {
	fs := append(conn.SettingFlags(), conn.FileFlags()...)
	fs = append(fs,
		&cli.StringFlag{Name: "listen", Value: "127.0.0.1:8980", Usage: "HTTP listen address", EnvVars: []string{"NSTANCE_ADMIN_LISTEN"}},
		&cli.DurationFlag{Name: "status-refresh", Value: 10 * time.Second, Usage: "how often the status page lists every shard besides on watch events"},
		&cli.DurationFlag{Name: "shutdown-timeout", Value: 10 * time.Second, Usage: "on SIGTERM or SIGINT, how long open requests may take to finish"},
	)
	return &cli.Command{
		Name:  "serve",
		Usage: "serve the live status page (/) and the config and group operations as a JSON HTTP API (/v1/shards) until SIGTERM or SIGINT",
		Flags: append(fs, cmdutil.LogFlags()...),
		Action: func(c *cli.Context) error {
			log, flush, err := cmdutil.Logger(c)
			if err != nil {
				return err
			}
			defer flush()
			logging.Started(log, "nstance-admin", version.Version, "command", "serve")
			if c.Duration("shutdown-timeout") <= 0 {
				return fmt.Errorf("--shutdown-timeout must be positive, got %s", c.Duration("shutdown-timeout"))
			}
			set, st, err := conn.Dial(c)
			if err != nil {
				return err
			}
			defer set.Close()
			ln, err := net.Listen("tcp", c.String("listen"))
			if err != nil {
				return fmt.Errorf("--listen: %w", err)
			}
			if c.Duration("status-refresh") <= 0 {
				return fmt.Errorf("--status-refresh must be positive, got %s", c.Duration("status-refresh"))
			}
			col, err := status.NewCollector(status.Options{Shards: set, Addresses: st.Servers, Refresh: c.Duration("status-refresh"), Log: log.WithName("status")})
			if err != nil {
				return err
			}
			cctx, stopCollector := context.WithCancel(c.Context)
			collected := make(chan struct{})
			go func() { defer close(collected); _ = col.Run(cctx) }()
			defer func() { stopCollector(); <-collected }()
			mux := http.NewServeMux()
			api := shard.Handler(set)
			mux.Handle("/v1/shards", api)
			mux.Handle("/v1/shards/", api)
			mux.Handle("/", status.Handler(col, 0))
			srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
			// Event streams never finish by themselves: stopping the
			// collector ends them, so Shutdown waits only for API calls.
			srv.RegisterOnShutdown(stopCollector)
			log.Info("serving the status page and the HTTP API", "url", "http://"+ln.Addr().String(), "shards", shard.FormatServers(st.Servers), "context", st.Context)
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			select {
			case err := <-served:
				return fmt.Errorf("serving HTTP: %w", err)
			case <-c.Context.Done():
			}
			log.Info("stopping: finishing open requests", "timeout", c.Duration("shutdown-timeout").String())
			sctx, cancel := context.WithTimeout(context.Background(), c.Duration("shutdown-timeout"))
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil {
				log.Info("open requests did not finish in time; closing them", "reason", err.Error())
				_ = srv.Close()
			}
			if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serving HTTP: %w", err)
			}
			log.Info("stopped")
			return nil
		},
	}
}
