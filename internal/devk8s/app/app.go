package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/nstance-dev/nstance/internal/devguard"
	"github.com/nstance-dev/nstance/internal/devk8s/apiserver"
	"github.com/nstance-dev/nstance/internal/devk8s/certs"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
)

// DefaultAddr is where dev-k8s listens unless told otherwise: loopback
// only, so nothing outside the machine reaches it.
const DefaultAddr = "127.0.0.1:6443"

// KubeconfigName is the kubeconfig written into the data directory.
const KubeconfigName = "kubeconfig"

// Config is the command line of dev-k8s.
type Config struct {
	Addr string
	Dir  string
	TLS  bool
	// TLSSANs are extra host names or IPs for the serving certificate
	// (needed when clients connect through a non-loopback address).
	TLSSANs []string
	// AllowedHosts are host names (or host:port) clients use in the Host
	// header besides IP addresses, localhost and the TLSSANs; any other
	// Host is refused with 421 (DNS rebinding, see internal/devguard).
	AllowedHosts []string
	// KubeconfigOut is an extra copy of the kubeconfig (the data directory
	// always gets one).
	KubeconfigOut string
	// TokenFile is an optional static token file of extra users.
	TokenFile string
	// ClientCAFile turns on client certificate authentication (needs
	// TLS): the listener asks clients for a certificate, and one that
	// verifies against this bundle authenticates as CN (user) and O
	// (groups). It is reloaded when it changes and may be written after
	// the start.
	ClientCAFile string
	// CRDPaths are CRD files or directories of them.
	CRDPaths    []string
	Controllers bool
}

// Running is a started dev-k8s.
type Running struct {
	// URL is where clients reach the server.
	URL    string
	Server *apiserver.Server
	CAPEM  []byte
	// Authenticators names the authentication methods that are on.
	Authenticators []string
	// Kubeconfig is the absolute path of the kubeconfig in the data
	// directory; it authenticates as the admin user with AdminToken.
	Kubeconfig string
	AdminToken string
	done       chan error
	http       *http.Server
}

// Usage is the short guide printed at start.
func (r *Running) Usage() string {
	return fmt.Sprintf("dev-k8s is serving %s\n  authentication: %s\n  export KUBECONFIG=%s\n  kubectl get namespaces\n", r.URL, strings.Join(r.Authenticators, ", "), r.Kubeconfig)
}

// Wait blocks until the server stops.
func (r *Running) Wait() error { return <-r.done }

