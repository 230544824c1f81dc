package agentapi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// Fetched is the content of a secret or storage file as read from its source.
type Fetched struct {
	Content []byte
	// Stale, when set, says why Content is the last value read rather than
	// a fresh one: reading the source again failed, and the value is still
	// younger than shard.file_sources.max_stale.
	Stale error
}

// Defaults of FileSources.
const (
	// DefaultSourceRetry is how long a failed read is answered from the
	// failure (or the stale value) before the source is asked again.
	DefaultSourceRetry = 10 * time.Second
	// DefaultSourceReadTimeout bounds one read of a source.
	DefaultSourceReadTimeout = 10 * time.Second
)

// FileSources reads the contents of template files of kind secret (the
// cluster's encrypted store, AWS Secrets Manager or SSM Parameter Store)
// and storage (an object in the cluster's bucket). Every value is cached
// per source for shard.file_sources.cache_ttl, so planning a thousand
// instances costs one read; a source that fails after a good read keeps
// serving that value, marked stale, until it is max_stale old. Concurrent
// reads of one source wait for a single call.
type FileSources struct {
	// Secrets is the cluster's encrypted store (source cluster).
	Secrets *secrets.Store
	// Objects is the cluster's bucket (kind storage); Keys places both
	// file secrets and objects below the storage prefix.
	Objects objstore.Store
	Keys    layout.Keys
	// Remote reads AWS Secrets Manager and SSM values; nil refuses those sources.
	Remote secrets.Remote
	// Settings returns the live shard.file_sources (defaults when nil).
	Settings func() config.FileSources
	// MaxBytes refuses a single value larger than it
	// (shard.limits.max_file_bytes; config.DefaultMaxFileBytes when 0).
	MaxBytes int
	// Retry is how long a failure is remembered before the source is read
	// again (DefaultSourceRetry, at most cache_ttl); ReadTimeout bounds one
	// read (DefaultSourceReadTimeout).
	Retry, ReadTimeout time.Duration
	Now                func() time.Time
	Log                logr.Logger

	mu      sync.Mutex
	entries map[string]*sourceEntry
	pruned  time.Time
}

type sourceEntry struct {
	used time.Time // guarded by FileSources.mu

	mu       sync.Mutex // held while reading the source
	ok       bool
	value    []byte
	etag     string
	readAt   time.Time
	err      error
	failedAt time.Time
}

// Secret reads the value of a secret file from the source it names.
func (s *FileSources) Secret(ctx context.Context, f config.TemplateFile) (Fetched, error) {
	switch src := f.SecretSource(); src {
	case config.FileSourceCluster:
		if s.Secrets == nil {
			return Fetched{}, errors.New("the cluster's secret store is not available on this server")
		}
		if err := layout.ValidateID("secret name", f.Secret); err != nil {
			return Fetched{}, err
		}
		key := s.Keys.FileSecret(f.Secret)
		return s.get(ctx, "cluster\x00"+key, func(ctx context.Context, _ string) ([]byte, string, bool, error) {
			v, err := s.Secrets.Get(ctx, key)
			if errors.Is(err, objstore.ErrNotFound) {
				return nil, "", false, fmt.Errorf("file secret %q does not exist (%s; create it with nstance-admin cluster secret put %s)", f.Secret, key, f.Secret)
			}
			if err != nil {
				return nil, "", false, fmt.Errorf("file secret %q: %w", f.Secret, err)
			}
			return v, "", false, s.checkSize("file secret "+f.Secret, len(v))
		})
	case config.FileSourceAWSSecretsManager, config.FileSourceAWSSSM, config.FileSourceGCPSecretManager:
		if s.Remote == nil {
			return Fetched{}, fmt.Errorf("source %s is not available on this server", src)
		}
		rs := secrets.Source{Provider: src, SecretID: f.SecretID, VersionStage: f.VersionStage, VersionID: f.VersionID,
			Parameter: f.Parameter, Region: f.Region}
		id := fmt.Sprintf("%s\x00%s\x00%s\x00%s\x00%s\x00%s", src, f.Region, f.SecretID, f.VersionStage, f.VersionID, f.Parameter)
		return s.get(ctx, id, func(ctx context.Context, _ string) ([]byte, string, bool, error) {
			v, err := s.Remote.Fetch(ctx, rs)
			if err != nil {
				return nil, "", false, err
			}
			return v, "", false, s.checkSize(src+" value", len(v))
		})
	default:
		return Fetched{}, fmt.Errorf("unknown secret source %q", f.Source)
	}
}

