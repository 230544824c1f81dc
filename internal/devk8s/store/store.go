package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/watch"
)

const (
	// StateDirName is the hidden directory under the data directory that
	// holds dev-k8s's own state (never served as objects).
	StateDirName   = ".dev-k8s"
	stateFileName  = "state.json"
	rvReserveBlock = 1000
	// DefaultHistory is the number of recent events kept for watches that
	// start from a resourceVersion.
	DefaultHistory = 10000
	// DefaultWatchBuffer is the number of events a watcher may fall behind
	// before it is closed.
	DefaultWatchBuffer = 1000
)

// Entry is one stored object. Entries are immutable once stored: callers must
// not modify Object or JSON.
type Entry struct {
	Object map[string]any
	// JSON is the compact encoding of Object.
	JSON []byte
	RV   uint64
	hash [32]byte
}

// Event is a committed change.
type Event struct {
	Type      watch.EventType
	Resource  string
	Namespace string
	Name      string
	RV        uint64
	// Object is the new state, or the last state for DELETED.
	Object *Entry
	// Old is the previous state (nil for ADDED).
	Old *Entry
}

// Normalizer fills server-managed fields of an object that arrived through a
// hand-edited file. old is the previous stored object or nil.
type Normalizer func(resource string, old, obj map[string]any)

// Options configure a Store.
type Options struct {
	Dir         string
	History     int
	WatchBuffer int
	// Normalize is applied to hand-edited objects before they are stored.
	Normalize Normalizer
	// Admit validates (and may complete) a hand-edited object after
	// Normalize; path is the file. A file it refuses is logged and skipped:
	// the last good object stays served. Called with the store locked.
	Admit func(resource, path string, old, obj map[string]any) error
	// OnChange is called after each committed change, outside the lock.
	OnChange func(Event)
	// ValidName checks the namespace and name of a hand-made file (taken
	// from its path) against the kind's naming rules; files that fail are
	// logged and skipped. Nil accepts every safe file name.
	ValidName func(resource, namespace, name string) error
}

type table struct {
	namespaced bool
	objs       map[string]*Entry
	sorted     []string
	// lowWater is the RV when the resource was registered: watches cannot
	// start earlier, like a fresh kube-apiserver watch cache.
	lowWater uint64
	// refused holds, per object, the content Admit last refused and the
	// object it was refused against, so the same edit (which often brings
	// several file events) is refused, logged and reported once.
	refused map[string]refusal
}

type refusal struct {
	hash [32]byte
	cur  *Entry
}

// Store is the object index plus its file mirror.
type Store struct {
	log  logr.Logger
	opts Options

	mu       sync.Mutex
	rv       uint64
	reserved uint64
	tables   map[string]*table
	history  []Event
	histNext int
	histFull bool
	// lowWater is the newest resourceVersion not in history: a watch may
	// start from any RV >= lowWater.
	lowWater uint64
	watchers map[*Watcher]struct{}
	watched  map[string]bool
	// pending counts in-flight file writes per resource/key; fsnotify
	// events for such files are ignored until the last write lands.
	pending  map[string]int
	keyLocks map[string]*keyLock
	stopping bool

	fsw  *fsnotify.Watcher
	done chan struct{}
	// root confines every file operation to the data directory.
	root *os.Root
}

// ErrNotRegistered is returned for a resource that Register has not seen.
var ErrNotRegistered = errors.New("resource not registered")

// Open loads the resourceVersion state and starts watching the directory.
// Resources are loaded by Register.
func Open(ctx context.Context, log logr.Logger, opts Options) (*Store, error) {
	if opts.History <= 0 {
		opts.History = DefaultHistory
	}
	if opts.WatchBuffer <= 0 {
		opts.WatchBuffer = DefaultWatchBuffer
	}
	abs, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("data directory %q: %w", opts.Dir, err)
	}
	opts.Dir = abs
	if err := os.MkdirAll(filepath.Join(opts.Dir, StateDirName, "tmp"), dirMode); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	root, err := os.OpenRoot(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("open data directory: %w", err)
	}
	n, err := tightenModes(root)
	if err != nil {
		_ = root.Close()
		return nil, fmt.Errorf("data directory %s: %w", opts.Dir, err)
	}
	if n > 0 {
		log.Info("removed group and other permissions in the data directory (objects, Secrets included, are the owner's only)", "dir", opts.Dir, "changed", n)
	}
	s := &Store{
		log:      log,
		opts:     opts,
		tables:   map[string]*table{},
		history:  make([]Event, opts.History),
		watchers: map[*Watcher]struct{}{},
		watched:  map[string]bool{},
		pending:  map[string]int{},
		keyLocks: map[string]*keyLock{},
		done:     make(chan struct{}),
		root:     root,
	}
	if err := s.loadState(); err != nil {
		_ = root.Close()
		return nil, err
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		_ = root.Close()
		return nil, fmt.Errorf("start fsnotify: %w", err)
	}
	s.fsw = fsw
	if err := s.watchDirLocked(opts.Dir); err != nil {
		_ = fsw.Close()
		_ = root.Close()
		return nil, err
	}
	go s.run(ctx)
	return s, nil
}

