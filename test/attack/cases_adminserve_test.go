package attack

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/tmux"
	"github.com/nstance-dev/nstance/internal/testing/hosttools"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
)

// adminServeCases are the cases of issue 29 about nstance-admin serve: credential, Origin, Host, Content-Type (finding 2); tmux windows per shard (finding 6).
func adminServeCases() []attackCase {
	return []attackCase{
		{name: "admin serve without a credential is refused", run: adminServeNoCredential},
		{name: "admin serve refuses a cross-site text/plain scale to 0 (group size unchanged)", run: adminServeCrossSite},
		{name: "admin serve refuses a rebinding Host name", run: adminServeRebindingHost},
		{name: "admin serve token file is 0600 and printed only once", run: adminServeTokenFile},
		{name: "admin serve refuses a text/plain group PUT and non-strict JSON bodies (group unchanged)", run: adminServeStrictBodies},
		{name: "two shards' tmux windows in one session: each lists only its own and orphan collection keeps the other's", run: tmuxShardsShareSession},
		{name: "admin serve in Chromium: a cross-site page cannot scale a group, a rebinding page cannot read the API", run: adminServeChromium},
	}
}

// adminServeNoCredential: every page, data endpoint and API call without a
// token, or with a wrong one, answers 401 with a JSON error; the token
// opens them.
func adminServeNoCredential(ctx context.Context, e *env) error {
	s, err := serveWithAdminGroup(ctx, e)
	if err != nil {
		return err
	}
	defer s.stop()
	json := map[string]string{"Content-Type": "application/json"}
	calls := []struct{ method, path, body string }{
		{"GET", "/", ""},
		{"GET", "/v1/status", ""},
		{"GET", "/v1/status/events", ""},
		{"GET", "/v1/shards", ""},
		{"GET", "/v1/shards/dev-1/config", ""},
		{"GET", "/v1/shards/dev-1/groups", ""},
		{"GET", "/v1/shards/dev-1/groups/" + adminGroup, ""},
		{"POST", "/v1/shards/dev-1/groups/" + adminGroup + "/scale", `{"size":1}`},
		{"POST", "/v1/shards/dev-1/config/refresh", `{}`},
	}
	for _, cred := range []map[string]string{
		{},
		{"Authorization": "Bearer wrong-token"},
		{"Authorization": "Basic YWRtaW46YWRtaW4="},
		{"Cookie": "nstance_admin_token=wrong-token"},
	} {
		for _, c := range calls {
			hdr := map[string]string{}
			for k, v := range cred {
				hdr[k] = v
			}
			if c.body != "" {
				hdr["Content-Type"] = json["Content-Type"]
			}
			a, err := s.call(ctx, c.method, c.path, "", hdr, c.body)
			if err != nil {
				return err
			}
			if a.code != 401 || !a.jsonError() {
				return fmt.Errorf("%s %s with credential %v answered %s, want 401 with a JSON error", c.method, c.path, cred, a)
			}
		}
	}
	tok := adminToken(e)
	if tok == "" {
		return fmt.Errorf("serve wrote no token file at %s", adminTokenPath(e))
	}
	a, err := s.call(ctx, "GET", "/v1/shards", "", bearer(tok), "")
	if err != nil {
		return err
	}
	if a.code != 200 || !strings.Contains(a.body, "dev-1") {
		return fmt.Errorf("GET /v1/shards with the token answered %s, want 200 with the shards", a)
	}
	return nil
}

