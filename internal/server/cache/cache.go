package cache

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/nstance-dev/nstance/pkg/objstore"
)

const schema = `
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS objects (
	kind TEXT NOT NULL,
	key TEXT NOT NULL,
	etag TEXT NOT NULL,
	last_modified INTEGER NOT NULL,
	body BLOB NOT NULL,
	PRIMARY KEY (kind, key)
);`

// Entry is one cached object.
type Entry struct {
	Kind         string
	Key          string
	ETag         string
	LastModified time.Time
	Body         []byte
}

// Source says which objects Rebuild mirrors under which kind.
type Source struct {
	Kind string
	// Prefix lists a directory of objects; Key names a single object. Set one.
	Prefix string
	Key    string
	// SkipBodies stores only key and etag (for marker objects).
	SkipBodies bool
}

// ErrNotFound reports a missing cache entry.
var ErrNotFound = errors.New("not in cache")

// Cache is an open SQLite cache.
type Cache struct {
	db   *sql.DB
	path string
	// put and del are prepared once: every record write of the leader
	// mirrors here, and parsing the statement each time cost as much as
	// running it (bench/registration profile).
	put, del *sql.Stmt
}

// Open opens (creating) the cache at path; an empty path keeps it in memory.
func Open(ctx context.Context, path string) (*Cache, error) {
	var dsn string
	if path == "" {
		// A private in-memory database per Cache: a unique name.
		dsn = fmt.Sprintf("file:nstance-%d?mode=memory&cache=shared", time.Now().UnixNano())
	} else {
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			return nil, fmt.Errorf("creating cache directory: %w", err)
		}
		dsn = "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)"
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("opening cache %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, schema); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("creating cache schema in %s: %w", path, err)
	}
	c := &Cache{db: db, path: path}
	if c.put, err = db.PrepareContext(ctx, `INSERT OR REPLACE INTO objects(kind, key, etag, last_modified, body) VALUES (?, ?, ?, ?, ?)`); err == nil {
		c.del, err = db.PrepareContext(ctx, `DELETE FROM objects WHERE kind = ? AND key = ?`)
	}
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("preparing cache statements in %s: %w", path, err)
	}
	return c, nil
}

// Close closes the database.
func (c *Cache) Close() error {
	_ = c.put.Close()
	_ = c.del.Close()
	return c.db.Close()
}

// Put inserts or replaces an entry.
func (c *Cache) Put(ctx context.Context, e Entry) error {
	_, err := c.put.ExecContext(ctx, e.Kind, e.Key, e.ETag, e.LastModified.UnixNano(), nonNil(e.Body))
	if err != nil {
		return fmt.Errorf("cache put %s/%s: %w", e.Kind, e.Key, err)
	}
	return nil
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// Get returns one entry or ErrNotFound.
func (c *Cache) Get(ctx context.Context, kind, key string) (*Entry, error) {
	e := Entry{Kind: kind, Key: key}
	var lm int64
	err := c.db.QueryRowContext(ctx, `SELECT etag, last_modified, body FROM objects WHERE kind = ? AND key = ?`, kind, key).Scan(&e.ETag, &lm, &e.Body)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%s/%s: %w", kind, key, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("cache get %s/%s: %w", kind, key, err)
	}
	e.LastModified = time.Unix(0, lm)
	return &e, nil
}

// Delete removes one entry.
func (c *Cache) Delete(ctx context.Context, kind, key string) error {
	if _, err := c.del.ExecContext(ctx, kind, key); err != nil {
		return fmt.Errorf("cache delete %s/%s: %w", kind, key, err)
	}
	return nil
}

