package proxmox_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/proxmox"
	"github.com/nstance-dev/nstance/internal/server/provider/proxmox/fake"
)

// The wire tests run the provider on the real client (go-proxmox with API
// token authentication, over TLS with the configured CA) against an
// httptest server that speaks the Proxmox VE API as its API viewer
// documents it — JSON answers in a "data" key, JSON request bodies, query
// parameters on DELETE, a multipart upload, errors in the status line —
// and keeps its state in the stateful fake. Every request is checked
// (token header, parameter names and types); the set of paths seen must
// equal proxmox.Calls, whose privileges deploy/proxmox grants.

const (
	wireTokenID = "nstance@pve!server"
	wireSecret  = "0b7c4a8e-4f31-4c55-9d0e-2a1f6b3c9d10"
)

type route struct {
	method, path string
	re           *regexp.Regexp
	serve        func(t *testing.T, r *http.Request, m []string) (any, error)
}

type pveServer struct {
	t      *testing.T
	f      *fake.Fake
	routes []route
	mu     sync.Mutex
	seen   map[string]bool
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

// jsonBody decodes a request body into a map, failing on anything else.
func jsonBody(t *testing.T, r *http.Request) map[string]any {
	var m map[string]any
	if r.Body == nil {
		return m
	}
	b, _ := io.ReadAll(r.Body)
	if len(b) == 0 {
		return m
	}
	assert.Equal(t, "application/json", r.Header.Get("Content-Type"))
	assert.NoError(t, json.Unmarshal(b, &m), "body %s", b)
	return m
}

func str(t *testing.T, m map[string]any, k string) string {
	v, ok := m[k]
	if !ok {
		return ""
	}
	s, ok := v.(string)
	assert.True(t, ok, "%s: want a string, got %T", k, v)
	return s
}

func newPVEServer(t *testing.T, f *fake.Fake) *pveServer {
	s := &pveServer{t: t, f: f, seen: map[string]bool{}}
	add := func(method, path string, serve func(t *testing.T, r *http.Request, m []string) (any, error)) {
		re := "^/api2/json" + regexp.MustCompile(`\{[a-z]+\}`).ReplaceAllStringFunc(path, func(p string) string {
			if p == "{volume}" {
				return "(.+)"
			}
			return "([^/]+)"
		}) + "$"
		s.routes = append(s.routes, route{method: method, path: path, re: regexp.MustCompile(re), serve: serve})
	}
	ctx := context.Background()
	add("GET", "/cluster/resources", func(t *testing.T, r *http.Request, _ []string) (any, error) {
		assert.Equal(t, "vm", r.URL.Query().Get("type"))
		vms, err := f.Resources(ctx)
		out := []map[string]any{}
		for _, v := range vms {
			tmpl := 0
			if v.Template {
				tmpl = 1
			}
			row := map[string]any{"id": fmt.Sprintf("qemu/%d", v.VMID), "type": "qemu", "vmid": v.VMID, "node": v.Node, "name": v.Name,
				"status": v.Status, "template": tmpl, "maxmem": v.MaxMem, "maxcpu": 2, "uptime": 0}
			if len(v.Tags) > 0 {
				row["tags"] = strings.Join(v.Tags, ";")
			}
			out = append(out, row)
		}
		return out, err
	})
	add("GET", "/nodes", func(*testing.T, *http.Request, []string) (any, error) {
		ns, err := f.Nodes(ctx)
		out := []map[string]any{}
		for _, n := range ns {
			st := "offline"
			if n.Online {
				st = "online"
			}
			out = append(out, map[string]any{"node": n.Name, "id": "node/" + n.Name, "type": "node", "status": st,
				"maxmem": n.MaxMem, "mem": n.Mem, "maxcpu": 16, "level": ""})
		}
		return out, err
	})
	add("GET", "/cluster/nextid", func(*testing.T, *http.Request, []string) (any, error) {
		id, err := f.NextID(ctx)
		return strconv.Itoa(id), err // Proxmox answers a string
	})
	add("GET", "/nodes/{node}/qemu/{vmid}/config", func(_ *testing.T, _ *http.Request, m []string) (any, error) {
		c, err := f.Config(ctx, m[1], atoi(m[2]))
		if err != nil {
			return nil, err
		}
		out := map[string]any{"name": c.Name, "digest": "3f1c0a"}
		if c.Description != "" {
			out["description"] = c.Description
		}
		if len(c.Tags) > 0 {
			out["tags"] = strings.Join(c.Tags, ";")
		}
		for k, v := range c.Options {
			if n, err := strconv.Atoi(v); err == nil && k == "cores" {
				out[k] = n // numbers come as numbers
			} else {
				out[k] = v
			}
		}
		return out, nil
	})
	add("POST", "/nodes/{node}/qemu/{vmid}/clone", func(t *testing.T, r *http.Request, m []string) (any, error) {
		b := jsonBody(t, r)
		for k := range b {
			assert.Contains(t, []string{"newid", "name", "description", "target", "full", "storage", "pool", "format", "snapname", "bwlimit"}, k, "clone parameter")
		}
		newid, ok := b["newid"].(float64)
		assert.True(t, ok, "newid: want an integer, got %T", b["newid"])
		full := false
		switch v := b["full"].(type) {
		case bool:
			full = v
		case float64:
			full = v == 1
		case nil:
		default:
			t.Errorf("full: want a boolean, got %T", v)
		}
		return f.Clone(ctx, m[1], atoi(m[2]), proxmox.CloneOptions{NewID: int(newid), Name: str(t, b, "name"), Description: str(t, b, "description"),
			Target: str(t, b, "target"), Full: full, Storage: str(t, b, "storage"), Pool: str(t, b, "pool")})
	})
	add("POST", "/nodes/{node}/qemu/{vmid}/config", func(t *testing.T, r *http.Request, m []string) (any, error) {
		b := jsonBody(t, r)
		keys := make([]string, 0, len(b))
		for k := range b {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var opts []proxmox.ConfigOption
		for _, k := range keys {
			opts = append(opts, proxmox.ConfigOption{Name: k, Value: str(t, b, k)})
		}
		return f.SetConfig(ctx, m[1], atoi(m[2]), opts...)
	})
	add("POST", "/nodes/{node}/qemu/{vmid}/status/start", func(_ *testing.T, _ *http.Request, m []string) (any, error) {
		return f.Start(ctx, m[1], atoi(m[2]))
	})
	add("POST", "/nodes/{node}/qemu/{vmid}/status/stop", func(_ *testing.T, _ *http.Request, m []string) (any, error) {
		return f.Stop(ctx, m[1], atoi(m[2]))
	})
	add("DELETE", "/nodes/{node}/qemu/{vmid}", func(t *testing.T, r *http.Request, m []string) (any, error) {
		q := r.URL.Query()
		assert.Contains(t, []string{"1", "true"}, q.Get("destroy-unreferenced-disks"), "the clone's disks go with it")
		assert.Empty(t, q.Get("purge"), "purge needs more privileges and nstance VMs are in no job")
		return f.Destroy(ctx, m[1], atoi(m[2]))
	})
	add("POST", "/nodes/{node}/storage/{storage}/upload", func(t *testing.T, r *http.Request, m []string) (any, error) {
		assert.NoError(t, r.ParseMultipartForm(1<<20))
		assert.Equal(t, "iso", r.FormValue("content"))
		file, hdr, err := r.FormFile("filename")
		if !assert.NoError(t, err) {
			return nil, err
		}
		defer func() { _ = file.Close() }()
		body, _ := io.ReadAll(file)
		return f.Upload(ctx, m[1], m[2], hdr.Filename, body)
	})
	add("DELETE", "/nodes/{node}/storage/{storage}/content/{volume}", func(_ *testing.T, _ *http.Request, m []string) (any, error) {
		return f.DeleteVolume(ctx, m[1], m[2], m[3])
	})
	add("GET", "/nodes/{node}/tasks/{upid}/status", func(t *testing.T, _ *http.Request, m []string) (any, error) {
		assert.True(t, strings.HasPrefix(m[2], "UPID:"+m[1]+":"), "the task's node is in its UPID")
		st, err := f.TaskStatus(ctx, m[2])
		out := map[string]any{"upid": m[2], "node": m[1], "status": st.Status, "type": "qmclone", "user": wireTokenID,
			"pid": 4242, "pstart": 100, "starttime": 1764200000}
		if st.Done() {
			out["exitstatus"] = st.ExitStatus
		}
		return out, err
	})
	return s
}

func (s *pveServer) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	t := s.t
	if got := r.Header.Get("Authorization"); got != "PVEAPIToken="+wireTokenID+"="+wireSecret {
		t.Errorf("Authorization %q: want the API token", got)
		http.Error(rw, "authentication failure", http.StatusUnauthorized)
		return
	}
	for _, rt := range s.routes {
		m := rt.re.FindStringSubmatch(r.URL.Path)
		if rt.method != r.Method || m == nil {
			continue
		}
		s.mu.Lock()
		s.seen[rt.method+" "+rt.path] = true
		s.mu.Unlock()
		data, err := rt.serve(t, r, m)
		if err != nil {
			writeError(t, rw, err)
			return
		}
		rw.Header().Set("Content-Type", "application/json;charset=UTF-8")
		assert.NoError(t, json.NewEncoder(rw).Encode(map[string]any{"data": data}))
		return
	}
	t.Errorf("unexpected %s %s", r.Method, r.URL)
	http.Error(rw, "Method '"+r.Method+" "+r.URL.Path+"' not implemented", http.StatusNotImplemented)
}

// writeError answers as Proxmox VE does: the message is the status line's
// reason phrase ("500 VM 100 is running - destroy failed"), or 400 with
// the parameter errors.
func writeError(t *testing.T, rw http.ResponseWriter, err error) {
	msg := err.Error()
	code := http.StatusInternalServerError
	if rest, ok := strings.CutPrefix(msg, "400 bad request: "); ok {
		k, v, _ := strings.Cut(rest, ": ")
		b, _ := json.Marshal(map[string]any{"data": nil, "errors": map[string]string{k: v}})
		rw.Header().Set("Content-Type", "application/json;charset=UTF-8")
		rw.WriteHeader(http.StatusBadRequest)
		_, _ = rw.Write(b)
		return
	}
	msg = strings.TrimPrefix(msg, "500 ")
	conn, buf, herr := rw.(http.Hijacker).Hijack()
	if !assert.NoError(t, herr) {
		return
	}
	defer func() { _ = conn.Close() }()
	body := `{"data":null}`
	fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\nContent-Type: application/json;charset=UTF-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", code, msg, len(body), body)
	_ = buf.Flush()
}

// wireProvider builds the provider through its kind (options block,
// validation, the token secret file, the CA file) against srv.
func wireProvider(t *testing.T, srv *httptest.Server, edit func(o map[string]any)) provider.Provider {
	t.Helper()
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(secretFile, []byte(wireSecret+"\n"), 0o600))
	caFile := filepath.Join(dir, "ca.pem")
	require.NoError(t, os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	cfg := testConfig(t)
	opts := map[string]any{"endpoint": srv.URL + "/api2/json", "token_id": wireTokenID, "token_secret_file": secretFile, "ca_file": caFile,
		"nodes": []any{"pve1", "pve2"}, "template_vmid": float64(templateVMID), "tags": []any{"k8s"}}
	if edit != nil {
		edit(opts)
	}
	cfg.Shard.Infra.Provider = proxmox.KindName
	cfg.Shard.Infra.Options = opts
	env := provider.Env{Config: func() *config.Config { return cfg }, Log: logr.Discard()}
	p, err := provider.NewRegistry(proxmox.Kind()).New(context.Background(), env)
	require.NoError(t, err)
	p.(*proxmox.Provider).Poll = fastPoll
	return p
}

func TestWire(t *testing.T) {
	ctx := context.Background()
	f := fake.New("pve1", "pve2")
	f.AddTemplate("pve1", templateVMID, "ubuntu-24.04", 2048)
	f.TaskLooks = 1
	s := newPVEServer(t, f)
	srv := httptest.NewTLSServer(s)
	t.Cleanup(srv.Close)
	p := wireProvider(t, srv, nil)

	// Two members of a group: the second is cloned across to pve2.
	var insts []provider.Instance
	for _, id := range []string{"web-00000001", "web-00000002"} {
		req := request(id, "web")
		req.UserData, req.UserDataFormat = []byte("#!/bin/sh\necho hi\n"), "cloud-config"
		inst, err := p.Create(ctx, req)
		require.NoError(t, err)
		require.Equal(t, provider.StateRunning, inst.State)
		insts = append(insts, inst)
	}
	nodes := map[string]string{}
	for _, v := range f.VMs() {
		if !v.Template {
			nodes[v.Name] = v.Node
			require.Equal(t, "4096", v.Options["memory"])
			require.Contains(t, v.Tags, "nstance-instance."+v.Name)
		}
	}
	require.Equal(t, map[string]string{"web-00000001": "pve1", "web-00000002": "pve2"}, nodes)
	img, ok := f.Volume("pve2", "local:iso/nstance-c1-s1-web-00000002.iso")
	require.True(t, ok, "the seed went to the node of the VM: %v", f.Volumes())
	_, files, err := proxmox.ReadSeedISO(img)
	require.NoError(t, err)
	require.Contains(t, string(files["user-data"]), "echo hi")

	list, err := p.List(ctx)
	require.NoError(t, err)
	require.Equal(t, insts, list)
	got, err := p.Status(ctx, "web-00000002")
	require.NoError(t, err)
	require.Equal(t, insts[1], got)
	_, err = p.Status(ctx, "web-00000003")
	require.ErrorIs(t, err, provider.ErrNotFound)

	// Errors travel in the status line: a VMID taken between nextid and
	// clone is retried with the next one.
	taken := false
	f.Fail = func(m, _ string) error {
		if m == "Clone" && !taken {
			taken = true
			f.AddVM(fake.VMState{VMID: 102, Node: "pve1", Name: "other"})
			return errors.New("500 unable to create VM 102: config file already exists")
		}
		return nil
	}
	_, err = p.Create(ctx, request("web-00000003", "web"))
	require.NoError(t, err)
	require.Equal(t, "pve1", vmOf(t, f, "web-00000003").Node)

	// A destroy of a running VM is refused by Proxmox: the provider stops it first.
	for _, id := range []string{"web-00000001", "web-00000002", "web-00000003"} {
		require.NoError(t, p.Delete(ctx, id))
	}
	list, err = p.List(ctx)
	require.NoError(t, err)
	require.Empty(t, list)
	require.Empty(t, f.Volumes())

	// A parameter Proxmox rejects (400) is an error naming it.
	f.Fail = func(m, _ string) error {
		if m == "SetConfig" {
			return errors.New("400 bad request: tags: invalid format - invalid tag")
		}
		return nil
	}
	_, err = p.Create(ctx, request("web-00000004", "web"))
	require.ErrorContains(t, err, "invalid format - invalid tag")

	var seen, want []string
	for k := range s.seen {
		seen = append(seen, k)
	}
	for _, c := range proxmox.Calls {
		want = append(want, c.Method+" "+c.Path)
	}
	sort.Strings(seen)
	sort.Strings(want)
	require.Equal(t, want, seen, "the API paths called are the documented ones (proxmox.Calls, deploy/proxmox)")
}

func TestWireWrongTokenOrCA(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		http.Error(rw, "authentication failure", http.StatusUnauthorized)
	}))
	t.Cleanup(srv.Close)
	p := wireProvider(t, srv, nil)
	_, err := p.List(context.Background())
	require.ErrorContains(t, err, "not authorized")

	// A CA that did not sign the server's certificate.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other CA"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	otherCA := filepath.Join(t.TempDir(), "other.pem")
	require.NoError(t, os.WriteFile(otherCA, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	p = wireProvider(t, srv, func(o map[string]any) { o["ca_file"] = otherCA })
	_, err = p.List(context.Background())
	require.ErrorContains(t, err, "certificate", "another server's certificate is refused")
}
