package e2e

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/testing/hosttools"
	"github.com/nstance-dev/nstance/internal/testing/portpick"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
)

// pageState is what the status page's DOM shows, read in the browser.
type pageState struct {
	Conn      string      `json:"conn"`
	Marker    string      `json:"marker"`
	Shards    []string    `json:"shards"`
	Leaders   []string    `json:"leaders"`
	Groups    []pageGroup `json:"groups"`
	Running   int         `json:"running"`
	Versions  []string    `json:"versions"`
	Overflows bool        `json:"overflows"`
}

type pageGroup struct {
	Key     string `json:"key"`
	Desired string `json:"desired"`
	Ready   string `json:"ready"`
}

const readPage = `(() => {
  const txt = (r, f) => (r.querySelector('[data-field="' + f + '"]') || {}).textContent || "";
  return {
    conn: document.getElementById("conn").dataset.state,
    marker: String(window.__loadMarker || ""),
    shards: [...document.querySelectorAll("section[data-shard]")].map(e => e.dataset.shard),
    leaders: [...document.querySelectorAll("section[data-shard] b[data-field=leader]")].map(e => e.textContent),
    groups: [...document.querySelectorAll("tr[data-group]")].map(r => ({key: r.dataset.group, desired: txt(r, "desired"), ready: txt(r, "ready")})),
    running: document.querySelectorAll('tr[data-instance][data-state="running"]').length,
    versions: [...document.querySelectorAll('tr[data-instance] td[data-field="agent"]')].map(e => e.textContent),
    overflows: document.documentElement.scrollWidth > window.innerWidth + 1,
  };
})()`

// TestStatusPageInBrowser: headless Chromium (at a phone's width) opens the
// status page of a running stack through the token URL serve prints; a pool written as JSON files shows up as
// one group per shard, and editing the MachinePool file to 4 replicas moves
// the page to 2 desired and 2 ready per shard without a reload (the page's
// load marker survives). A screenshot is saved under temp/.
func TestStatusPageInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test; skipped with -short")
	}
	browser := hosttools.Require(t, "chromium")
	s := newStack(t)
	s.up()

	// Every shard leader serves (up() waits for one registration only).
	for _, sp := range s.servers {
		proctest.Eventually(s.t, sp.shard+" serves gRPC", time.Minute, func() bool { return proctest.Dialable(sp.registration, sp.operator) })
	}
	// An admin identity for the page, registered the way the dev stack does it.
	creds := filepath.Join(s.dir, "status")
	reg := exec.Command(filepath.Join(s.bin, "nstance-admin"), "cluster", "register-operator", "--cluster-id", clusterID,
		"--storage-bucket", bucket, "--key-provider", "env", "--role", "admin", "--operator-id", "nstance-status",
		"--registration-addr", s.servers[0].registration, "--out-dir", creds)
	reg.Env = s.env()
	out, err := reg.CombinedOutput()
	require.NoError(t, err, "nstance-admin cluster register-operator: %s", out)
	var servers []string
	for _, sp := range s.servers {
		servers = append(servers, sp.shard+"="+sp.operator)
	}
	addr := portpick.Addr(t)
	tokenFile := filepath.Join(creds, "serve.token")
	s.procs.MustStart("status", "nstance-admin", nil, "serve", "--listen", addr, "--servers", strings.Join(servers, ","),
		"--ca-cert", filepath.Join(creds, "ca.crt"), "--cert", filepath.Join(creds, "operator.crt"), "--key", filepath.Join(creds, "operator.key"),
		"--token-file", tokenFile)
	// serve creates its token on the first start; every request carries it.
	var token string
	proctest.Eventually(s.t, "status page answers with its token", 30*time.Second, func() bool {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return false
		}
		token = strings.TrimSpace(string(b))
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/status", nil)
		if err != nil {
			return false
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	// No sandbox: CI runs as root, where Chromium refuses its sandbox.
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.WindowSize(412, 915), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer cancelBrowser()
	// The URL serve prints: it sets the page's cookie and redirects to /.
	_, err = chromedp.Run(bctx, chromedp.Navigate("http://"+addr+"/?token="+token))
	require.NoError(t, err, "loading the status page in %s", browser)
	_, err = chromedp.Run(bctx, chromedp.WaitVisible(chromedp.CSS(`#conn[data-state="live"]`)))
	require.NoError(t, err, "the page never went live")
	_, err = chromedp.Run(bctx, chromedp.Evaluate[string](`window.__loadMarker = "first-load"`))
	require.NoError(t, err)

	var st pageState
	read := func() pageState {
		ctx, cancel := context.WithTimeout(bctx, 5*time.Second)
		defer cancel()
		got, err := chromedp.Run(ctx, chromedp.Evaluate[pageState](readPage))
		require.NoError(t, err, "reading the page's DOM")
		return got
	}
	st = read()
	require.ElementsMatch(t, []string{"dev-1", "dev-2"}, st.Shards)
	for i, l := range st.Leaders {
		require.NotEqual(t, "unknown", l, "shard %s shows no leader", st.Shards[i])
	}

	// The example pool: 2 replicas over dev-1 and dev-2.
	const pool = "nstance-test"
	s.put(resNstancePools, pool, s.example("nstancemachinepool.json"))
	s.put(resPools, pool, s.example("machinepool.json"))
	// perShard: the page shows the pool's group on both shards with this
	// desired size and, unless ready is "", this ready count.
	perShard := func(desired, ready string) func() bool {
		return func() bool {
			st = read()
			n := 0
			for _, g := range st.Groups {
				if strings.Contains(g.Key, pool) && g.Desired == desired && (ready == "" || g.Ready == ready) {
					n++
				}
			}
			return n == 2
		}
	}
	proctest.Eventually(s.t, "page: the pool's group on each shard, 1 desired and 1 ready", 3*time.Minute, perShard("1", "1"))

	mp, ok := s.get(resPools, namespace, pool)
	require.True(t, ok)
	mp["spec"].(map[string]any)["replicas"] = 4
	s.put(resPools, pool, mp)
	proctest.Eventually(s.t, "page: 2 desired per shard after the edit", time.Minute, perShard("2", ""))
	proctest.Eventually(s.t, "page: 2 ready per shard and 4 running instances", 3*time.Minute, func() bool {
		return perShard("2", "2")() && st.Running == 4
	})
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	shot := filepath.Join(s.root, "temp", "e2e", "status-page.png")
	require.NoError(t, os.MkdirAll(filepath.Dir(shot), 0o755))
	require.NoError(t, os.WriteFile(shot, png, 0o644))
	t.Logf("status page screenshot: %s (%d bytes)", shot, len(png))

	require.Equal(t, "first-load", st.Marker, "the page was reloaded instead of updated in place")
	require.Equal(t, "live", st.Conn)
	require.Len(t, st.Versions, 4)
	for _, v := range st.Versions {
		require.NotEqual(t, "—", v, "every instance row shows the agent version its reports carry")
	}
	require.False(t, st.Overflows, "the page is wider than a phone's screen (see the screenshot)")
}