// adminServeCrossSite: what a page of another site can send without a
// preflight (text/plain POST with the browser's cookie and its Origin) is
// refused before the handler; the group keeps its size.
func adminServeCrossSite(ctx context.Context, e *env) error {
	s, err := serveWithAdminGroup(ctx, e)
	if err != nil {
		return err
	}
	defer s.stop()
	tok := adminToken(e)
	path := "/v1/shards/dev-1/groups/" + adminGroup + "/scale"
	for _, hdr := range []map[string]string{
		// The victim's browser carries the session cookie and names the attacker's origin.
		{"Content-Type": "text/plain;charset=UTF-8", "Origin": "http://evil.example", "Cookie": "nstance_admin_token=" + tok},
		// A form post.
		{"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://evil.example", "Cookie": "nstance_admin_token=" + tok},
		// JSON from another origin (a preflight would have been needed; a client that skips it).
		{"Content-Type": "application/json", "Origin": "http://evil.example", "Cookie": "nstance_admin_token=" + tok},
		// Origin "null" (sandboxed iframe, data: URL).
		{"Content-Type": "application/json", "Origin": "null", "Authorization": "Bearer " + tok},
	} {
		a, err := s.call(ctx, "POST", path, "", hdr, `{"size":0}`)
		if err != nil {
			return err
		}
		if a.code != 403 || !a.jsonError() {
			return fmt.Errorf("cross-site POST %s with %v answered %s, want 403 with a JSON error", path, hdr, a)
		}
	}
	// Even with the token, a text/plain body is refused (415).
	a, err := s.call(ctx, "POST", path, "", map[string]string{"Content-Type": "text/plain", "Authorization": "Bearer " + tok}, `{"size":0}`)
	if err != nil {
		return err
	}
	if a.code != 415 || !a.jsonError() {
		return fmt.Errorf("text/plain POST %s with the token answered %s, want 415 with a JSON error", path, a)
	}
	return adminGroupKept(ctx, e, "the refused posts")
}

// adminServeRebindingHost: a request whose Host is not serve's own (a
// rebound DNS name) is refused even with the token; localhost:port and
// 127.0.0.1:port work, and --allowed-host adds a name.
func adminServeRebindingHost(ctx context.Context, e *env) error {
	s, err := startAdminServe(ctx, e, "")
	if err != nil {
		return err
	}
	tok := adminToken(e)
	_, port, _ := net.SplitHostPort(s.addr)
	for _, host := range []string{"evil.test:" + port, "evil.test", "admin.internal:" + port, "127.0.0.1.evil.test:" + port} {
		for _, path := range []string{"/", "/v1/status", "/v1/shards"} {
			a, err := s.call(ctx, "GET", path, host, bearer(tok), "")
			if err != nil {
				s.stop()
				return err
			}
			if (a.code != 421 && a.code != 403) || !a.jsonError() {
				s.stop()
				return fmt.Errorf("GET %s with Host %s answered %s, want 421 or 403 with a JSON error", path, host, a)
			}
		}
	}
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port} {
		a, err := s.call(ctx, "GET", "/v1/shards", host, bearer(tok), "")
		if err != nil {
			s.stop()
			return err
		}
		if a.code != 200 {
			s.stop()
			return fmt.Errorf("GET /v1/shards with Host %s answered %s, want 200", host, a)
		}
	}
	s.stop()
	s, err = startAdminServe(ctx, e, "", "--allowed-host", "admin.internal")
	if err != nil {
		return err
	}
	defer s.stop()
	_, port, _ = net.SplitHostPort(s.addr)
	a, err := s.call(ctx, "GET", "/v1/shards", "admin.internal:"+port, bearer(tok), "")
	if err != nil {
		return err
	}
	if a.code != 200 {
		return fmt.Errorf("GET /v1/shards with Host admin.internal:%s under --allowed-host admin.internal answered %s, want 200", port, a)
	}
	a, err = s.call(ctx, "GET", "/v1/shards", "evil.test:"+port, bearer(tok), "")
	if err != nil {
		return err
	}
	if a.code != 421 && a.code != 403 {
		return fmt.Errorf("GET /v1/shards with Host evil.test:%s under --allowed-host admin.internal answered %s, want 421 or 403", port, a)
	}
	return nil
}

