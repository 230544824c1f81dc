package files

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// testCert is a real self-signed certificate made once per test binary.
var testCert = func() string {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		panic(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}()

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func file(p string, kind nstancev1.FileKind, content string, mode uint32) *nstancev1.DeliveredFile {
	return &nstancev1.DeliveredFile{Path: p, Kind: kind, Content: []byte(content), Mode: mode, Sha256: sum([]byte(content))}
}

// tree lists every entry below dir (relative, slash separated) so tests can
// prove nothing else was created.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		if p != dir {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	}))
	return out
}

func newWriter(t *testing.T, opts Options) (*Writer, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "files")
	w, err := New(dir, opts)
	require.NoError(t, err)
	return w, dir
}

func TestApplyWritesKindsAndModes(t *testing.T) {
	w, dir := newWriter(t, Options{FileMode: 0o640})
	d := &nstancev1.FileDelivery{ConfigHash: "h1", Files: []*nstancev1.DeliveredFile{
		file("node.env", nstancev1.FileKind_FILE_KIND_ENV, "NODE=a\n# c\nexport ROLE=worker\n", 0),
		file("conf/app.json", nstancev1.FileKind_FILE_KIND_JSON, `{"a":1}`, 0o644),
		file("secrets/token", nstancev1.FileKind_FILE_KIND_SECRET, "s3cr3t", 0),
		file("secrets/other", nstancev1.FileKind_FILE_KIND_SECRET, "x", 0o400),
		file("certs/ca.crt", nstancev1.FileKind_FILE_KIND_CA_BUNDLE, testCert, 0o644),
		file("motd", nstancev1.FileKind_FILE_KIND_STRING, "hello", 0o604),
	}}
	sts := w.Apply(d)
	require.Len(t, sts, len(d.Files))
	for _, st := range sts {
		require.Equal(t, nstancev1.FileState_FILE_STATE_OK, st.State, st.Path+": "+st.Message)
	}
	want := map[string]fs.FileMode{
		"node.env": 0o640, "conf/app.json": 0o644, "secrets/token": 0o600,
		"secrets/other": 0o400, "certs/ca.crt": 0o644, "motd": 0o604,
	}
	for _, f := range d.Files {
		p := filepath.Join(dir, f.Path)
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		require.Equal(t, f.Content, b)
		fi, err := os.Stat(p)
		require.NoError(t, err)
		require.Equal(t, want[f.Path], fi.Mode().Perm(), f.Path)
	}
	status := w.Status()
	require.Len(t, status, len(d.Files))
	require.Equal(t, "certs/ca.crt", status[0].Path)
	require.Equal(t, sum([]byte(testCert)), status[0].Sha256)
}

