package dirstore_test

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/dirstore"
	"github.com/nstance-dev/nstance/pkg/objstore/objstoretest"
)

func open(t *testing.T, dir string) *dirstore.Store {
	t.Helper()
	s, err := dirstore.Open(dir)
	require.NoError(t, err)
	return s
}

func TestContract(t *testing.T) {
	objstoretest.Run(t, func(t *testing.T) objstore.Store { return open(t, t.TempDir()) })
}

func TestPlainFileLayout(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir)
	_, err := s.Put(ctx, "cluster/ca.crt", []byte("PEM"), objstore.PutOptions{})
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(dir, "cluster", "ca.crt"))
	require.NoError(t, err)
	require.Equal(t, "PEM", string(data))

	// A file written by hand is an object, with an MD5 ETag and no sidecar;
	// editing it by hand changes the ETag.
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "config"), 0o755))
	for _, content := range []string{`{"a":1}`, `{"a":2}`} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "config", "dev-1.jsonc"), []byte(content), 0o644))
		sum := md5.Sum([]byte(content))
		h, err := s.Head(ctx, "config/dev-1.jsonc")
		require.NoError(t, err)
		require.Equal(t, hex.EncodeToString(sum[:]), h.ETag)
	}
	list, err := s.List(ctx, "")
	require.NoError(t, err)
	require.Len(t, list, 2, "the .dev-s3 tree and temp files are not objects")

	// Hand-edit a file written through the store: the stale sidecar must not win.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cluster", "ca.crt"), []byte("NEW PEM"), 0o644))
	obj, err := s.Get(ctx, "cluster/ca.crt")
	require.NoError(t, err)
	sum := md5.Sum([]byte("NEW PEM"))
	require.Equal(t, hex.EncodeToString(sum[:]), obj.ETag)

	// Same for a body large enough to get an MD5 sidecar, edited in place
	// with the same size.
	big := bytes.Repeat([]byte("a"), 100<<10)
	_, err = s.Put(ctx, "big", big, objstore.PutOptions{})
	require.NoError(t, err)
	// Hand edits are detected through (inode, size, mtime); step past a
	// coarse file-system timestamp tick so the edit gets a new mtime.
	time.Sleep(20 * time.Millisecond)
	f, err := os.OpenFile(filepath.Join(dir, "big"), os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("b"), 10)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	big[10] = 'b'
	h, err := s.Head(ctx, "big")
	require.NoError(t, err)
	sum = md5.Sum(big)
	require.Equal(t, hex.EncodeToString(sum[:]), h.ETag)
}

func TestReservedKeysRejected(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir())
	for _, k := range []string{".dev-s3/meta/x", "a/.dev-s3-tmp-123", "a/./b", "dir/", `a\b`} {
		_, err := s.Put(ctx, k, []byte("x"), objstore.PutOptions{})
		require.ErrorIs(t, err, objstore.ErrInvalidKey, k)
	}
}

func TestFileDirectoryConflict(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir())
	_, err := s.Put(ctx, "a", []byte("file"), objstore.PutOptions{})
	require.NoError(t, err)
	_, err = s.Put(ctx, "a/b", []byte("x"), objstore.PutOptions{})
	require.ErrorIs(t, err, objstore.ErrInvalidKey)
	_, err = s.Put(ctx, "c/d", []byte("x"), objstore.PutOptions{})
	require.NoError(t, err)
	_, err = s.Put(ctx, "c", []byte("x"), objstore.PutOptions{})
	require.ErrorIs(t, err, objstore.ErrInvalidKey)
	obj, err := s.Get(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, "file", string(obj.Body), "a failed write loses nothing")
}

// Several Store values on one directory (as several servers in one test
// process would have) still let exactly one create-only write win.
func TestConcurrentCreateAcrossInstances(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	stores := make([]*dirstore.Store, 4)
	for i := range stores {
		stores[i] = open(t, dir)
	}
	for round := range 5 {
		key := fmt.Sprintf("leader-%d", round)
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins := 0
		for i := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := stores[i%len(stores)].Put(ctx, key, []byte(fmt.Sprint(i)), objstore.PutOptions{IfNoneMatch: true})
				if err == nil {
					mu.Lock()
					wins++
					mu.Unlock()
				} else {
					require.ErrorIs(t, err, objstore.ErrPreconditionFailed)
				}
			}()
		}
		wg.Wait()
		require.Equal(t, 1, wins)
	}
}

// If-Match read-modify-write loops from several instances never lose an update.
func TestIfMatchCounterAcrossInstances(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, b := open(t, dir), open(t, dir)
	_, err := a.Put(ctx, "counter", []byte("0"), objstore.PutOptions{})
	require.NoError(t, err)
	const perWorker, workers = 10, 4
	var wg sync.WaitGroup
	for w := range workers {
		s := a
		if w%2 == 1 {
			s = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done := 0; done < perWorker; {
				obj, err := s.Get(ctx, "counter")
				require.NoError(t, err)
				var n int
				_, err = fmt.Sscan(string(obj.Body), &n)
				require.NoError(t, err)
				_, err = s.Put(ctx, "counter", []byte(fmt.Sprint(n+1)), objstore.PutOptions{IfMatch: obj.ETag})
				if err == nil {
					done++
					continue
				}
				require.ErrorIs(t, err, objstore.ErrPreconditionFailed)
			}
		}()
	}
	wg.Wait()
	obj, err := a.Get(ctx, "counter")
	require.NoError(t, err)
	require.Equal(t, fmt.Sprint(perWorker*workers), string(obj.Body))
}

func TestOpenErrors(t *testing.T) {
	base := t.TempDir()
	file := filepath.Join(base, "file")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o644))

	t.Run("missing directory is created", func(t *testing.T) {
		dir := filepath.Join(base, "new", "nested")
		s := open(t, dir)
		st, err := os.Stat(dir)
		require.NoError(t, err)
		require.True(t, st.IsDir())
		require.Equal(t, os.FileMode(0o755), st.Mode().Perm())
		require.Equal(t, dir, s.Dir())
	})
	tests := []struct {
		name, dir, want string
	}{
		{"cannot be created", filepath.Join(file, "sub"), "create bucket directory"},
		{"not a directory", file, "is not a directory"},
		{"not writable", readOnlyDir(t, base), "is not writable"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dirstore.Open(tc.dir)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// readOnlyDir returns a directory the current user cannot create files in.
// Root ignores permission bits, so it uses /proc, which no one can write.
func readOnlyDir(t *testing.T, base string) string {
	if os.Geteuid() == 0 {
		return "/proc"
	}
	dir := filepath.Join(base, "ro")
	require.NoError(t, os.Mkdir(dir, 0o555))
	t.Cleanup(func() { _ = os.Chmod(dir, 0o755) })
	return dir
}