// adminServeTokenFile: the first start writes a 0600 token file and prints
// the token once with the page's URL; the next start prints no token; a
// token file others can read is refused and left as it is.
func adminServeTokenFile(ctx context.Context, e *env) error {
	_ = os.Remove(adminTokenPath(e))
	s, err := startAdminServe(ctx, e, "")
	if err != nil {
		return err
	}
	tok := adminToken(e)
	if tok == "" {
		s.stop()
		return fmt.Errorf("serve wrote no token file at %s", adminTokenPath(e))
	}
	if len(tok) < 32 {
		s.stop()
		return fmt.Errorf("token %q is shorter than 32 characters", tok)
	}
	mode, err := fileMode(adminTokenPath(e))
	if err != nil {
		s.stop()
		return err
	}
	if mode != 0o600 {
		s.stop()
		return fmt.Errorf("token file mode %o, want 600", mode)
	}
	if err := proctest.Wait(ctx, "serve printing the status page URL with the token", 10*time.Second, func() bool {
		return strings.Contains(s.output(), "http://"+s.addr+"/?token="+tok)
	}); err != nil {
		s.stop()
		return fmt.Errorf("%w; output: %s", err, s.output())
	}
	if n := strings.Count(s.output(), tok); n != 1 {
		s.stop()
		return fmt.Errorf("the token is printed %d times on the first start, want once", n)
	}
	s.stop()
	s, err = startAdminServe(ctx, e, "")
	if err != nil {
		return err
	}
	// The second start logs its URL (without the token) once it serves.
	if err := proctest.Wait(ctx, "serve logging its URL", 10*time.Second, func() bool { return strings.Contains(s.output(), s.addr) }); err != nil {
		s.stop()
		return fmt.Errorf("%w; output: %s", err, s.output())
	}
	if strings.Contains(s.output(), tok) {
		s.stop()
		return fmt.Errorf("the second start printed the token again: %s", s.output())
	}
	if adminToken(e) != tok {
		s.stop()
		return fmt.Errorf("the second start replaced the token")
	}
	s.stop()
	for _, m := range []os.FileMode{0o640, 0o604, 0o644} {
		if err := os.Chmod(adminTokenPath(e), m); err != nil {
			return err
		}
		s, err = startAdminServe(ctx, e, "")
		if err == nil {
			select {
			case <-s.proc.Done:
			case <-time.After(10 * time.Second):
			}
			if !s.proc.Exited() {
				s.stop()
				return fmt.Errorf("serve runs with a token file of mode %o", m)
			}
			err = fmt.Errorf("exited: %s", s.output())
		}
		if !strings.Contains(err.Error(), adminTokenPath(e)) {
			return fmt.Errorf("serve with a token file of mode %o: the error does not name the file: %v", m, err)
		}
		if adminToken(e) != tok {
			return fmt.Errorf("serve changed a token file of mode %o", m)
		}
	}
	return os.Chmod(adminTokenPath(e), 0o600)
}

// adminServeStrictBodies: a group PUT with a text/plain body, and bodies
// with unknown fields, over the size limit or of the wrong JSON type, are
// refused with a JSON error; the group keeps its size.
func adminServeStrictBodies(ctx context.Context, e *env) error {
	s, err := serveWithAdminGroup(ctx, e)
	if err != nil {
		return err
	}
	defer s.stop()
	tok := adminToken(e)
	hdr := func(ct string) map[string]string {
		h := bearer(tok)
		h["Content-Type"] = ct
		return h
	}
	group := "/v1/shards/dev-1/groups/" + adminGroup
	for _, c := range []struct {
		method, path, ct, body string
		want                   []int
	}{
		{"PUT", group, "text/plain", `{"template":"svc","size":0}`, []int{415}},
		{"PUT", group, "", `{"template":"svc","size":0}`, []int{415}},
		{"PUT", group, "application/json", `{"template":"svc","size":0,"evil":1}`, []int{400}},
		{"POST", group + "/scale", "application/json", `{"size":0,"evil":1}`, []int{400}},
		{"POST", group + "/scale", "application/json", `{"size":"0"}`, []int{400}},
		{"POST", group + "/scale", "application/json", `{"size":0} {"size":5}`, []int{400}},
		{"POST", group + "/scale", "application/json", `{"size":0,` + strings.Repeat(" ", 2<<20) + `}`, []int{413}},
	} {
		a, err := s.call(ctx, c.method, c.path, "", hdr(c.ct), c.body)
		if err != nil {
			return err
		}
		ok := false
		for _, w := range c.want {
			ok = ok || a.code == w
		}
		body := c.body
		if len(body) > 60 {
			body = body[:60] + "..."
		}
		if !ok || !a.jsonError() {
			return fmt.Errorf("%s %s (Content-Type %q, body %q) answered %s, want %v with a JSON error", c.method, c.path, c.ct, body, a, c.want)
		}
	}
	return adminGroupKept(ctx, e, "the refused bodies")
}