func TestApplyRejectsUnsafe(t *testing.T) {
	big := strings.Repeat("x", 101)
	cases := []struct {
		name    string
		setup   func(t *testing.T, dir, outside string)
		file    *nstancev1.DeliveredFile
		wantErr string
	}{
		{name: "absolute path", file: file("/etc/evil", nstancev1.FileKind_FILE_KIND_STRING, "x", 0o644), wantErr: "absolute"},
		{name: "absolute path into outside", file: file("OUTSIDE", nstancev1.FileKind_FILE_KIND_STRING, "x", 0o644), wantErr: "absolute"},
		{name: "dotdot escape", file: file("../evil", nstancev1.FileKind_FILE_KIND_STRING, "x", 0o644), wantErr: `".."`},
		{name: "dotdot inside", file: file("a/../../evil", nstancev1.FileKind_FILE_KIND_STRING, "x", 0o644), wantErr: `".."`},
		{name: "dotdot that stays inside", file: file("a/../b", nstancev1.FileKind_FILE_KIND_STRING, "x", 0o644), wantErr: `".."`},
		{
			name: "symlink file pointing outside",
			setup: func(t *testing.T, dir, outside string) {
				require.NoError(t, os.Symlink(filepath.Join(outside, "target"), filepath.Join(dir, "link")))
			},
			file: file("link", nstancev1.FileKind_FILE_KIND_STRING, "x", 0o644), wantErr: "symbolic link",
		},
		{
			name: "symlink directory pointing outside",
			setup: func(t *testing.T, dir, outside string) {
				require.NoError(t, os.Symlink(outside, filepath.Join(dir, "sub")))
			},
			file: file("sub/evil", nstancev1.FileKind_FILE_KIND_STRING, "x", 0o644), wantErr: "symbolic link",
		},
		{
			name: "relative symlink escaping",
			setup: func(t *testing.T, dir, outside string) {
				require.NoError(t, os.MkdirAll(filepath.Join(dir, "d"), 0o755))
				require.NoError(t, os.Symlink("../../outside", filepath.Join(dir, "d", "up")))
			},
			file: file("d/up/evil", nstancev1.FileKind_FILE_KIND_STRING, "x", 0o644), wantErr: "symbolic link",
		},
		{name: "oversized", file: file("big", nstancev1.FileKind_FILE_KIND_STRING, big, 0o644), wantErr: "above the 100 byte limit"},
		{name: "hash mismatch", file: &nstancev1.DeliveredFile{Path: "h", Kind: nstancev1.FileKind_FILE_KIND_STRING, Content: []byte("a"), Sha256: sum([]byte("b"))}, wantErr: "does not match"},
		{name: "setuid mode", file: file("m", nstancev1.FileKind_FILE_KIND_STRING, "x", 0o4755), wantErr: "beyond the permission bits"},
		{name: "owner cannot read", file: file("w", nstancev1.FileKind_FILE_KIND_STRING, "x", 0o222), wantErr: "does not let the owner read"},
		{name: "bad json", file: file("j.json", nstancev1.FileKind_FILE_KIND_JSON, "{", 0o644), wantErr: "not valid JSON"},
		{name: "bad env", file: file("e.env", nstancev1.FileKind_FILE_KIND_ENV, "1X=2\n", 0o644), wantErr: "not KEY=value"},
		{name: "bad cert", file: file("c.crt", nstancev1.FileKind_FILE_KIND_CERTIFICATE, "nope", 0o644), wantErr: "no PEM certificate"},
		{name: "corrupt cert", file: file("c.crt", nstancev1.FileKind_FILE_KIND_CERTIFICATE, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", 0o644), wantErr: "PEM block 1"},
		{name: "kind unset", file: file("k", nstancev1.FileKind_FILE_KIND_UNSPECIFIED, "x", 0o644), wantErr: "kind is not set"},
		{name: "empty path", file: file("", nstancev1.FileKind_FILE_KIND_STRING, "x", 0o644), wantErr: "empty path"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			dir := filepath.Join(base, "files")
			outside := filepath.Join(base, "outside")
			require.NoError(t, os.MkdirAll(outside, 0o755))
			if tc.file.Path == "OUTSIDE" {
				tc.file.Path = filepath.Join(outside, "evil")
			}
			w, err := New(dir, Options{MaxSize: 100})
			require.NoError(t, err)
			if tc.setup != nil {
				tc.setup(t, dir, outside)
			}
			before := tree(t, dir)
			good := file("good.txt", nstancev1.FileKind_FILE_KIND_STRING, "ok", 0o644)
			sts := w.Apply(&nstancev1.FileDelivery{ConfigHash: "h", Files: []*nstancev1.DeliveredFile{tc.file, good}})
			require.Len(t, sts, 2)
			require.Equal(t, nstancev1.FileState_FILE_STATE_ERROR, sts[0].State)
			require.Contains(t, sts[0].Message, tc.wantErr)
			require.Empty(t, sts[0].Sha256)
			require.Equal(t, nstancev1.FileState_FILE_STATE_OK, sts[1].State, "a bad file must not stop the others")
			require.ElementsMatch(t, append(before, "good.txt"), tree(t, dir), "only the good file appears")
			outs, err := os.ReadDir(outside)
			require.NoError(t, err)
			require.Empty(t, outs, "nothing written outside the directory")
			_, err = os.Lstat(filepath.Join(base, "evil"))
			require.ErrorIs(t, err, fs.ErrNotExist)
			// The rejection shows up in the status kept for the next health report.
			var found bool
			for _, st := range w.Status() {
				if st.Path == tc.file.Path {
					found = true
					require.Equal(t, nstancev1.FileState_FILE_STATE_ERROR, st.State)
				}
			}
			require.True(t, found)
		})
	}
}

func TestRejectedFileKeepsOldContent(t *testing.T) {
	w, dir := newWriter(t, Options{MaxSize: 10})
	sts := w.Apply(&nstancev1.FileDelivery{Files: []*nstancev1.DeliveredFile{file("a.json", nstancev1.FileKind_FILE_KIND_JSON, `{"v":1}`, 0o644)}})
	require.Equal(t, nstancev1.FileState_FILE_STATE_OK, sts[0].State)
	for _, bad := range []*nstancev1.DeliveredFile{
		file("a.json", nstancev1.FileKind_FILE_KIND_JSON, `{"v":`, 0o644),
		file("a.json", nstancev1.FileKind_FILE_KIND_JSON, `{"v":"0123456789"}`, 0o644),
	} {
		sts = w.Apply(&nstancev1.FileDelivery{Files: []*nstancev1.DeliveredFile{bad}})
		require.Equal(t, nstancev1.FileState_FILE_STATE_ERROR, sts[0].State)
		b, err := os.ReadFile(filepath.Join(dir, "a.json"))
		require.NoError(t, err)
		require.Equal(t, `{"v":1}`, string(b))
	}
	require.Equal(t, []string{"a.json"}, tree(t, dir), "no temporary files left behind")
}

func TestReplaceIsAtomicAndUpdatesMode(t *testing.T) {
	w, dir := newWriter(t, Options{})
	p := filepath.Join(dir, "data")
	a := strings.Repeat("a", 64<<10)
	b := strings.Repeat("b", 64<<10)
	require.Equal(t, nstancev1.FileState_FILE_STATE_OK, w.Apply(&nstancev1.FileDelivery{Files: []*nstancev1.DeliveredFile{file("data", nstancev1.FileKind_FILE_KIND_STRING, a, 0o644)}})[0].State)

	// A reader polling the file must only ever see one complete version.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var torn []string
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			got, err := os.ReadFile(p)
			if err != nil || (string(got) != a && string(got) != b) {
				torn = append(torn, "torn read")
				return
			}
		}
	}()
	for i := range 50 {
		content, mode := a, uint32(0o644)
		if i%2 == 0 {
			content, mode = b, 0o600
		}
		st := w.Apply(&nstancev1.FileDelivery{Files: []*nstancev1.DeliveredFile{file("data", nstancev1.FileKind_FILE_KIND_STRING, content, mode)}})
		require.Equal(t, nstancev1.FileState_FILE_STATE_OK, st[0].State)
	}
	close(stop)
	wg.Wait()
	require.Empty(t, torn)
	fi, err := os.Stat(p)
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o644), fi.Mode().Perm())
	require.Equal(t, []string{"data"}, tree(t, dir))
}