// Close stops watching files and ends every watch.
func (s *Store) Close() error {
	err := s.fsw.Close()
	<-s.done
	s.mu.Lock()
	for w := range s.watchers {
		s.closeWatcherLocked(w, false)
	}
	s.mu.Unlock()
	return errors.Join(err, s.root.Close())
}

// StopWatches ends every watch and refuses new ones: used when the server
// shuts down so that watch requests finish promptly.
func (s *Store) StopWatches() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopping = true
	for w := range s.watchers {
		s.closeWatcherLocked(w, false)
	}
}

// Dir returns the data directory.
func (s *Store) Dir() string { return s.opts.Dir }

type state struct {
	ReservedResourceVersion uint64 `json:"reservedResourceVersion"`
}

func (s *Store) tmpDir() string {
	return filepath.Join(s.opts.Dir, StateDirName, "tmp")
}

func (s *Store) statePath() string {
	return filepath.Join(s.opts.Dir, StateDirName, stateFileName)
}

func (s *Store) loadState() error {
	data, err := s.readFile(s.statePath())
	if errors.Is(err, os.ErrNotExist) {
		s.rv = 1
		s.lowWater = s.rv
		return nil
	}
	if err != nil {
		return fmt.Errorf("read resourceVersion state: %w", err)
	}
	var st state
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("parse resourceVersion state %s: %w", s.statePath(), err)
	}
	// Every RV up to the reservation may have been handed out already.
	s.rv = st.ReservedResourceVersion
	s.reserved = st.ReservedResourceVersion
	s.lowWater = s.rv
	return nil
}

// nextRVLocked hands out the next resourceVersion, persisting a new
// reservation block when the current one runs out.
func (s *Store) nextRVLocked() (uint64, error) {
	next := s.rv + 1
	if next > s.reserved {
		reserved := next + rvReserveBlock
		data, _ := json.Marshal(state{ReservedResourceVersion: reserved})
		if err := s.writeAtomic(s.statePath(), "", data); err != nil {
			return 0, fmt.Errorf("persist resourceVersion: %w", err)
		}
		s.reserved = reserved
	}
	s.rv = next
	return next, nil
}

// CurrentRV returns the newest resourceVersion handed out.
func (s *Store) CurrentRV() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rv
}

func key(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

func (s *Store) path(res string, namespaced bool, ns, name string) string {
	if namespaced {
		return filepath.Join(s.opts.Dir, res, ns, name+".json")
	}
	return filepath.Join(s.opts.Dir, res, name+".json")
}

// Register loads a resource's files and watches its directory. Registering
// an already registered resource is a no-op.
func (s *Store) Register(res string, namespaced bool) error {
	s.mu.Lock()
	if _, ok := s.tables[res]; ok {
		s.mu.Unlock()
		return nil
	}
	t := &table{namespaced: namespaced, objs: map[string]*Entry{}, refused: map[string]refusal{}}
	s.tables[res] = t
	root := filepath.Join(s.opts.Dir, res)
	err := s.watchDirLocked(root)
	var events []Event
	if err == nil {
		events, err = s.scanLocked(res, t, root, true)
	}
	t.lowWater = s.rv
	s.mu.Unlock()
	s.notify(events)
	return err
}

// Registered reports whether Register has loaded a resource: until then
// the resource has no objects to serve and takes no writes.
func (s *Store) Registered(res string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.tables[res]
	return ok
}

// scanLocked loads every file of a resource directory.
func (s *Store) scanLocked(res string, t *table, root string, initial bool) ([]Event, error) {
	var events []Event
	var files []string
	if t.namespaced {
		nsDirs, err := s.readDir(root)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", root, err)
		}
		for _, d := range nsDirs {
			if strings.HasPrefix(d.Name(), ".") {
				continue
			}
			dir := filepath.Join(root, d.Name())
			if !d.IsDir() {
				if d.Type()&fs.ModeSymlink != 0 {
					s.log.Info("symlink in a resource directory skipped: namespaces are real directories", "path", dir)
				}
				continue
			}
			if err := s.checkFileName(res, d.Name(), ""); err != nil {
				s.log.Info("namespace directory skipped", "path", dir, "reason", err.Error())
				continue
			}
			if err := s.watchDirLocked(dir); err != nil {
				return nil, err
			}
			found, err := s.jsonFiles(res, dir)
			if err != nil {
				return nil, err
			}
			files = append(files, found...)
		}
	} else {
		found, err := s.jsonFiles(res, root)
		if err != nil {
			return nil, err
		}
		files = found
	}
	// At start, files keep their resourceVersion; the counter moves past
	// the highest one so new RVs stay unique.
	var seen map[uint64]bool
	if initial {
		seen = map[uint64]bool{}
	}
	for _, f := range files {
		if ev, ok := s.syncFileLocked(res, t, f, seen); ok {
			events = append(events, ev)
		}
	}
	if !initial {
		// Objects whose files disappeared while unwatched are deleted.
		present := map[string]bool{}
		for _, f := range files {
			ns, name := s.splitPath(res, t, f)
			present[key(ns, name)] = true
		}
		for k, e := range t.objs {
			if present[k] {
				continue
			}
			ns, name := entryKey(e)
			if ev, ok := s.syncFileLocked(res, t, s.path(res, t.namespaced, ns, name), nil); ok {
				events = append(events, ev)
			}
		}
	}
	return events, nil
}

