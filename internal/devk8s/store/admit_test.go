package store

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/watch"
)

// TestAdmitRefusesOnce: a hand edit that Admit refuses keeps the last good
// object, and the same content is refused once however many file events
// it brings, until the content or the object changes.
func TestAdmitRefusesOnce(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var refused []string
	s := openStore(t, dir, Options{Admit: func(res, path string, old, obj map[string]any) error {
		data, _ := obj["data"].(map[string]any)
		if data["v"] != "bad" {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		refused = append(refused, path)
		return errors.New("v must not be bad")
	}})
	put(t, s, "configmaps", "default", "c", map[string]any{"v": "good"})
	start, err := s.Watch("configmaps", "", s.CurrentRV(), false)
	require.NoError(t, err)
	w := start.Watcher
	defer w.Stop()
	path := filepath.Join(dir, "configmaps", "default", "c.json")
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(refused)
	}
	bad := []byte(`{"data":{"v":"bad"}}`)
	require.NoError(t, os.WriteFile(path, bad, 0o644))
	require.Eventually(t, func() bool { return count() == 1 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, path, refused[0])
	// Touching the file again with the same content: no second refusal.
	require.NoError(t, os.WriteFile(path, bad, 0o644))
	noEvent(t, w, 300*time.Millisecond)
	require.Equal(t, 1, count())
	e, ok := s.Get("configmaps", "default", "c")
	require.True(t, ok)
	require.Equal(t, "good", e.Object["data"].(map[string]any)["v"], "last good object served: %v", e.Object)
	// Once the object changed, the same bad content is judged again.
	put(t, s, "configmaps", "default", "c", map[string]any{"v": "other"})
	require.Equal(t, watch.Modified, nextEvent(t, w).Type)
	require.NoError(t, os.WriteFile(path, bad, 0o644))
	require.Eventually(t, func() bool { return count() == 2 }, 5*time.Second, 10*time.Millisecond)
}
