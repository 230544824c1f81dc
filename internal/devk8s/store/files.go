package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/fsnotify/fsnotify"
	"k8s.io/apimachinery/pkg/watch"
)

// run turns file system events into object changes until the fsnotify
// watcher is closed.
func (s *Store) run(ctx context.Context) {
	defer close(s.done)
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-s.fsw.Events:
			if !ok {
				return
			}
			s.handleFSEvent(ev)
		case err, ok := <-s.fsw.Errors:
			if !ok {
				return
			}
			s.log.Error(err, "file watch error; rescanning")
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				s.Resync()
			}
		}
	}
}

// Resync rereads every registered resource directory, producing events for
// whatever changed on disk.
func (s *Store) Resync() {
	s.mu.Lock()
	var events []Event
	for res, t := range s.tables {
		evs, err := s.scanLocked(res, t, filepath.Join(s.opts.Dir, res), false)
		if err != nil {
			s.log.Error(err, "rescan failed", "resource", res)
		}
		events = append(events, evs...)
	}
	s.mu.Unlock()
	s.notify(events)
}

func (s *Store) handleFSEvent(ev fsnotify.Event) {
	rel, err := filepath.Rel(s.opts.Dir, ev.Name)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return
	}
	parts := strings.Split(rel, string(filepath.Separator))
	for _, p := range parts {
		if strings.HasPrefix(p, ".") {
			return
		}
	}
	if len(parts) >= 2 && isObjectFile(parts[len(parts)-1]) && s.unchanged(parts, ev.Name) {
		return // our own write: nothing to do, and no lock held for the read
	}
	s.mu.Lock()
	var events []Event
	t := s.tables[parts[0]]
	res := parts[0]
	switch {
	case t == nil:
	case len(parts) == 1:
		if ev.Has(fsnotify.Create) {
			delete(s.watched, ev.Name)
			if err := s.watchDirLocked(ev.Name); err != nil {
				s.log.Error(err, "watch resource directory")
			}
			evs, err := s.scanLocked(res, t, ev.Name, false)
			if err != nil {
				s.log.Error(err, "scan resource directory", "dir", ev.Name)
			}
			events = evs
		}
		if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
			delete(s.watched, ev.Name)
		}
	case len(parts) == 2 && t.namespaced:
		if ev.Has(fsnotify.Create) {
			if info, err := s.lstat(ev.Name); err == nil && info.IsDir() {
				if err := s.checkFileName(res, parts[1], ""); err != nil {
					s.log.Info("namespace directory skipped", "path", ev.Name, "reason", err.Error())
					break
				}
				if err := s.watchDirLocked(ev.Name); err != nil {
					s.log.Error(err, "watch namespace directory")
				}
				files, err := s.jsonFiles(res, ev.Name)
				if err != nil {
					s.log.Error(err, "scan namespace directory")
				}
				for _, f := range files {
					if e, ok := s.syncFileLocked(res, t, f, nil); ok {
						events = append(events, e)
					}
				}
			}
		}
		if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
			delete(s.watched, ev.Name)
		}
	case (len(parts) == 2 && !t.namespaced) || (len(parts) == 3 && t.namespaced):
		if isObjectFile(parts[len(parts)-1]) {
			if err := s.checkPath(res, ev.Name); err != nil {
				s.log.Info("object file skipped", "path", ev.Name, "reason", err.Error())
				break
			}
			if e, ok := s.syncFileLocked(res, t, ev.Name, nil); ok {
				events = append(events, e)
			}
		}
	}
	s.mu.Unlock()
	s.notify(events)
}

// unchanged reads a file without the store lock and reports whether it
// matches the stored entry byte for byte (the common case: the event is
// for a file the store itself just wrote).
func (s *Store) unchanged(parts []string, path string) bool {
	data, err := s.readFile(path)
	if err != nil {
		return false
	}
	hash := sha256.Sum256(data)
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tables[parts[0]]
	if t == nil {
		return true
	}
	ns, name := s.splitPath(parts[0], t, path)
	cur := t.objs[key(ns, name)]
	return cur != nil && cur.hash == hash
}

func (s *Store) splitPath(res string, t *table, path string) (string, string) {
	name := strings.TrimSuffix(filepath.Base(path), ".json")
	if !t.namespaced {
		return "", name
	}
	return filepath.Base(filepath.Dir(path)), name
}

