package fsbucket

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// A durable bucket fsyncs the body before it is renamed into place and
// every directory whose entries changed, up to the root; a default bucket
// (dev-s3) syncs nothing.
func TestSyncMakesWritesAndDeletesDurable(t *testing.T) {
	ctx := context.Background()
	for _, durable := range []bool{true, false} {
		b, err := OpenWith(t.TempDir(), Options{Sync: durable})
		require.NoError(t, err)
		var mu sync.Mutex
		var synced []string
		b.fsync = func(f *os.File) error {
			mu.Lock()
			defer mu.Unlock()
			rel, err := filepath.Rel(b.Root(), f.Name())
			require.NoError(t, err)
			synced = append(synced, rel)
			return f.Sync()
		}
		_, err = b.Put(ctx, "a/b/c.json", bytes.NewReader([]byte("{}")), map[string]string{"content-type": "application/json"}, Conditions{IfNoneMatch: true})
		require.NoError(t, err)
		if !durable {
			require.Empty(t, synced)
			continue
		}
		require.Contains(t, synced, "a/b")
		require.Contains(t, synced, "a")
		require.Contains(t, synced, ".", "the root holds the new directory a")
		require.Contains(t, synced, filepath.Join(HiddenDir, "meta", "a", "b"), "the sidecar's directory")
		temps := 0
		for _, s := range synced {
			if strings.HasPrefix(filepath.Base(s), TempPrefix) {
				temps++
			}
		}
		require.GreaterOrEqual(t, temps, 1, "the body (a temp file) is synced before the rename: %v", synced)

		synced = nil
		require.NoError(t, b.Delete(ctx, "a/b/c.json"))
		require.Contains(t, synced, ".", "the removal of the emptied directories is synced: %v", synced)
	}
}
