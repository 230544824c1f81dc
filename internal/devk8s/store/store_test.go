package store

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/watch"
)

func openStore(t *testing.T, dir string, opts Options) *Store {
	t.Helper()
	opts.Dir = dir
	ctx, cancel := context.WithCancel(context.Background())
	s, err := Open(ctx, logr.Discard(), opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		cancel()
		_ = s.Close()
	})
	require.NoError(t, s.Register("configmaps", true))
	require.NoError(t, s.Register("nodes", false))
	return s
}

func nextEvent(t *testing.T, w *Watcher) Event {
	t.Helper()
	select {
	case ev, ok := <-w.Events():
		require.True(t, ok, "watch closed")
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no watch event within 5s")
	}
	return Event{}
}

func noEvent(t *testing.T, w *Watcher, wait time.Duration) {
	t.Helper()
	select {
	case ev := <-w.Events():
		t.Fatalf("unexpected event %s %s", ev.Type, ev.Name)
	case <-time.After(wait):
	}
}

func readObj(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var obj map[string]any
	require.NoError(t, json.Unmarshal(data, &obj))
	return obj
}

func put(t *testing.T, s *Store, res, ns, name string, data map[string]any) Result {
	t.Helper()
	r, err := s.Mutate(res, ns, name, func(cur map[string]any) (Mutation, error) {
		md := map[string]any{"name": name}
		if ns != "" {
			md["namespace"] = ns
		}
		return Mutation{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": md, "data": data}}, nil
	})
	require.NoError(t, err)
	return r
}

// TestHandEdits drives the store through file operations a developer (or
// an editor) performs and checks the watch events they produce.
func TestHandEdits(t *testing.T) {
	cases := []struct {
		name       string
		res, ns    string
		namespaced bool
	}{
		{name: "namespaced", res: "configmaps", ns: "demo", namespaced: true},
		{name: "cluster-scoped", res: "nodes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir, Options{})
			start, err := s.Watch(tc.res, "", s.CurrentRV(), false)
			require.NoError(t, err)
			w := start.Watcher
			fileDir := filepath.Join(dir, tc.res)
			if tc.namespaced {
				fileDir = filepath.Join(fileDir, tc.ns)
				// A namespace directory made by hand is picked up too.
				require.NoError(t, os.MkdirAll(fileDir, 0o755))
				time.Sleep(100 * time.Millisecond)
			}
			path := filepath.Join(fileDir, "x.json")

			// Create by hand: ADDED with a fresh RV, file gains metadata.
			require.NoError(t, os.WriteFile(path, []byte(`{"data":{"a":"1"}}`), 0o644))
			ev := nextEvent(t, w)
			require.Equal(t, watch.Added, ev.Type)
			require.Equal(t, "x", ev.Name)
			require.Equal(t, tc.ns, ev.Namespace)
			rv1 := ev.RV
			require.Eventually(t, func() bool {
				md, _ := readObj(t, path)["metadata"].(map[string]any)
				return md["resourceVersion"] == strconv.FormatUint(rv1, 10)
			}, 5*time.Second, 20*time.Millisecond)

			// Edit in place.
			obj := readObj(t, path)
			obj["data"] = map[string]any{"a": "2"}
			data, _ := json.Marshal(obj)
			require.NoError(t, os.WriteFile(path, data, 0o644))
			ev = nextEvent(t, w)
			require.Equal(t, watch.Modified, ev.Type)
			require.Greater(t, ev.RV, rv1)
			require.Equal(t, map[string]any{"a": "2"}, ev.Object.Object["data"])

			// A torn file is skipped; the last good object stays served.
			require.NoError(t, os.WriteFile(path, []byte(`{"data":{"a":`), 0o644))
			noEvent(t, w, 300*time.Millisecond)
			e, ok := s.Get(tc.res, tc.ns, "x")
			require.True(t, ok)
			require.Equal(t, map[string]any{"a": "2"}, e.Object["data"])

			// Editor-style save: write elsewhere, rename over the file.
			obj["data"] = map[string]any{"a": "3"}
			data, _ = json.Marshal(obj)
			tmp := filepath.Join(fileDir, ".x.json.swp")
			require.NoError(t, os.WriteFile(tmp, data, 0o644))
			require.NoError(t, os.Rename(tmp, path))
			ev = nextEvent(t, w)
			require.Equal(t, watch.Modified, ev.Type)
			require.Equal(t, map[string]any{"a": "3"}, ev.Object.Object["data"])

			// Delete by hand.
			require.NoError(t, os.Remove(path))
			ev = nextEvent(t, w)
			require.Equal(t, watch.Deleted, ev.Type)
			_, ok = s.Get(tc.res, tc.ns, "x")
			require.False(t, ok)
			noEvent(t, w, 200*time.Millisecond)
		})
	}
}

func TestOwnWritesProduceOneEvent(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{})
	start, err := s.Watch("configmaps", "", s.CurrentRV(), false)
	require.NoError(t, err)
	put(t, s, "configmaps", "ns", "a", map[string]any{"k": "v"})
	put(t, s, "configmaps", "ns", "a", map[string]any{"k": "w"})
	require.Equal(t, watch.Added, nextEvent(t, start.Watcher).Type)
	require.Equal(t, watch.Modified, nextEvent(t, start.Watcher).Type)
	noEvent(t, start.Watcher, 300*time.Millisecond)
}

func TestNoopMutationKeepsRV(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{})
	a := put(t, s, "configmaps", "ns", "a", map[string]any{"k": "v"})
	b := put(t, s, "configmaps", "ns", "a", map[string]any{"k": "v"})
	require.True(t, b.Noop)
	require.Equal(t, a.Entry.RV, b.Entry.RV)
}