// Object reads the object a storage file names (key below the storage
// prefix). Keys under Nstance's own state are refused here too, whatever
// the config check let through. A cached object whose ETag is unchanged is
// not downloaded again.
func (s *FileSources) Object(ctx context.Context, key string) (Fetched, error) {
	if s.Objects == nil {
		return Fetched{}, errors.New("object storage is not available on this server")
	}
	if err := layout.CheckTemplateObject(key); err != nil {
		return Fetched{}, err
	}
	full := s.Keys.Object(key)
	if err := objstore.ValidateKey(full); err != nil {
		return Fetched{}, err
	}
	return s.get(ctx, "object\x00"+full, func(ctx context.Context, etag string) ([]byte, string, bool, error) {
		info, err := s.Objects.Head(ctx, full)
		if errors.Is(err, objstore.ErrNotFound) {
			return nil, "", false, fmt.Errorf("object %q does not exist", key)
		}
		if err != nil {
			return nil, "", false, fmt.Errorf("reading object %q: %w", key, err)
		}
		if err := s.checkSize(fmt.Sprintf("object %q", key), int(min(info.Size, 1<<40))); err != nil {
			return nil, "", false, err
		}
		if etag != "" && info.ETag == etag {
			return nil, etag, true, nil
		}
		obj, err := s.Objects.Get(ctx, full)
		if errors.Is(err, objstore.ErrNotFound) {
			return nil, "", false, fmt.Errorf("object %q does not exist", key)
		}
		if err != nil {
			return nil, "", false, fmt.Errorf("reading object %q: %w", key, err)
		}
		return obj.Body, obj.ETag, false, s.checkSize(fmt.Sprintf("object %q", key), len(obj.Body))
	})
}

func (s *FileSources) checkSize(what string, n int) error {
	limit := s.MaxBytes
	if limit <= 0 {
		limit = config.DefaultMaxFileBytes
	}
	if n > limit {
		return fmt.Errorf("%s is %d bytes, more than shard.limits.max_file_bytes (%d)", what, n, limit)
	}
	return nil
}

func (s *FileSources) settings() config.FileSources {
	var fs config.FileSources
	if s.Settings != nil {
		fs = s.Settings()
	}
	if fs.CacheTTL <= 0 {
		fs.CacheTTL = config.Duration(config.DefaultFileCacheTTL)
	}
	if fs.MaxStale < fs.CacheTTL {
		fs.MaxStale = max(fs.CacheTTL, config.Duration(config.DefaultFileMaxStale))
	}
	return fs
}

func (s *FileSources) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// entry returns the cache entry of a source, dropping entries nobody asked
// for in twice max_stale (sources removed from the config).
func (s *FileSources) entry(id string, now time.Time, set config.FileSources) *sourceEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.entries == nil {
		s.entries = map[string]*sourceEntry{}
	}
	if idle := 2 * set.MaxStale.D(); now.Sub(s.pruned) > set.CacheTTL.D() {
		s.pruned = now
		for k, e := range s.entries {
			if now.Sub(e.used) > idle {
				delete(s.entries, k)
			}
		}
	}
	e, ok := s.entries[id]
	if !ok {
		e = &sourceEntry{}
		s.entries[id] = e
	}
	e.used = now
	return e
}

// readFunc reads a source. etag is the cached value's ETag ("" when none);
// unchanged reports that the cached value is still current.
type readFunc func(ctx context.Context, etag string) (value []byte, newETag string, unchanged bool, err error)

func (s *FileSources) get(ctx context.Context, id string, read readFunc) (Fetched, error) {
	set := s.settings()
	e := s.entry(id, s.now(), set)
	e.mu.Lock()
	defer e.mu.Unlock()
	now := s.now()
	if e.ok && now.Sub(e.readAt) < set.CacheTTL.D() {
		return Fetched{Content: e.value}, nil
	}
	retry := s.Retry
	if retry <= 0 {
		retry = DefaultSourceRetry
	}
	retry = min(retry, set.CacheTTL.D())
	if e.err == nil || now.Sub(e.failedAt) >= retry {
		timeout := s.ReadTimeout
		if timeout <= 0 {
			timeout = DefaultSourceReadTimeout
		}
		rctx, cancel := context.WithTimeout(ctx, timeout)
		v, tag, unchanged, err := read(rctx, e.etag)
		cancel()
		switch {
		case err == nil:
			if e.err != nil && e.ok {
				s.Log.Info("file source readable again", "source", sourceName(id))
			}
			if !unchanged {
				e.value, e.etag = v, tag
			}
			e.ok, e.readAt, e.err = true, now, nil
			return Fetched{Content: e.value}, nil
		case ctx.Err() != nil:
			// The caller went away: say nothing about the source.
			return Fetched{}, err
		}
		if e.ok && (e.err == nil || e.err.Error() != err.Error()) {
			s.Log.Error(err, "reading a file source again failed; the last value is served until max_stale", "source", sourceName(id),
				"read_at", e.readAt, "max_stale", set.MaxStale.D())
		}
		e.err, e.failedAt = err, now
	}
	if e.ok && now.Sub(e.readAt) < set.MaxStale.D() {
		return Fetched{Content: e.value, Stale: fmt.Errorf("reading it again failed, delivering the value read at %s (until it is %s old): %w",
			e.readAt.UTC().Format(time.RFC3339), set.MaxStale.D(), e.err)}, nil
	}
	if e.ok {
		return Fetched{}, fmt.Errorf("the value read at %s is older than shard.file_sources.max_stale (%s) and reading it again fails: %w",
			e.readAt.UTC().Format(time.RFC3339), set.MaxStale.D(), e.err)
	}
	return Fetched{}, e.err
}

// sourceName is a cache id for logs (the kind and the name, no value).
func sourceName(id string) string {
	out := []byte(id)
	for i, b := range out {
		if b == 0 {
			out[i] = ' '
		}
	}
	return string(out)
}