func TestNewRejectsBadOptions(t *testing.T) {
	_, err := New("", Options{})
	require.ErrorContains(t, err, "directory is required")
	_, err = New(t.TempDir(), Options{FileMode: fs.ModeSetuid | 0o644})
	require.ErrorContains(t, err, "permission bits only")
}

func TestCleanPath(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{in: "a/b.txt", want: "a/b.txt"},
		{in: "a//b", err: "empty"},
		{in: "./a", err: `"."`},
		{in: "a\\..\\b", err: "backslash"},
		{in: "a\x00", err: "NUL"},
		{in: strings.Repeat("a", maxPathLen+1), err: "longer"},
	} {
		got, err := CleanPath(tc.in)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.in)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
	}
}

func TestModesAreCapped(t *testing.T) {
	w, dir := newWriter(t, Options{})
	want := map[string]fs.FileMode{}
	var files []*nstancev1.DeliveredFile
	for _, tc := range []struct {
		path string
		kind nstancev1.FileKind
		mode uint32
		want fs.FileMode
	}{
		{"world-writable", nstancev1.FileKind_FILE_KIND_STRING, 0o666, 0o644},
		{"everything", nstancev1.FileKind_FILE_KIND_STRING, 0o777, 0o755},
		{"group-writable", nstancev1.FileKind_FILE_KIND_ENV, 0o664, 0o644},
		{"plain", nstancev1.FileKind_FILE_KIND_JSON, 0o640, 0o640},
		{"world-readable secret", nstancev1.FileKind_FILE_KIND_SECRET, 0o644, 0o600},
		{"group secret", nstancev1.FileKind_FILE_KIND_SECRET, 0o660, 0o600},
		{"read-only secret", nstancev1.FileKind_FILE_KIND_SECRET, 0o400, 0o400},
	} {
		content := "x"
		switch tc.kind {
		case nstancev1.FileKind_FILE_KIND_ENV:
			content = "A=1\n"
		case nstancev1.FileKind_FILE_KIND_JSON:
			content = "{}"
		}
		files = append(files, file(tc.path, tc.kind, content, tc.mode))
		want[tc.path] = tc.want
	}
	for _, st := range w.Apply(&nstancev1.FileDelivery{Files: files}) {
		require.Equal(t, nstancev1.FileState_FILE_STATE_OK, st.State, st.Path+": "+st.Message)
		fi, err := os.Stat(filepath.Join(dir, st.Path))
		require.NoError(t, err)
		require.Equal(t, want[st.Path], fi.Mode().Perm(), st.Path)
	}
	for _, o := range []Options{{FileMode: 0o666}, {FileMode: 0o664}, {DirMode: 0o777}, {DirMode: 0o775}} {
		_, err := New(filepath.Join(t.TempDir(), "f"), o)
		require.ErrorContains(t, err, "group- or world-writable", "%+v", o)
	}
}