// syncFileLocked brings the index in line with one file. seen is non-nil
// during a resource's first load, when files keep their resourceVersion.
// Invalid files are logged and skipped: the last good object stays.
func (s *Store) syncFileLocked(res string, t *table, path string, seen map[uint64]bool) (Event, bool) {
	ns, name := s.splitPath(res, t, path)
	k := key(ns, name)
	cur := t.objs[k]
	if s.pendingLocked(res, k) {
		return Event{}, false // our own write is landing; its event follows
	}
	if info, err := s.lstat(path); err == nil && !info.Mode().IsRegular() {
		s.log.Info("object file skipped: not a regular file (symlinks are not followed); keeping last good object", "path", path)
		return Event{}, false
	}
	data, err := s.readFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if cur == nil {
			return Event{}, false
		}
		rv, err := s.nextRVLocked()
		if err != nil {
			s.log.Error(err, "assign resourceVersion for removed file", "path", path)
			return Event{}, false
		}
		delete(t.objs, k)
		t.sorted = nil
		last, err := newEntry(withRV(cur.Object, rv), rv)
		if err != nil {
			return Event{}, false
		}
		s.log.Info("file removed; object deleted", "path", path)
		return s.recordLocked(Event{Type: watch.Deleted, Resource: res, Namespace: ns, Name: name, RV: rv, Object: last, Old: cur}), true
	}
	if err != nil {
		s.log.Error(err, "read object file; keeping last good object", "path", path)
		return Event{}, false
	}
	hash := sha256.Sum256(data)
	if cur != nil && cur.hash == hash {
		return Event{}, false // our own write, or no change
	}
	if r, ok := t.refused[k]; ok && r.hash == hash && r.cur == cur {
		return Event{}, false // already refused
	}
	if len(bytes.TrimSpace(data)) == 0 {
		s.log.Info("empty object file skipped; keeping last good object", "path", path)
		return Event{}, false
	}
	obj, err := decodeObject(data)
	if err != nil {
		s.log.Error(err, "invalid JSON in object file skipped; keeping last good object", "path", path)
		return Event{}, false
	}
	md, ok := obj["metadata"].(map[string]any)
	if !ok {
		md = map[string]any{}
		obj["metadata"] = md
	}
	if n, _ := md["name"].(string); n != "" && n != name {
		s.log.Info("metadata.name differs from the file name; the file name wins", "path", path, "name", n)
	}
	md["name"] = name
	if t.namespaced {
		md["namespace"] = ns
	} else {
		delete(md, "namespace")
	}
	var old map[string]any
	if cur != nil {
		old = cur.Object
	}
	if s.opts.Normalize != nil {
		s.opts.Normalize(res, old, obj)
	}
	if s.opts.Admit != nil {
		if err := s.opts.Admit(res, path, old, obj); err != nil {
			s.log.Error(err, "object file fails validation; keeping last good object", "path", path)
			t.refused[k] = refusal{hash: hash, cur: cur}
			return Event{}, false
		}
		delete(t.refused, k)
	}
	var rv uint64
	if seen != nil && cur == nil {
		if v, err := strconv.ParseUint(stringField(md, "resourceVersion"), 10, 64); err == nil && v > 0 && !seen[v] {
			rv = v
			seen[v] = true
			if err := s.raiseRVLocked(v); err != nil {
				s.log.Error(err, "persist resourceVersion")
				return Event{}, false
			}
		}
	}
	if rv == 0 {
		if rv, err = s.nextRVLocked(); err != nil {
			s.log.Error(err, "assign resourceVersion", "path", path)
			return Event{}, false
		}
	}
	setRV(obj, strconv.FormatUint(rv, 10))
	ent, err := newEntry(obj, rv)
	if err != nil {
		s.log.Error(err, "encode object", "path", path)
		return Event{}, false
	}
	fileData, err := fileBytes(obj)
	if err != nil {
		return Event{}, false
	}
	if !bytes.Equal(fileData, data) {
		// Write server-managed metadata back so the file shows what clients see.
		if err := s.writeAtomic(path, "", fileData); err != nil {
			s.log.Error(err, "rewrite object file", "path", path)
		}
	}
	ent.hash = sha256.Sum256(fileData)
	if cur == nil {
		t.sorted = nil
	}
	t.objs[k] = ent
	typ := watch.Added
	if cur != nil {
		typ = watch.Modified
	}
	ev := Event{Type: typ, Resource: res, Namespace: ns, Name: name, RV: rv, Object: ent, Old: cur}
	if seen != nil {
		// Loaded at start: not a change anyone could have watched.
		return ev, true
	}
	return s.recordLocked(ev), true
}

func (s *Store) raiseRVLocked(v uint64) error {
	if v <= s.rv {
		return nil
	}
	s.rv = v - 1
	_, err := s.nextRVLocked()
	return err
}

func stringField(m map[string]any, k string) string {
	v, _ := m[k].(string)
	return v
}
