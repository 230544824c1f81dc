package files

import (
	"bytes"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// FuzzCleanPath checks the gate every delivered path passes: a path it
// accepts is local (filepath.IsLocal), already clean, relative, free of
// backslashes and NUL bytes, and joined to any root stays below that root.
// (Invalid UTF-8 never arrives: paths are protobuf strings.)
func FuzzCleanPath(f *testing.F) {
	for _, p := range []string{"a", "etc/app.conf", "a/b/c.json", "../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a/.", "a\\..\\b",
		"a\x00b", "..", ".", "", ".hidden/..a", "a/b/", "C:/x", "C:x", "~/.ssh/authorized_keys", strings.Repeat("a/", 600)} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p string) {
		rel, err := CleanPath(p)
		if err != nil {
			if rel != "" {
				t.Fatalf("refused %q but returned %q", p, rel)
			}
			return
		}
		if rel != p {
			t.Fatalf("accepted %q as %q: want it unchanged", p, rel)
		}
		if !filepath.IsLocal(rel) || path.Clean(rel) != rel || strings.ContainsAny(rel, "\\\x00") {
			t.Fatalf("accepted %q, which is not a clean local path", p)
		}
		root := "/srv/nstance/files"
		if j := filepath.Join(root, rel); !strings.HasPrefix(j, root+"/") {
			t.Fatalf("accepted %q joins to %q, outside %s", p, j, root)
		}
	})
}

// FuzzApply delivers a file with an arbitrary path, kind, mode, content and
// announced hash (plus a pending path) into a directory that holds symbolic
// links to a directory and a file outside it, then a delivery without it.
// Nothing outside the directory may be created, changed or removed (but the
// writer's manifest); no file in it may be group- or world-writable, nor a
// secret readable by others; a file reported written holds exactly the
// content delivered; dropped files are removed, the links are not followed.
func FuzzApply(f *testing.F) {
	f.Add("etc/app.conf", int32(nstancev1.FileKind_FILE_KIND_STRING), uint32(0o644), []byte("key=value\n"), "", "")
	f.Add("secrets/token", int32(nstancev1.FileKind_FILE_KIND_SECRET), uint32(0o777), []byte("s3cr3t"), "", "other")
	f.Add("app.env", int32(nstancev1.FileKind_FILE_KIND_ENV), uint32(0), []byte("export A=1\n# c\nB_2=x\n"), "", "")
	f.Add("data.json", int32(nstancev1.FileKind_FILE_KIND_JSON), uint32(0o600), []byte(`{"a":[1,2]}`), "", "")
	f.Add("ca.pem", int32(nstancev1.FileKind_FILE_KIND_CA_BUNDLE), uint32(0o644), []byte(testCert), "", "")
	f.Add("link/escape", int32(nstancev1.FileKind_FILE_KIND_STRING), uint32(0o644), []byte("x"), "", "")
	f.Add("linkfile", int32(nstancev1.FileKind_FILE_KIND_STRING), uint32(0o644), []byte("x"), "", "")
	f.Add("../outside/secret", int32(nstancev1.FileKind_FILE_KIND_STRING), uint32(0o644), []byte("x"), "", "")
	f.Add("a/b/c", int32(nstancev1.FileKind_FILE_KIND_STRING), uint32(0o4755), []byte("x"), "", "")
	f.Add("x", int32(nstancev1.FileKind_FILE_KIND_STRING), uint32(0o200), []byte("x"), "", "")
	f.Add("x", int32(nstancev1.FileKind_FILE_KIND_STRING), uint32(0o644), []byte("x"), "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881", "x")
	f.Add("x", int32(99), uint32(0o644), []byte("x"), "", "")

	f.Fuzz(func(t *testing.T, p string, kind int32, mode uint32, content []byte, announced, pending string) {
		base := t.TempDir()
		root := filepath.Join(base, "files")
		outside := filepath.Join(base, "outside")
		for _, d := range []string{root, outside} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		secret := filepath.Join(outside, "secret")
		if err := os.WriteFile(secret, []byte("outside"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, filepath.Join(root, "link")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(secret, filepath.Join(root, "linkfile")); err != nil {
			t.Fatal(err)
		}
		w, err := New(root, Options{MaxSize: 1 << 16})
		if err != nil {
			t.Fatal(err)
		}
		manifest := w.opts.ManifestPath
		df := &nstancev1.DeliveredFile{Path: p, Kind: nstancev1.FileKind(kind), Mode: mode, Content: content, Sha256: announced}
		st := w.Apply(&nstancev1.FileDelivery{Files: []*nstancev1.DeliveredFile{df}, PendingPaths: []string{pending}})
		if len(st) != 1 || st[0].GetPath() != p {
			t.Fatalf("statuses %v for one file", st)
		}
		check := func(written bool) {
			t.Helper()
			err := filepath.WalkDir(base, func(q string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				switch {
				case q == base || q == root || q == outside || q == manifest:
					return nil
				case q == secret:
					if b, err := os.ReadFile(secret); err != nil || string(b) != "outside" {
						t.Fatalf("the file outside changed: %q %v", b, err)
					}
					return nil
				case !strings.HasPrefix(q, root+"/"):
					t.Fatalf("%s was created outside the directory (delivered path %q)", q, p)
				}
				info, err := d.Info()
				if err != nil {
					return err
				}
				if info.Mode()&fs.ModeSymlink == 0 && info.Mode().Perm()&0o022 != 0 {
					t.Fatalf("%s is group- or world-writable: %v", q, info.Mode())
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range []string{"link", "linkfile"} {
				if fi, err := os.Lstat(filepath.Join(root, l)); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
					t.Fatalf("the link %s was replaced or removed (%v)", l, err)
				}
			}
			if !written {
				return
			}
			target := filepath.Join(root, filepath.FromSlash(p))
			fi, err := os.Lstat(target)
			if err != nil || !fi.Mode().IsRegular() {
				t.Fatalf("reported written, but %s is not a regular file (%v)", target, err)
			}
			if b, err := os.ReadFile(target); err != nil || !bytes.Equal(b, content) {
				t.Fatalf("reported written, but %s holds other content (%v)", target, err)
			}
			if df.GetKind() == nstancev1.FileKind_FILE_KIND_SECRET && fi.Mode().Perm()&0o077 != 0 {
				t.Fatalf("secret %s has mode %v", target, fi.Mode())
			}
		}
		ok := st[0].GetState() == nstancev1.FileState_FILE_STATE_OK
		check(ok)
		if ok {
			if _, err := CleanPath(p); err != nil {
				t.Fatalf("wrote %q, which CleanPath refuses: %v", p, err)
			}
		}
		// The next delivery drops the file: it is removed, nothing else is.
		w.Apply(&nstancev1.FileDelivery{})
		check(false)
		if ok {
			if _, err := os.Lstat(filepath.Join(root, filepath.FromSlash(p))); !os.IsNotExist(err) {
				t.Fatalf("dropped file %q was not removed (%v)", p, err)
			}
		}
	})
}
