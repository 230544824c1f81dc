package attack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strings"

	"github.com/chromedp/chromedp"

	"github.com/nstance-dev/nstance/internal/testing/hosttools"
	"github.com/nstance-dev/nstance/test/browser"
)

// evilHost is the attacker's name; Chromium resolves it to 127.0.0.1
// (--host-resolver-rules), as a rebinding DNS server would.
const evilHost = "evil.test"

// rebindPage is served at http://evil.test:P/ before serve takes port P:
// probe(path) fetches path from the page's own origin and reports the
// status and body.
const rebindPage = `<!doctype html><title>rebind</title><script>
window.probe = async (path) => {
  try {
    const r = await fetch(path, {cache: "no-store"});
    return r.status + " " + (await r.text());
  } catch (e) { return "error " + e; }
};
</script>`

// csrfPage is served at http://evil.test:Q/: it posts {"size":0} as
// text/plain (no preflight) with the victim's cookies to the target, and
// tries to read the shard list with CORS.
const csrfPage = `<!doctype html><title>csrf</title><script>
window.attack = async (target) => {
  const out = {};
  try {
    await fetch(target + "/v1/shards/dev-1/groups/%s/scale", {method: "POST", mode: "no-cors", credentials: "include",
      headers: {"Content-Type": "text/plain"}, body: '{"size":0}'});
    out.post = "sent";
  } catch (e) { out.post = "error " + e; }
  try {
    const r = await fetch(target + "/v1/shards", {credentials: "include"});
    out.read = r.status + " " + (await r.text());
  } catch (e) { out.read = "error " + e; }
  return JSON.stringify(out);
};
</script>`

// adminServeChromium: headless Chromium, with evil.test mapped to
// 127.0.0.1. The victim has opened the status page with its token URL
// (cookie set). (1) A page of http://evil.test:Q posts a text/plain
// {"size":0} to serve's scale endpoint: the group keeps its size, read over
// gRPC (serve without a token scaled it to 0). The browser does not send
// the SameSite=Strict cookie cross-site, so here the token check refuses
// it; the Origin and Content-Type checks behind it are exercised by the
// plain-HTTP cases of cases_adminserve_test.go. That the page cannot read
// the answer follows from serve sending no CORS headers (true before the
// fix too). (2) DNS rebinding: a page loaded from http://evil.test:P, after
// its server stopped and serve took port P, fetches its "own" origin:
// serve sees Host evil.test:P and refuses (421).
func adminServeChromium(ctx context.Context, e *env) error {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		return fmt.Errorf("chromium is required: %s", hosttools.Hint("chromium"))
	}
	if err := resetAdminGroup(ctx, e); err != nil {
		return err
	}
	// The attacker's two servers; P is later serve's port.
	rebindAddr, csrfAddr := browser.Addr(e.s.t), browser.Addr(e.s.t)
	_, rebindPort, _ := net.SplitHostPort(rebindAddr)
	_, csrfPort, _ := net.SplitHostPort(csrfAddr)
	rebindLn, err := net.Listen("tcp", rebindAddr)
	if err != nil {
		return err
	}
	rebindSrv := browser.ServePage(rebindLn, rebindPage)
	defer rebindSrv.Close()
	csrfLn, err := net.Listen("tcp", csrfAddr)
	if err != nil {
		return err
	}
	csrfSrv := browser.ServePage(csrfLn, fmt.Sprintf(csrfPage, adminGroup))
	defer csrfSrv.Close()

	rebindTab, stopBrowser, err := browser.Launch(ctx, chromium, browser.Options{HostResolverRules: "MAP " + evilHost + " 127.0.0.1"}, nil)
	if err != nil {
		return err
	}
	defer stopBrowser()
	if _, err := chromedp.Run(rebindTab, chromedp.Navigate("http://"+evilHost+":"+rebindPort+"/")); err != nil {
		return fmt.Errorf("loading the rebinding page in %s: %w", chromium, err)
	}
	probe := func(tab context.Context, expr string) (string, error) { return browser.Evaluate[string](tab, expr) }
	// The attacker's server answers the page's own origin until it stops.
	if got, err := probe(rebindTab, `probe("/")`); err != nil || !strings.Contains(got, "rebind") {
		return fmt.Errorf("the rebinding page cannot fetch its own server: %q %v", got, err)
	}
	// Its server goes; serve takes the port.
	if err := rebindSrv.Close(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	s, err := startAdminServe(ctx, e, rebindAddr)
	if err != nil {
		return err
	}
	defer s.stop()
	tok := adminToken(e)

	// The victim opens the status page with its token URL.
	victim, cancelVictim := chromedp.NewContext(rebindTab)
	defer cancelVictim()
	open := "http://" + rebindAddr + "/"
	if tok != "" {
		open += "?token=" + tok
	}
	if _, err := chromedp.Run(victim, chromedp.Navigate(open)); err != nil {
		return fmt.Errorf("the victim opening %s: %w", "http://"+rebindAddr+"/?token=...", err)
	}
	if _, err := chromedp.Run(victim, chromedp.WaitVisible(chromedp.CSS(`#conn[data-state="live"]`))); err != nil {
		return fmt.Errorf("the status page never went live for the victim: %w", err)
	}
	// (1) Cross-site: the victim visits the attacker's page.
	if _, err := chromedp.Run(victim, chromedp.Navigate("http://"+evilHost+":"+csrfPort+"/")); err != nil {
		return fmt.Errorf("loading the cross-site page: %w", err)
	}
	got, err := probe(victim, `attack("http://`+rebindAddr+`")`)
	if err != nil {
		return fmt.Errorf("running the cross-site page: %w", err)
	}
	if !strings.Contains(got, `"post":"sent"`) {
		return fmt.Errorf("the cross-site page could not send its post: %s", got)
	}
	if strings.Contains(got, "dev-1") {
		return fmt.Errorf("the cross-site page read the API: %s", got)
	}
	if err := adminGroupKept(ctx, e, "the cross-site page ran (page: "+got+")"); err != nil {
		return err
	}
	// (2) Rebinding: the old page fetches its "own" origin, now serve.
	for _, path := range []string{"/v1/shards", "/v1/status", "/"} {
		got, err := probe(rebindTab, `probe("`+path+`")`)
		if err != nil {
			return fmt.Errorf("probing %s from the rebinding page: %w", path, err)
		}
		if !strings.HasPrefix(got, "421 ") && !strings.HasPrefix(got, "403 ") {
			if len(got) > 200 {
				got = got[:200] + "..."
			}
			return fmt.Errorf("the rebinding page (Host %s:%s) fetched %s: %s", evilHost, rebindPort, path, got)
		}
	}
	return nil
}
