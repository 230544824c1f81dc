// Package browser holds tests that drive headless Chromium, as a web page
// the developer opens would, against the development tools (dev-s3,
// dev-k8s), and Start and Eval, the helpers that run Chromium for them (and
// for other tests that need a real browser).
package browser

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/nstance-dev/nstance/internal/testing/hosttools"
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
	// No sandbox: CI runs as root, where Chromium refuses its sandbox.
	flags := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true))
	if opts.HostResolverRules != "" {
		flags = append(flags, chromedp.Flag("host-resolver-rules", opts.HostResolverRules))
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), flags...)
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() { cancelBrowser(); cancelAlloc() })
	// The first Run starts the browser, which lives as long as the context
	// of that Run: bctx itself, not one with a deadline.
	if _, err := chromedp.Run(bctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("starting %s: %v", path, err)
	}
	return bctx
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
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(cctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("running script in the page: %v", err)
	}
	return v
}

// mustJSON encodes v for a script (values the test chose; never fails).
func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