func TestRestartKeepsObjectsAndRVs(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := Open(ctx, logr.Discard(), Options{Dir: dir})
	require.NoError(t, err)
	require.NoError(t, s.Register("configmaps", true))
	r := put(t, s, "configmaps", "ns", "a", map[string]any{"k": "v"})
	_, err = s.Mutate("configmaps", "ns", "a", func(map[string]any) (Mutation, error) { return Mutation{Delete: true}, nil })
	require.NoError(t, err)
	put(t, s, "configmaps", "ns", "b", map[string]any{"k": "v"})
	last := s.CurrentRV()
	cancel()
	require.NoError(t, s.Close())

	s2 := openStore(t, dir, Options{})
	e, ok := s2.Get("configmaps", "ns", "b")
	require.True(t, ok)
	require.Equal(t, last, e.RV, "a stored object keeps its resourceVersion")
	_, ok = s2.Get("configmaps", "ns", "a")
	require.False(t, ok)
	c := put(t, s2, "configmaps", "ns", "c", nil)
	require.Greater(t, c.Entry.RV, last)
	require.Greater(t, c.Entry.RV, r.Entry.RV)
}

func TestTornStateFileIsAnError(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, StateDirName), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, StateDirName, stateFileName), []byte(`{"reserved`), 0o644))
	_, err := Open(context.Background(), logr.Discard(), Options{Dir: dir})
	require.ErrorContains(t, err, "parse resourceVersion state")
}

func TestInvalidFileAtStartIsSkipped(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "configmaps", "ns"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "configmaps", "ns", "bad.json"), []byte(`{`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "configmaps", "ns", "good.json"), []byte(`{"data":{}}`), 0o644))
	s := openStore(t, dir, Options{})
	list, _ := s.List("configmaps", "ns")
	require.Len(t, list, 1)
	data, err := os.ReadFile(filepath.Join(dir, "configmaps", "ns", "bad.json"))
	require.NoError(t, err)
	require.Equal(t, "{", string(data), "an invalid file is left as the user wrote it")
}

func TestWatchHistory(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{History: 3})
	base := s.CurrentRV()
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		put(t, s, "configmaps", "ns", n, nil)
	}
	cases := []struct {
		name    string
		from    uint64
		expired bool
		replay  []string
	}{
		{name: "before history", from: base, expired: true},
		{name: "just before history", from: base + 1, expired: true},
		{name: "oldest kept", from: base + 2, replay: []string{"c", "d", "e"}},
		{name: "middle", from: base + 4, replay: []string{"e"}},
		{name: "current", from: s.CurrentRV()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start, err := s.Watch("configmaps", "", tc.from, false)
			if tc.expired {
				var exp *ExpiredError
				require.ErrorAs(t, err, &exp)
				return
			}
			require.NoError(t, err)
			defer start.Watcher.Stop()
			var names []string
			for _, ev := range start.Initial {
				names = append(names, ev.Name)
			}
			require.Equal(t, tc.replay, names)
		})
	}
}

func TestSlowWatcherIsClosed(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{WatchBuffer: 2})
	start, err := s.Watch("configmaps", "", s.CurrentRV(), false)
	require.NoError(t, err)
	for _, n := range []string{"a", "b", "c"} {
		put(t, s, "configmaps", "ns", n, nil)
	}
	// Two buffered events, then the channel is closed, never silently short.
	require.Equal(t, "a", nextEvent(t, start.Watcher).Name)
	require.Equal(t, "b", nextEvent(t, start.Watcher).Name)
	_, ok := <-start.Watcher.Events()
	require.False(t, ok)
	require.True(t, start.Watcher.Overflowed())
}

func TestInitialEvents(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{})
	put(t, s, "configmaps", "one", "a", nil)
	put(t, s, "configmaps", "two", "b", nil)
	cases := []struct {
		ns   string
		want []string
	}{
		{ns: "", want: []string{"a", "b"}},
		{ns: "two", want: []string{"b"}},
	}
	for _, tc := range cases {
		start, err := s.Watch("configmaps", tc.ns, 0, true)
		require.NoError(t, err)
		var names []string
		for _, ev := range start.Initial {
			require.Equal(t, watch.Added, ev.Type)
			names = append(names, ev.Name)
		}
		require.Equal(t, tc.want, names)
		start.Watcher.Stop()
	}
}

// TestMutatePanicReleasesLock: a MutateFunc that panics (the API server
// recovers it into a 500) leaves the store usable and the object as it
// was; before, the store lock stayed held and every later request hung.
func TestMutatePanicReleasesLock(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s, err := Open(ctx, logr.Discard(), Options{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() {
		cancel()
		if !t.Failed() { // Close would wait for the lock a failure left held
			_ = s.Close()
		}
	})
	require.NoError(t, s.Register("configmaps", true))
	put(t, s, "configmaps", "default", "a", map[string]any{"k": "v"})
	require.Panics(t, func() {
		_, _ = s.Mutate("configmaps", "default", "a", func(map[string]any) (Mutation, error) {
			var m map[string]any
			m["boom"] = 1 //nolint:staticcheck // assignment to a nil map: the panic is the point
			return Mutation{}, nil
		})
	})
	done := make(chan error, 1)
	go func() {
		_, err := s.Mutate("configmaps", "default", "b", func(map[string]any) (Mutation, error) {
			return Mutation{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": map[string]any{"name": "b", "namespace": "default"}}}, nil
		})
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the store stayed locked after a panicking MutateFunc")
	}
	e, ok := s.Get("configmaps", "default", "a")
	require.True(t, ok)
	require.Equal(t, map[string]any{"k": "v"}, e.Object["data"])
}
