package storage

import (
	"context"
	"errors"
	"fmt"

	"github.com/nstance-dev/nstance/pkg/objstore"
)

// ErrNoConditionalWrites is returned by ProbeConditionalWrites for a store
// that ignores If-None-Match or If-Match: elections, nonces and create-only
// records would then be silently unsafe.
var ErrNoConditionalWrites = errors.New("the store does not honour conditional writes (If-None-Match / If-Match); elections and single-use nonces would be unsafe")

// ProbeConditionalWrites checks, on a scratch key, that the store refuses a
// create-only write over an existing object and a replace with a stale
// ETag, and accepts the matching ones. The key is deleted afterwards.
func ProbeConditionalWrites(ctx context.Context, s objstore.Store, key string) (err error) {
	defer func() {
		if derr := s.Delete(context.WithoutCancel(ctx), key); derr != nil && err == nil {
			err = fmt.Errorf("probe %s: removing the probe object: %w", key, derr)
		}
	}()
	fail := func(what string, got error) error {
		if got == nil {
			return fmt.Errorf("%w: %s was accepted (probe %s)", ErrNoConditionalWrites, what, key)
		}
		if ctx.Err() != nil {
			// Stopped mid-probe: the store said nothing about conditions.
			return fmt.Errorf("probe %s: %s: %w", key, what, ctx.Err())
		}
		return fmt.Errorf("%w: %s failed with %v instead of a precondition failure (probe %s)", ErrNoConditionalWrites, what, got, key)
	}
	first, err := s.Put(ctx, key, []byte(`{"probe":1}`), objstore.PutOptions{IfNoneMatch: true})
	if err != nil {
		return fmt.Errorf("probe %s: create-only write: %w", key, err)
	}
	if _, err := s.Put(ctx, key, []byte(`{"probe":2}`), objstore.PutOptions{IfNoneMatch: true}); !errors.Is(err, objstore.ErrPreconditionFailed) {
		return fail("a create-only write over an existing object", err)
	}
	second, err := s.Put(ctx, key, []byte(`{"probe":3}`), objstore.PutOptions{IfMatch: first})
	if err != nil {
		return fmt.Errorf("probe %s: replace with the current ETag: %w", key, err)
	}
	if _, err := s.Put(ctx, key, []byte(`{"probe":4}`), objstore.PutOptions{IfMatch: first}); !errors.Is(err, objstore.ErrPreconditionFailed) {
		return fail("a replace with a stale ETag", err)
	}
	obj, err := s.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("probe %s: read back: %w", key, err)
	}
	if obj.ETag != second || string(obj.Body) != `{"probe":3}` {
		return fmt.Errorf("%w: the object changed behind refused writes (probe %s)", ErrNoConditionalWrites, key)
	}
	return nil
}
