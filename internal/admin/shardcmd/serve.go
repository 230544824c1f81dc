package shardcmd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/admin/adminserve"
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
		&cli.StringFlag{Name: "token-file", Usage: "file holding the token every request must carry, created (mode 0600) with a random token when missing; refused when group or others may read it (default: serve.token beside the context file)", EnvVars: []string{"NSTANCE_ADMIN_TOKEN_FILE"}},
		&cli.StringSliceFlag{Name: "allowed-host", Usage: "host name (or host:port) requests may name in their Host header besides localhost and IP addresses, e.g. for a reverse proxy (repeatable)"},
		&cli.DurationFlag{Name: "shutdown-timeout", Value: 10 * time.Second, Usage: "on SIGTERM or SIGINT, how long open requests may take to finish"},
	)
	return &cli.Command{
		Name:  "serve",
		Usage: "serve the live status page (/) and the config and group operations as a JSON HTTP API (/v1/shards) until SIGTERM or SIGINT",
		Description: "Every request needs the token of --token-file (created on the first start and printed once, with the\n" +
			"status page's URL): browsers open /?token=TOKEN once (an HttpOnly, SameSite=Strict cookie follows),\n" +
			"API clients send Authorization: Bearer TOKEN. Requests naming another Host than localhost, an IP\n" +
			"address or an --allowed-host (421), from another Origin (403), or with a body that is not\n" +
			"application/json (415) are refused.",
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
			tokenFile := c.String("token-file")
			if tokenFile == "" {
				ctxPath, err := conn.Path(c)
				if err != nil {
					return fmt.Errorf("--token-file: %w", err)
				}
				tokenFile = adminserve.DefaultTokenPath(ctxPath)
			}
			token, created, err := adminserve.LoadOrCreateToken(tokenFile)
			if err != nil {
				return err
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
			url := pageURL(ln.Addr())
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
			guarded, err := adminserve.Handler(adminserve.Options{Token: token, AllowedHosts: c.StringSlice("allowed-host"), Log: log.WithName("http")}, mux)
			if err != nil {
				return err
			}
			srv := &http.Server{Handler: guarded, ReadHeaderTimeout: 10 * time.Second}
			// Event streams never finish by themselves: stopping the
			// collector ends them, so Shutdown waits only for API calls.
			srv.RegisterOnShutdown(stopCollector)
			if created {
				// The only time the token is shown: it is in the file from now on.
				fmt.Fprintf(c.App.Writer, "nstance-admin serve: new token written to %s (mode 0600)\n"+
					"  status page: %s/?token=%s\n  API: curl -H \"Authorization: Bearer $(cat %s)\" %s/v1/shards\n", tokenFile, url, token, tokenFile, url)
			}
			log.Info("serving the status page and the HTTP API", "url", url, "token_file", tokenFile, "shards", shard.FormatServers(st.Servers), "context", st.Context)
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

// pageURL is the status page's base URL for the bound address; an
// unspecified address (0.0.0.0, ::) is shown as localhost.
func pageURL(a net.Addr) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok {
		return "http://" + a.String()
	}
	if tcp.IP.IsUnspecified() {
		return fmt.Sprintf("http://localhost:%d", tcp.Port)
	}
	return "http://" + net.JoinHostPort(tcp.IP.String(), strconv.Itoa(tcp.Port))
}
