package devs3

import (
	"context"
	"fmt"
	"net"
	"sync"
)

// Running is a server started by Start.
type Running struct {
	*Server
	// URL is the endpoint, e.g. http://127.0.0.1:40123.
	URL    string
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// Start serves cfg on ln in the background (tests and benchmarks use it
// with a 127.0.0.1:0 listener). Stop ends it.
func Start(ctx context.Context, ln net.Listener, cfg Config) (*Running, error) {
	srv, err := New(cfg)
	if err != nil {
		ln.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &Running{Server: srv, URL: fmt.Sprintf("http://%s", ln.Addr().String()), cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- srv.Serve(ctx, ln) }()
	return r, nil
}

// Stop shuts the server down gracefully and waits for it. Later calls
// return the first call's result.
func (r *Running) Stop() error {
	r.once.Do(func() {
		r.cancel()
		r.err = <-r.done
	})
	return r.err
}
