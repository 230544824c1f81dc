package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/go-logr/logr"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/dirstore"
	"github.com/nstance-dev/nstance/pkg/objstore/gcsstore"
	"github.com/nstance-dev/nstance/pkg/objstore/s3store"
)

// Options selects a store.
type Options struct {
	// Kind is "s3", "gcs" or "file".
	Kind string
	// Bucket is the S3 or GCS bucket (kinds s3 and gcs). For s3 the endpoint
	// and credentials come from the AWS SDK environment (AWS_ENDPOINT_URL,
	// AWS_ACCESS_KEY_ID, ..., AWS_S3_USE_PATH_STYLE); for gcs from
	// Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, the
	// metadata server), or the emulator STORAGE_EMULATOR_HOST names.
	Bucket string
	// Dir is the directory holding the objects (kind file).
	Dir string
	// Prefix is placed before every key.
	Prefix string
}

// Open returns the store and the key layout for o.
func Open(ctx context.Context, o Options) (objstore.Store, layout.Keys, error) {
	keys := layout.New(o.Prefix)
	if keys.Prefix != "" {
		if err := objstore.ValidatePrefix(keys.Prefix); err != nil {
			return nil, keys, fmt.Errorf("storage prefix: %w", err)
		}
	}
	switch o.Kind {
	case "s3":
		if o.Bucket == "" {
			return nil, keys, errors.New("storage: --bucket is required for s3 storage")
		}
		s, err := s3store.New(ctx, o.Bucket, "")
		if err != nil {
			return nil, keys, fmt.Errorf("storage: %w", err)
		}
		return s, keys, nil
	case "gcs":
		if o.Bucket == "" {
			return nil, keys, errors.New("storage: --bucket is required for gcs storage")
		}
		s, err := gcsstore.New(ctx, o.Bucket, "")
		if err != nil {
			return nil, keys, fmt.Errorf("storage: %w", err)
		}
		return s, keys, nil
	case "file":
		if o.Dir == "" {
			return nil, keys, errors.New("storage: --storage-dir is required for file storage")
		}
		s, err := dirstore.Open(o.Dir)
		if err != nil {
			return nil, keys, fmt.Errorf("storage: %w", err)
		}
		return s, keys, nil
	default:
		return nil, keys, fmt.Errorf("storage: kind must be s3, gcs or file, got %q", o.Kind)
	}
}

// Permanent wraps an error that retrying will not fix.
type Permanent struct{ Err error }

func (p Permanent) Error() string { return p.Err.Error() }
func (p Permanent) Unwrap() error { return p.Err }

// Backoff configures Retry.
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
}

// DefaultBackoff starts at 200ms and caps at 10s.
var DefaultBackoff = Backoff{Initial: 200 * time.Millisecond, Max: 10 * time.Second}

// Retry calls fn until it succeeds, returns a Permanent error, or ctx ends,
// sleeping with jittered exponential backoff between attempts.
func Retry(ctx context.Context, log logr.Logger, what string, b Backoff, fn func(context.Context) error) error {
	if b.Initial <= 0 {
		b = DefaultBackoff
	}
	wait := b.Initial
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		var p Permanent
		if errors.As(err, &p) {
			return p.Err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		}
		sleep := wait/2 + time.Duration(rand.Int64N(int64(wait/2)+1))
		log.Error(err, "retrying", "what", what, "attempt", attempt, "in", sleep.String())
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		case <-time.After(sleep):
		}
		wait = min(wait*2, b.Max)
	}
}

// ReplaceIfMatch replaces key with body only if its ETag is still etag
// (If-Match), and like CreateOnly survives the SDK's retry of a committed
// write: a precondition failure with exactly body stored is success.
func ReplaceIfMatch(ctx context.Context, s objstore.Store, key string, body []byte, etag string) (string, error) {
	if etag == "" {
		return "", errors.New("ReplaceIfMatch: empty etag")
	}
	newTag, err := s.Put(ctx, key, body, objstore.PutOptions{IfMatch: etag})
	if err == nil || !errors.Is(err, objstore.ErrPreconditionFailed) {
		return newTag, err
	}
	return sameContent(ctx, s, key, body, err)
}

func sameContent(ctx context.Context, s objstore.Store, key string, body []byte, conflict error) (string, error) {
	cur, gerr := s.Get(ctx, key)
	if gerr != nil {
		if errors.Is(gerr, objstore.ErrNotFound) {
			return "", conflict
		}
		return "", fmt.Errorf("conditional write of %s was refused and reading it back failed: %w", key, gerr)
	}
	if bytes.Equal(cur.Body, body) {
		return cur.ETag, nil
	}
	return "", conflict
}

// CreateOnly writes body to key only if key does not exist yet
// (If-None-Match), and survives the SDK's own retries: when a create whose
// reply was lost is retried, the retry finds the object the first attempt
// wrote and gets 412. So a precondition failure is checked against the stored
// content: the same bytes mean this write is what is stored (success, with
// the stored ETag); different bytes are a real conflict and return an error
// wrapping objstore.ErrPreconditionFailed.
func CreateOnly(ctx context.Context, s objstore.Store, key string, body []byte) (string, error) {
	etag, err := s.Put(ctx, key, body, objstore.PutOptions{IfNoneMatch: true})
	if err == nil || !errors.Is(err, objstore.ErrPreconditionFailed) {
		return etag, err
	}
	return sameContent(ctx, s, key, body, err)
}
