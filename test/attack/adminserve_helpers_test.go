package attack

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/testing/portpick"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// adminGroup is tenant A's group the admin serve cases try to scale; it
// keeps size 1 unless an attack gets through.
const adminGroup = "adm"

// adminDir is where the admin serve cases keep nstance-admin's files: the
// context file (admin.yaml), tenant A's admin certificate and key, the CA,
// and the serve token nstance-admin puts next to the context file.
func adminDir(e *env) string { return filepath.Join(e.s.dir, "admin") }

// adminTokenPath is the default token file of `nstance-admin serve` for the
// context file in adminDir.
func adminTokenPath(e *env) string { return filepath.Join(adminDir(e), "serve.token") }

// writeAdminFiles writes tenant A's admin certificate, its key and the
// cluster CA, and a context file naming both shards' Operator endpoints.
func writeAdminFiles(ctx context.Context, e *env) error {
	dir := adminDir(e)
	if _, err := os.Stat(filepath.Join(dir, "admin.yaml")); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	caPEM, err := e.s.get(ctx, e.s.keys.CACert())
	if err != nil {
		return fmt.Errorf("reading the cluster CA: %w", err)
	}
	var certPEM []byte
	for _, der := range e.adminA.Certificate {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(e.adminA.PrivateKey)
	if err != nil {
		return err
	}
	file := map[string]any{
		"current-context": "attack",
		"contexts": []map[string]any{{
			"name":    "attack",
			"servers": map[string]string{e.dev1.shard: e.dev1.operator, e.dev2.shard: e.dev2.operator},
			"ca-cert": "ca.crt", "cert": "admin.crt", "key": "admin.key",
		}},
	}
	ctxFile, err := json.Marshal(file) // JSON is YAML
	if err != nil {
		return err
	}
	for name, b := range map[string][]byte{"ca.crt": caPEM, "admin.crt": certPEM, "admin.key": keyPEM, "admin.yaml": ctxFile} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// adminServe is one running `nstance-admin serve`.
type adminServe struct {
	addr string
	proc *proc
}

// startAdminServe runs `nstance-admin serve` on addr (a free loopback port
// when empty) with the context file of adminDir and waits until it accepts
// connections. The caller stops it (stop).
func startAdminServe(ctx context.Context, e *env, addr string, args ...string) (*adminServe, error) {
	if err := writeAdminFiles(ctx, e); err != nil {
		return nil, err
	}
	// Built on the first case that needs it, beside the stack's binaries.
	if _, err := bins.Build("nstance-admin"); err != nil {
		return nil, err
	}
	if addr == "" {
		addr = portpick.Addr(e.s.t)
	}
	name := fmt.Sprintf("admin-serve-%d", time.Now().UnixNano())
	all := append([]string{"serve", "--admin-config", filepath.Join(adminDir(e), "admin.yaml"), "--listen", addr}, args...)
	p, err := e.s.procs.Start(name, "nstance-admin", nil, all...)
	if err != nil {
		return nil, err
	}
	s := &adminServe{addr: addr, proc: p}
	if err := p.WaitFor(ctx, "nstance-admin serve listening on "+addr, 30*time.Second, func() bool { return proctest.Dialable(addr) }); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// stop ends the serve process by its PID (process group).
func (s *adminServe) stop() { s.proc.Stop(stopGrace) }

// output is what serve has printed so far.
func (s *adminServe) output() string {
	b, _ := os.ReadFile(s.proc.Log)
	return string(b)
}

// adminToken is the serve token from its file; "" when there is none (the
// old serve had no credential at all).
func adminToken(e *env) string {
	b, err := os.ReadFile(adminTokenPath(e))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// httpAnswer is one answer of serve: the status, Content-Type and at most
// 64 KiB of the body.
type httpAnswer struct {
	code        int
	contentType string
	body        string
}

func (a httpAnswer) String() string {
	b := a.body
	if len(b) > 200 {
		b = b[:200] + "..."
	}
	return fmt.Sprintf("%d %s %q", a.code, a.contentType, b)
}

// jsonError reports whether the answer is a JSON {"error": "..."}.
func (a httpAnswer) jsonError() bool {
	var v struct {
		Error string `json:"error"`
	}
	return strings.HasPrefix(a.contentType, "application/json") && json.Unmarshal([]byte(a.body), &v) == nil && v.Error != ""
}

// call sends one request to serve; host, when set, replaces the Host header.
// A streaming answer (the event stream) is read only for its headers.
func (s *adminServe) call(ctx context.Context, method, path, host string, hdr map[string]string, body string) (httpAnswer, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(cctx, method, "http://"+s.addr+path, rd)
	if err != nil {
		return httpAnswer{}, err
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	c := http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		return httpAnswer{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	a := httpAnswer{code: resp.StatusCode, contentType: resp.Header.Get("Content-Type")}
	if strings.HasPrefix(a.contentType, "text/event-stream") {
		return a, nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return a, fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	a.body = string(b)
	return a, nil
}

// bearer is the Authorization header of the token ("" sends none).
func bearer(token string) map[string]string {
	if token == "" {
		return map[string]string{}
	}
	return map[string]string{"Authorization": "Bearer " + token}
}

// adminGroupKept is nil when tenant A's group adminGroup still has the
// size 1 resetAdminGroup gave it (read over gRPC from dev-1), else an error
// naming what came before: after.
func adminGroupKept(ctx context.Context, e *env, after string) error {
	a := nstancev1.NewOperatorServiceClient(e.connA)
	list, err := a.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
	if err != nil {
		return fmt.Errorf("listing tenant A's groups: %w", err)
	}
	for _, g := range list.GetGroups() {
		if g.GetSpec().GetGroupId() != adminGroup {
			continue
		}
		if size := g.GetSpec().GetSize(); size != 1 {
			return fmt.Errorf("group %s has size %d after %s, want 1", adminGroup, size, after)
		}
		return nil
	}
	return fmt.Errorf("tenant A has no group %s after %s", adminGroup, after)
}

// serveWithAdminGroup resets adminGroup to size 1 and starts serve on a
// port of its own; the caller stops it.
func serveWithAdminGroup(ctx context.Context, e *env) (*adminServe, error) {
	if err := resetAdminGroup(ctx, e); err != nil {
		return nil, err
	}
	return startAdminServe(ctx, e, "")
}

// resetAdminGroup upserts adminGroup with size 1 (template svc).
func resetAdminGroup(ctx context.Context, e *env) error {
	a := nstancev1.NewOperatorServiceClient(e.connA)
	if _, err := a.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: adminGroup, Template: "svc", Size: 1}}); err != nil {
		return fmt.Errorf("tenant A creating group %s: %w", adminGroup, err)
	}
	return nil
}

// fileMode is the permission bits of path.
func fileMode(path string) (fs.FileMode, error) {
	st, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return st.Mode().Perm(), nil
}
