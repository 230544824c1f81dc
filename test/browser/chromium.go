// Package browser holds tests that drive headless Chromium, as a web page
// the developer opens would, against the development tools (dev-s3,
// dev-k8s), and Start and Eval, the helpers that run Chromium for them (and
// for other tests that need a real browser).
package browser

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/nstance-dev/nstance/internal/testing/hosttools"
	"github.com/nstance-dev/nstance/internal/testing/portpick"
)

// Options are the Chromium command-line switches a test may set.
type Options struct {
	// HostResolverRules is --host-resolver-rules, e.g.
	// "MAP evil.test 127.0.0.1": the name resolves to that address without
	// DNS (a DNS rebinding attacker's name after it was re-pointed).
	HostResolverRules string
}

// Start runs headless Chromium (hosttools.Require finds it; the test fails
// naming the package to install when it is missing) and returns the
// context of its first tab. The browser is stopped when t ends.
func Start(t testing.TB, opts Options) context.Context {
	t.Helper()
	path := hosttools.Require(t, "chromium")
	tab, stop, err := Launch(context.Background(), path, opts, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return tab
}

// Launch runs headless Chromium at path and returns the context of its
// first tab (at about:blank) and the function that stops the browser. It is
// Start for callers that report errors rather than failing a test; logf
// receives chromedp's log lines (nil: dropped).
func Launch(ctx context.Context, path string, opts Options, logf func(string, ...any)) (context.Context, func(), error) {
	// No sandbox: CI runs as root, where Chromium refuses its sandbox.
	flags := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true))
	if opts.HostResolverRules != "" {
		flags = append(flags, chromedp.Flag("host-resolver-rules", opts.HostResolverRules))
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, flags...)
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(logf))
	stop := func() { cancelBrowser(); cancelAlloc() }
	// The first Run starts the browser, which lives as long as the context
	// of that Run: bctx itself, not one with a deadline.
	if _, err := chromedp.Run(bctx, chromedp.Navigate("about:blank")); err != nil {
		stop()
		return nil, nil, fmt.Errorf("starting %s: %w", path, err)
	}
	return bctx, stop, nil
}

// NewTab opens another tab of the browser of ctx, closed when t ends.
// (With chromedp a tab, like the browser, lives as long as the context of
// its first Run, so later calls may put deadlines on theirs.)
func NewTab(t testing.TB, ctx context.Context) context.Context {
	t.Helper()
	tab, cancel := chromedp.NewContext(ctx)
	t.Cleanup(cancel)
	// The tab lives as long as the context of its first Run: tab itself.
	if _, err := chromedp.Run(tab, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("opening a tab: %v", err)
	}
	return tab
}

// Navigate loads url in the tab of ctx.
func Navigate(t testing.TB, ctx context.Context, url string) {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(cctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("loading %s: %v", url, err)
	}
}

// Eval runs JavaScript in the page of the tab of ctx, as the page's own
// script would (same origin and permissions), waits for the promise it
// returns and decodes the result into T.
func Eval[T any](t testing.TB, ctx context.Context, js string) T {
	t.Helper()
	v, err := Evaluate[T](ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Evaluate is Eval returning its error; it gives up after 30 seconds.
func Evaluate[T any](ctx context.Context, js string) (T, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(cctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	if err != nil {
		return v, fmt.Errorf("running script in the page: %w", err)
	}
	return v, nil
}

// ServePage serves page as HTML (never cached) to every request on ln
// until the returned server is closed.
func ServePage(ln net.Listener, page string) *http.Server {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write([]byte(page))
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return srv
}

// Port is a loopback port from portpick that Chromium agrees to load: it
// refuses its "restricted" ports (net/base/port_util.cc), some of which lie
// in portpick's range.
func Port(t testing.TB) int {
	t.Helper()
	for {
		if p := portpick.Port(t); !restricted(p) {
			return p
		}
	}
}

// Addr is "127.0.0.1:<Port>".
func Addr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(Port(t)))
}

// restricted reports whether Chromium refuses to fetch from port p (its
// restricted ports above 1023).
func restricted(p int) bool {
	switch p {
	case 1719, 1720, 1723, 2049, 3659, 4045, 4190, 5060, 5061, 6000, 6566, 6665, 6666, 6667, 6668, 6669, 6679, 6697,
		10080:
		return true
	}
	return false
}

// mustJSON encodes v for a script (values the test chose; never fails).
func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