// List returns every entry of a kind, ordered by key.
func (c *Cache) List(ctx context.Context, kind string) ([]Entry, error) {
	rows, err := c.db.QueryContext(ctx, `SELECT key, etag, last_modified, body FROM objects WHERE kind = ? ORDER BY key`, kind)
	if err != nil {
		return nil, fmt.Errorf("cache list %s: %w", kind, err)
	}
	defer rows.Close()
	var out []Entry
	for rows.Next() {
		e := Entry{Kind: kind}
		var lm int64
		if err := rows.Scan(&e.Key, &e.ETag, &lm, &e.Body); err != nil {
			return nil, fmt.Errorf("cache list %s: %w", kind, err)
		}
		e.LastModified = time.Unix(0, lm)
		out = append(out, e)
	}
	return out, rows.Err()
}

// Count returns how many entries a kind has.
func (c *Cache) Count(ctx context.Context, kind string) (int, error) {
	var n int
	err := c.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM objects WHERE kind = ?`, kind).Scan(&n)
	return n, err
}

// SyncedAt returns when Rebuild last completed (zero if never).
func (c *Cache) SyncedAt(ctx context.Context) (time.Time, error) {
	var v string
	err := c.db.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'synced_at'`).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("reading sync time: %w", err)
	}
	return time.Parse(time.RFC3339Nano, v)
}

// Wipe deletes every cached object (used by tests and on corruption).
func (c *Cache) Wipe(ctx context.Context) error {
	_, err := c.db.ExecContext(ctx, `DELETE FROM objects; DELETE FROM meta;`)
	return err
}

// Kinds of objects the server mirrors.
const (
	// KindInstance holds the shard's instance records (shard/{shard}/instances/{id}.json).
	KindInstance = "instance"
	// KindGroups holds the shard's shared dynamic groups document
	// (groups/{shard}.jsonc, read for tenants without their own).
	KindGroups = "groups"
	// KindTenantGroups holds each tenant's dynamic groups document
	// (groups/{shard}/{tenant}.jsonc).
	KindTenantGroups = "tenant-groups"
)