// Start launches dev-k8s; it stops when ctx ends.
func Start(ctx context.Context, log logr.Logger, cfg Config) (*Running, error) {
	files, err := crdFiles(cfg.CRDPaths)
	if err != nil {
		return nil, err
	}
	if cfg.Addr == "" {
		cfg.Addr = DefaultAddr
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("data directory %q: %w", cfg.Dir, err)
	}
	cfg.Dir = dir
	// The names in the serving certificate are names clients use.
	guard, err := devguard.New(devguard.Options{Server: "dev-k8s", Flag: "--allowed-host (or --tls-san)", AllowedHosts: append(append([]string(nil), cfg.AllowedHosts...), cfg.TLSSANs...)})
	if err != nil {
		return nil, err
	}
	if cfg.ClientCAFile != "" {
		if !cfg.TLS {
			return nil, errors.New("a client CA file needs TLS: clients send certificates only in a TLS handshake")
		}
		if cfg.ClientCAFile, err = filepath.Abs(cfg.ClientCAFile); err != nil {
			return nil, fmt.Errorf("client CA file: %w", err)
		}
	}
	srv, err := apiserver.New(ctx, log, apiserver.Options{Dir: cfg.Dir, CRDFiles: files, Controllers: cfg.Controllers, TokenFile: cfg.TokenFile, ClientCAFile: cfg.ClientCAFile})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		_ = srv.Close()
		return nil, fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	host := clientHost(ln.Addr())
	// dev-k8s sets no CORS headers; the guard refuses preflights and
	// foreign Host names before the API server sees the request.
	hs := &http.Server{Handler: guard.Wrap(srv), ReadHeaderTimeout: 10 * time.Second}
	hs.RegisterOnShutdown(srv.StopWatches)
	run := &Running{Server: srv, http: hs, done: make(chan error, 1), AdminToken: srv.AdminToken(), Kubeconfig: filepath.Join(cfg.Dir, KubeconfigName), Authenticators: srv.AuthMethods()}
	scheme := "http"
	if cfg.TLS {
		bundle, err := certs.LoadOrCreate(filepath.Join(cfg.Dir, store.StateDirName, "tls"), tlsHosts(cfg))
		if err != nil {
			_ = ln.Close()
			_ = srv.Close()
			return nil, err
		}
		tlsCfg, err := bundle.TLSConfig()
		if err != nil {
			_ = ln.Close()
			_ = srv.Close()
			return nil, err
		}
		if cfg.ClientCAFile != "" {
			// As kube-apiserver: ask for a certificate but let the
			// handshake succeed whatever comes, so token clients keep
			// working and a certificate that does not verify is a 401
			// from the authenticator rather than a TLS alert.
			tlsCfg.ClientAuth = tls.RequestClientCert
		}
		hs.TLSConfig = tlsCfg
		run.CAPEM = bundle.CAPEM
		scheme = "https"
	}
	run.URL = scheme + "://" + host
	for _, p := range []string{run.Kubeconfig, cfg.KubeconfigOut} {
		if p == "" {
			continue
		}
		if err := certs.WriteKubeconfig(p, run.URL, run.CAPEM, run.AdminToken); err != nil {
			_ = ln.Close()
			_ = srv.Close()
			return nil, err
		}
	}
	go func() {
		var err error
		if cfg.TLS {
			err = hs.ServeTLS(ln, "", "")
		} else {
			err = hs.Serve(ln)
		}
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		run.done <- errors.Join(err, srv.Close())
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
		_ = hs.Close()
	}()
	if !cfg.TLS {
		log.Info("plain HTTP: client-go (kubectl, controller-runtime) does not send the kubeconfig's token over HTTP; use TLS for them, or send the header yourself")
	}
	log.Info("dev-k8s serving", "url", run.URL, "dir", cfg.Dir, "kubeconfig", run.Kubeconfig, "crdFiles", len(files), "authentication", run.Authenticators)
	return run, nil
}

// tlsHosts are the certificate's extra names: --tls-san values and the
// listen host when it is a specific address.
func tlsHosts(cfg Config) []string {
	hosts := append([]string(nil), cfg.TLSSANs...)
	if h, _, err := net.SplitHostPort(cfg.Addr); err == nil && h != "" {
		if ip := net.ParseIP(h); ip == nil || !ip.IsUnspecified() {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

func clientHost(addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return addr.String()
	}
	ip := tcp.IP.String()
	if tcp.IP.IsUnspecified() {
		ip = "127.0.0.1"
	}
	return net.JoinHostPort(ip, fmt.Sprint(tcp.Port))
}

// crdFiles expands directories into their .yaml, .yml and .json files.
func crdFiles(paths []string) ([]string, error) {
	var out []string
	for _, p := range paths {
		info, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("CRD path: %w", err)
		}
		if !info.IsDir() {
			out = append(out, p)
			continue
		}
		ents, err := os.ReadDir(p)
		if err != nil {
			return nil, fmt.Errorf("read CRD directory: %w", err)
		}
		var names []string
		for _, e := range ents {
			n := e.Name()
			if !e.IsDir() && (strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml") || strings.HasSuffix(n, ".json")) {
				names = append(names, filepath.Join(p, n))
			}
		}
		sort.Strings(names)
		out = append(out, names...)
	}
	return out, nil
}