// jsonFiles lists the object files of a directory: regular files named
// <name>.json whose name is valid for the resource (others are logged).
func (s *Store) jsonFiles(res, dir string) ([]string, error) {
	ents, err := s.readDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	var out []string
	for _, e := range ents {
		if !isObjectFile(e.Name()) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if !e.Type().IsRegular() {
			s.log.Info("object file skipped: not a regular file (symlinks are not followed)", "path", p)
			continue
		}
		if err := s.checkPath(res, p); err != nil {
			s.log.Info("object file skipped", "path", p, "reason", err.Error())
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// checkPath applies checkFileName to the namespace and name of a file.
func (s *Store) checkPath(res, p string) error {
	t := s.tables[res]
	if t == nil {
		return ErrNotRegistered
	}
	ns, name := s.splitPath(res, t, p)
	return s.checkFileName(res, ns, name)
}

// checkFileName validates a namespace (when set) and a name (when set)
// taken from file names: safe path segments, then the kind's rules.
func (s *Store) checkFileName(res, ns, name string) error {
	for _, seg := range []string{ns, name} {
		if seg == "" {
			continue
		}
		if err := CheckSegment(seg); err != nil {
			return err
		}
	}
	if s.opts.ValidName != nil {
		return s.opts.ValidName(res, ns, name)
	}
	return nil
}

func isObjectFile(name string) bool {
	return !strings.HasPrefix(name, ".") && strings.HasSuffix(name, ".json") && len(name) > len(".json")
}

func (s *Store) watchDirLocked(dir string) error {
	if s.watched[dir] {
		return nil
	}
	if err := s.mkdirAll(dir); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	if dir != s.opts.Dir {
		// fsnotify follows symlinks; the root does not let one escape,
		// and a symlink is never watched as a directory of objects.
		info, err := s.lstat(dir)
		if err != nil {
			return fmt.Errorf("watch %s: %w", dir, err)
		}
		if !info.IsDir() {
			return fmt.Errorf("watch %s: not a directory (symlinks are not followed)", dir)
		}
	}
	if err := s.fsw.Add(dir); err != nil {
		return fmt.Errorf("watch %s: %w", dir, err)
	}
	s.watched[dir] = true
	return nil
}

// Get returns the stored entry.
func (s *Store) Get(res, ns, name string) (*Entry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tables[res]
	if t == nil {
		return nil, false
	}
	e, ok := t.objs[key(ns, name)]
	return e, ok
}

// List returns the entries of a resource (one namespace, or all when ns is
// empty) sorted by namespace and name, starting after the key `after`, and
// the resourceVersion the list is consistent with.
func (s *Store) List(res, ns string) ([]*Entry, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tables[res]
	if t == nil {
		return nil, s.rv
	}
	if t.sorted == nil {
		t.sorted = make([]string, 0, len(t.objs))
		for k := range t.objs {
			t.sorted = append(t.sorted, k)
		}
		sort.Strings(t.sorted)
	}
	keys := t.sorted
	if ns != "" && t.namespaced {
		prefix := ns + "/"
		lo := sort.SearchStrings(keys, prefix)
		hi := lo
		for hi < len(keys) && strings.HasPrefix(keys[hi], prefix) {
			hi++
		}
		keys = keys[lo:hi]
	}
	out := make([]*Entry, len(keys))
	for i, k := range keys {
		out[i] = t.objs[k]
	}
	return out, s.rv
}

// Mutation is returned by a MutateFunc: the object to store, or Delete.
type Mutation struct {
	Object map[string]any
	Delete bool
	// DryRun computes the result without storing it.
	DryRun bool
}

// MutateFunc computes the next state from a deep copy of the current object
// (nil when absent). Returning an error aborts with that error.
type MutateFunc func(cur map[string]any) (Mutation, error)

// Result reports what a mutation did.
type Result struct {
	Entry *Entry // stored entry, or the last state for a delete
	Type  watch.EventType
	// Noop is true when the new object equals the stored one.
	Noop bool
}

// Mutate applies fn atomically to one object, assigns a resourceVersion,
// writes or removes the file and emits the watch event. A panic in fn
// propagates to the caller with the store unlocked.
func (s *Store) Mutate(res, ns, name string, fn MutateFunc) (Result, error) {
	ev, out, op, err := s.mutateLocked(res, ns, name, fn)
	if err == nil && op != nil {
		err = s.applyFileOp(op)
	}
	if ev != nil {
		s.notify([]Event{*ev})
	}
	return out, err
}

// mutateLocked is Mutate's decision, taken under the store lock (released
// by defer, so that a panicking fn cannot leave it held).
func (s *Store) mutateLocked(res, ns, name string, fn MutateFunc) (*Event, Result, *fileOp, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tables[res]
	if t == nil {
		return nil, Result{}, nil, fmt.Errorf("%s: %w", res, ErrNotRegistered)
	}
	k := key(ns, name)
	cur := t.objs[k]
	var in map[string]any
	if cur != nil {
		in = runtime.DeepCopyJSON(cur.Object)
	}
	m, err := fn(in)
	if err == nil && cur == nil && m.Object != nil && !m.Delete {
		// Only a new object creates a file; no stored one can have a bad name.
		err = checkSegments(ns, name)
	}
	if err != nil {
		return nil, Result{}, nil, err
	}
	return s.commitLocked(res, t, ns, name, cur, m)
}

// fileOp is a file write or removal decided under the store lock and
// carried out after it, so writes of different objects overlap.
type fileOp struct {
	pending string
	t       *table
	k       string
	path    string
	// ent is the entry the file must show; nil removes the file.
	ent  *Entry
	data []byte
}

type keyLock struct {
	mu   sync.Mutex
	refs int
}

// applyFileOp writes (or removes) one object's file. Writes of the same
// object are serialised, and one that a newer change overtook is skipped:
// the newer change writes the file itself.
func (s *Store) applyFileOp(op *fileOp) error {
	s.mu.Lock()
	kl := s.keyLocks[op.pending]
	if kl == nil {
		kl = &keyLock{}
		s.keyLocks[op.pending] = kl
	}
	kl.refs++
	s.mu.Unlock()

	kl.mu.Lock()
	s.mu.Lock()
	latest := op.t.objs[op.k] == op.ent
	s.mu.Unlock()
	var err error
	if latest {
		if op.ent == nil {
			if rerr := s.remove(op.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
				err = fmt.Errorf("remove %s: %w", op.path, rerr)
			}
		} else {
			err = s.writeAtomic(op.path, s.tmpDir(), op.data)
		}
	}
	kl.mu.Unlock()

	s.mu.Lock()
	if kl.refs--; kl.refs == 0 {
		delete(s.keyLocks, op.pending)
	}
	if s.pending[op.pending]--; s.pending[op.pending] <= 0 {
		delete(s.pending, op.pending)
	}
	s.mu.Unlock()
	if err != nil {
		s.log.Error(err, "object file out of date with the served object")
	}
	return err
}

// pendingLocked reports whether a file write for the object is in flight.
func (s *Store) pendingLocked(res, k string) bool {
	return s.pending[res+"/"+k] > 0
}

func (s *Store) commitLocked(res string, t *table, ns, name string, cur *Entry, m Mutation) (*Event, Result, *fileOp, error) {
	ev, result, op, err := s.commitIndexLocked(res, t, ns, name, cur, m)
	if op != nil {
		op.pending = res + "/" + op.k
		op.t = t
		s.pending[op.pending]++
	}
	return ev, result, op, err
}

// commitIndexLocked updates the index and history; the file change it
// returns is applied after the lock is released.
func (s *Store) commitIndexLocked(res string, t *table, ns, name string, cur *Entry, m Mutation) (*Event, Result, *fileOp, error) {
	k := key(ns, name)
	p := s.path(res, t.namespaced, ns, name)
	if m.DryRun {
		if m.Delete {
			if cur == nil {
				return nil, Result{}, nil, nil
			}
			return nil, Result{Entry: cur, Type: watch.Deleted}, nil, nil
		}
		if cur != nil {
			setRV(m.Object, strconv.FormatUint(cur.RV, 10))
		}
		ent, err := newEntry(m.Object, 0)
		return nil, Result{Entry: ent, Type: watch.Modified, Noop: true}, nil, err
	}
	if m.Delete {
		if cur == nil {
			return nil, Result{}, nil, nil
		}
		rv, err := s.nextRVLocked()
		if err != nil {
			return nil, Result{}, nil, err
		}
		delete(t.objs, k)
		t.sorted = nil
		// The DELETED event carries the object at the deletion's RV, as
		// kube-apiserver does: the final state when the deletion came from
		// an update (the last finalizer removed), else the stored one.
		final := cur.Object
		if m.Object != nil {
			final = m.Object
		}
		last := withRV(final, rv)
		ent, err := newEntry(last, rv)
		if err != nil {
			return nil, Result{}, nil, err
		}
		ev := s.recordLocked(Event{Type: watch.Deleted, Resource: res, Namespace: ns, Name: name, RV: rv, Object: ent, Old: cur})
		return &ev, Result{Entry: ent, Type: watch.Deleted}, &fileOp{k: k, path: p}, nil
	}
	if cur != nil {
		setRV(m.Object, strconv.FormatUint(cur.RV, 10))
		data, err := json.Marshal(m.Object)
		if err != nil {
			return nil, Result{}, nil, fmt.Errorf("encode object: %w", err)
		}
		if bytes.Equal(data, cur.JSON) {
			return nil, Result{Entry: cur, Type: watch.Modified, Noop: true}, nil, nil
		}
	}
	rv, err := s.nextRVLocked()
	if err != nil {
		return nil, Result{}, nil, err
	}
	setRV(m.Object, strconv.FormatUint(rv, 10))
	ent, err := newEntry(m.Object, rv)
	if err != nil {
		return nil, Result{}, nil, err
	}
	if t.namespaced {
		if err := s.watchDirLocked(filepath.Dir(p)); err != nil {
			return nil, Result{}, nil, err
		}
	}
	fileData, err := fileBytes(ent.Object)
	if err != nil {
		return nil, Result{}, nil, err
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
	ev := s.recordLocked(Event{Type: typ, Resource: res, Namespace: ns, Name: name, RV: rv, Object: ent, Old: cur})
	return &ev, Result{Entry: ent, Type: typ}, &fileOp{k: k, path: p, ent: ent, data: fileData}, nil
}

func newEntry(obj map[string]any, rv uint64) (*Entry, error) {
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encode object: %w", err)
	}
	return &Entry{Object: obj, JSON: data, RV: rv}, nil
}

// fileBytes is the on-disk form: indented for people who edit the files.
func fileBytes(obj map[string]any) ([]byte, error) {
	data, err := json.MarshalIndent(obj, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode object: %w", err)
	}
	return append(data, '\n'), nil
}

func withRV(obj map[string]any, rv uint64) map[string]any {
	out := runtime.DeepCopyJSON(obj)
	setRV(out, strconv.FormatUint(rv, 10))
	return out
}

func setRV(obj map[string]any, rv string) {
	md, ok := obj["metadata"].(map[string]any)
	if !ok {
		md = map[string]any{}
		obj["metadata"] = md
	}
	md["resourceVersion"] = rv
}

// decodeObject parses a JSON object into the number types unstructured
// objects use.
func decodeObject(data []byte) (map[string]any, error) {
	var obj map[string]any
	if err := utiljson.Unmarshal(data, &obj); err != nil {
		return nil, err
	}
	if obj == nil {
		return nil, errors.New("not a JSON object")
	}
	return obj, nil
}

func (s *Store) notify(events []Event) {
	if s.opts.OnChange == nil {
		return
	}
	for _, ev := range events {
		s.opts.OnChange(ev)
	}
}