// ETags returns key -> etag of every entry of a kind.
func (c *Cache) ETags(ctx context.Context, kind string) (map[string]string, error) {
	rows, err := c.db.QueryContext(ctx, `SELECT key, etag FROM objects WHERE kind = ?`, kind)
	if err != nil {
		return nil, fmt.Errorf("cache etags %s: %w", kind, err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var k, e string
		if err := rows.Scan(&k, &e); err != nil {
			return nil, fmt.Errorf("cache etags %s: %w", kind, err)
		}
		out[k] = e
	}
	return out, rows.Err()
}

// Apply writes puts and removes the deletes keys of a kind in one
// transaction (one commit for a whole batch instead of one per entry).
func (c *Cache) Apply(ctx context.Context, kind string, puts []Entry, deletes []string) error {
	if len(puts) == 0 && len(deletes) == 0 {
		return nil
	}
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("cache apply %s: %w", kind, err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := applyTx(ctx, tx, kind, puts, deletes); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("cache apply %s: commit: %w", kind, err)
	}
	return nil
}

func applyTx(ctx context.Context, tx *sql.Tx, kind string, puts []Entry, deletes []string) error {
	if len(deletes) > 0 {
		del, err := tx.PrepareContext(ctx, `DELETE FROM objects WHERE kind = ? AND key = ?`)
		if err != nil {
			return fmt.Errorf("cache apply %s: %w", kind, err)
		}
		defer del.Close()
		for _, k := range deletes {
			if _, err := del.ExecContext(ctx, kind, k); err != nil {
				return fmt.Errorf("cache delete %s/%s: %w", kind, k, err)
			}
		}
	}
	if len(puts) > 0 {
		put, err := tx.PrepareContext(ctx, `INSERT OR REPLACE INTO objects(kind, key, etag, last_modified, body) VALUES (?, ?, ?, ?, ?)`)
		if err != nil {
			return fmt.Errorf("cache apply %s: %w", kind, err)
		}
		defer put.Close()
		for _, e := range puts {
			if _, err := put.ExecContext(ctx, kind, e.Key, e.ETag, e.LastModified.UnixNano(), nonNil(e.Body)); err != nil {
				return fmt.Errorf("cache put %s/%s: %w", kind, e.Key, err)
			}
		}
	}
	return nil
}

// RebuildStats counts what a Rebuild did.
type RebuildStats struct {
	// Listed objects, Fetched bodies (new or changed etag), Removed entries.
	Listed, Fetched, Removed int
}

// Rebuild makes the cached objects of each source's kind equal to what
// object storage holds now. It is incremental: a listing returns every
// object's etag, and only objects that are new or whose etag differs from
// the cached one are read; entries storage no longer has are removed. The
// changes are written in one transaction (readers never see a half-built
// cache).
func (c *Cache) Rebuild(ctx context.Context, store objstore.Store, sources []Source, now time.Time) (RebuildStats, error) {
	var st RebuildStats
	type change struct {
		puts    []Entry
		deletes []string
	}
	changes := map[string]*change{}
	for _, s := range sources {
		ch := changes[s.Kind]
		if ch == nil {
			ch = &change{}
			changes[s.Kind] = ch
		}
		have, err := c.ETags(ctx, s.Kind)
		if err != nil {
			return st, fmt.Errorf("rebuilding cache: %w", err)
		}
		if s.Key != "" {
			obj, err := store.Get(ctx, s.Key)
			if errors.Is(err, objstore.ErrNotFound) {
				if _, ok := have[s.Key]; ok {
					ch.deletes = append(ch.deletes, s.Key)
				}
				continue
			}
			if err != nil {
				return st, fmt.Errorf("rebuilding cache: reading %s: %w", s.Key, err)
			}
			st.Listed++
			st.Fetched++
			ch.puts = append(ch.puts, Entry{Kind: s.Kind, Key: s.Key, ETag: obj.ETag, LastModified: obj.LastModified, Body: obj.Body})
			continue
		}
		infos, err := store.List(ctx, s.Prefix)
		if err != nil {
			return st, fmt.Errorf("rebuilding cache: listing %s: %w", s.Prefix, err)
		}
		st.Listed += len(infos)
		listed := make(map[string]bool, len(infos))
		for _, info := range infos {
			listed[info.Key] = true
			if etag, ok := have[info.Key]; ok && etag == info.ETag && info.ETag != "" {
				continue
			}
			var body []byte
			if !s.SkipBodies {
				obj, err := store.Get(ctx, info.Key)
				if errors.Is(err, objstore.ErrNotFound) {
					listed[info.Key] = false // deleted since the listing
					continue
				}
				if err != nil {
					return st, fmt.Errorf("rebuilding cache: reading %s: %w", info.Key, err)
				}
				st.Fetched++
				info, body = obj.ObjectInfo, obj.Body
			}
			ch.puts = append(ch.puts, Entry{Kind: s.Kind, Key: info.Key, ETag: info.ETag, LastModified: info.LastModified, Body: body})
		}
		for k := range have {
			if !listed[k] {
				ch.deletes = append(ch.deletes, k)
			}
		}
	}
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return st, fmt.Errorf("rebuilding cache: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	for kind, ch := range changes {
		st.Removed += len(ch.deletes)
		if err := applyTx(ctx, tx, kind, ch.puts, ch.deletes); err != nil {
			return st, fmt.Errorf("rebuilding cache: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO meta(key, value) VALUES ('synced_at', ?)`, now.UTC().Format(time.RFC3339Nano)); err != nil {
		return st, fmt.Errorf("rebuilding cache: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return st, fmt.Errorf("rebuilding cache: commit: %w", err)
	}
	return st, nil
}

// Path is the database file ("" when in memory).
func (c *Cache) Path() string { return c.path }

// KeyBase returns the last path segment of an object key without extension,
// e.g. the instance id of shard/s/instances/i-1.json.
func KeyBase(key string) string {
	base := key[strings.LastIndex(key, "/")+1:]
	if i := strings.LastIndex(base, "."); i > 0 {
		base = base[:i]
	}
	return base
}