// tmuxShardsShareSession: providers of dev-1 and dev-2 built the way the
// servers build them share one tmux session on a private tmux server; each
// lists only its own window, orphan collection (delete what is listed and
// has no record) run by each keeps the other's window, and a window without
// a shard marker (made by an older version) is listed by neither.
func tmuxShardsShareSession(ctx context.Context, e *env) error {
	if _, err := exec.LookPath("tmux"); err != nil {
		return fmt.Errorf("tmux is required: %s", hosttools.Hint("tmux"))
	}
	socket := fmt.Sprintf("nstance-attack-%d-%d", os.Getpid(), time.Now().UnixNano())
	run := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, "tmux", append([]string{"-L", socket}, args...)...).CombinedOutput()
		return string(out), err
	}
	defer func() {
		_, _ = run("kill-server")
		_ = os.Remove(tmux.SocketPath(socket))
	}()
	const session = "agents-attack"
	build := func(shard string) (provider.Provider, error) {
		cfg := &config.Config{}
		cfg.Cluster.ID, cfg.Shard.ID = clusterID, shard
		kc := tmux.Kind().Config()
		return kc.New(ctx, provider.Env{Config: func() *config.Config { return cfg }, Local: provider.Local{
			Command: "sleep 3600", Session: session, Socket: socket,
			StateDir: filepath.Join(e.s.dir, "tmux-"+shard), NodeDir: "-",
		}})
	}
	p1, err := build("dev-1")
	if err != nil {
		return err
	}
	p2, err := build("dev-2")
	if err != nil {
		return err
	}
	own := map[string]struct {
		p  provider.Provider
		id string
	}{"dev-1": {p1, "work-1111aaaa"}, "dev-2": {p2, "work-2222bbbb"}}
	for shard, o := range own {
		if _, err := o.p.Create(ctx, provider.CreateRequest{InstanceID: o.id, ProviderID: provider.ID(clusterID, shard, o.id), Shard: shard, AgentNonce: "n"}); err != nil {
			return fmt.Errorf("%s creating %s: %w", shard, o.id, err)
		}
	}
	// A window of an older version: no shard marker.
	if out, err := run("new-window", "-d", "-t", "="+session+":", "-n", tmux.WindowName("legacy-0000cccc"), "sleep 3600"); err != nil {
		return fmt.Errorf("creating a legacy window: %v: %s", err, out)
	}
	windows := func() (string, error) { return run("list-windows", "-t", "="+session, "-F", "#{window_name}") }
	for shard, o := range own {
		list, err := o.p.List(ctx)
		if err != nil {
			return fmt.Errorf("%s listing: %w", shard, err)
		}
		var ids []string
		for _, in := range list {
			ids = append(ids, in.InstanceID)
		}
		if len(ids) != 1 || ids[0] != o.id {
			return fmt.Errorf("%s lists %v, want only its own %s", shard, ids, o.id)
		}
		// Orphan collection: whatever is listed and has no record of this
		// shard (its records: its own instance only) is deleted.
		for _, in := range list {
			if in.InstanceID != o.id {
				if err := o.p.Delete(ctx, in.InstanceID); err != nil {
					return fmt.Errorf("%s deleting orphan %s: %w", shard, in.InstanceID, err)
				}
			}
		}
	}
	// Orphan collection with no records at all on dev-1 (a fresh shard):
	// it may delete its own window only.
	list, err := p1.List(ctx)
	if err != nil {
		return err
	}
	for _, in := range list {
		if err := p1.Delete(ctx, in.InstanceID); err != nil {
			return err
		}
	}
	ws, err := windows()
	if err != nil {
		return fmt.Errorf("listing windows: %v: %s", err, ws)
	}
	for _, name := range []string{tmux.WindowName("work-2222bbbb"), tmux.WindowName("legacy-0000cccc")} {
		if !strings.Contains(ws, name) {
			return fmt.Errorf("window %s is gone after dev-1's orphan collection; windows: %q", name, ws)
		}
	}
	if strings.Contains(ws, tmux.WindowName("work-1111aaaa")) {
		return fmt.Errorf("dev-1 could not delete its own window; windows: %q", ws)
	}
	// Neither shard can delete the other's window by asking for it by id.
	if err := p1.Delete(ctx, "work-2222bbbb"); err != nil {
		return fmt.Errorf("dev-1 deleting dev-2's id: %w", err)
	}
	if ws, _ := windows(); !strings.Contains(ws, tmux.WindowName("work-2222bbbb")) {
		return fmt.Errorf("dev-1's Delete of dev-2's instance id killed dev-2's window")
	}
	if _, err := p1.Status(ctx, "work-2222bbbb"); err == nil {
		return fmt.Errorf("dev-1's Status finds dev-2's window")
	}
	return nil
}