func TestDroppedFilesAreRemoved(t *testing.T) {
	w, dir := newWriter(t, Options{})
	outside := t.TempDir()
	str := func(p string) *nstancev1.DeliveredFile { return file(p, nstancev1.FileKind_FILE_KIND_STRING, p, 0o644) }
	all := []*nstancev1.DeliveredFile{str("keep"), str("gone"), str("deep/er/gone"), str("shared/keep"), str("shared/gone"),
		str("linked"), str("via/dir/f"), str("cert.pem"), str("bad.json")}
	for _, st := range w.Apply(&nstancev1.FileDelivery{Files: all}) {
		require.Equal(t, nstancev1.FileState_FILE_STATE_OK, st.State, st.Path+": "+st.Message)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "not-ours"), []byte("an operator's file"), 0o644))
	// Someone on the instance swaps a written file and a directory for links out of the directory.
	require.NoError(t, os.WriteFile(filepath.Join(outside, "linked"), []byte("precious"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(dir, "linked")))
	require.NoError(t, os.Symlink(filepath.Join(outside, "linked"), filepath.Join(dir, "linked")))
	require.NoError(t, os.MkdirAll(filepath.Join(outside, "dir"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(outside, "dir", "f"), []byte("precious"), 0o644))
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "via", "dir")))
	require.NoError(t, os.Symlink(filepath.Join(outside, "dir"), filepath.Join(dir, "via", "dir")))

	// The template now holds keep, shared/keep, a pending certificate and an
	// invalid update of bad.json (the old content stays).
	sts := w.Apply(&nstancev1.FileDelivery{
		Files:        []*nstancev1.DeliveredFile{str("keep"), str("shared/keep"), file("bad.json", nstancev1.FileKind_FILE_KIND_JSON, "{", 0o644)},
		PendingPaths: []string{"cert.pem"},
	})
	require.Equal(t, nstancev1.FileState_FILE_STATE_ERROR, sts[2].State)
	require.ElementsMatch(t, []string{"keep", "shared", "shared/keep", "cert.pem", "bad.json", "not-ours", "linked", "via", "via/dir"}, tree(t, dir))
	for _, p := range []string{"linked", "dir/f"} {
		b, err := os.ReadFile(filepath.Join(outside, p))
		require.NoError(t, err)
		require.Equal(t, "precious", string(b), "nothing outside the directory is touched")
	}
	var paths []string
	for _, st := range w.Status() {
		paths = append(paths, st.Path)
	}
	require.ElementsMatch(t, []string{"keep", "shared/keep", "bad.json", "cert.pem"}, paths, "removed files leave the health report")

	// After a restart the manifest still knows what was written.
	w2, err := New(dir, Options{})
	require.NoError(t, err)
	w2.Apply(&nstancev1.FileDelivery{Files: []*nstancev1.DeliveredFile{str("keep")}})
	require.ElementsMatch(t, []string{"keep", "not-ours", "linked", "via", "via/dir"}, tree(t, dir))
	manifest := filepath.Join(filepath.Dir(dir), ".files.manifest.json")
	b, err := os.ReadFile(manifest)
	require.NoError(t, err)
	require.JSONEq(t, `{"paths":["keep"]}`, string(b))
	fi, err := os.Stat(manifest)
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o600), fi.Mode().Perm())

	// A corrupt manifest removes nothing.
	require.NoError(t, os.WriteFile(manifest, []byte("{"), 0o600))
	w3, err := New(dir, Options{})
	require.NoError(t, err)
	w3.Apply(&nstancev1.FileDelivery{})
	require.Contains(t, tree(t, dir), "keep")
}
