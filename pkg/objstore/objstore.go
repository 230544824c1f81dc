package objstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// MaxKeyLength is the longest key, in bytes, that any backend accepts.
const MaxKeyLength = 1024

var (
	// ErrNotFound reports that the key does not exist.
	ErrNotFound = errors.New("object not found")
	// ErrPreconditionFailed reports that a conditional write did not hold:
	// the key already existed for a create-only write, or its ETag differed
	// from the one given for a replace (or it was missing).
	ErrPreconditionFailed = errors.New("precondition failed")
	// ErrInvalidKey reports a key that breaks the rules of ValidateKey or a
	// backend-specific restriction.
	ErrInvalidKey = errors.New("invalid object key")
)

// ObjectInfo describes a stored object without its body.
type ObjectInfo struct {
	Key string
	// ETag is the unquoted entity tag; for single-part writes it is the hex
	// MD5 of the body.
	ETag         string
	Size         int64
	LastModified time.Time
}

// Object is a stored object with its body.
type Object struct {
	ObjectInfo
	Body []byte
}

// PutOptions makes a Put conditional.
type PutOptions struct {
	// IfNoneMatch makes the write create-only: it fails with
	// ErrPreconditionFailed when the key already exists.
	IfNoneMatch bool
	// IfMatch, when not empty, replaces the object only if its current ETag
	// (unquoted) equals this value; otherwise ErrPreconditionFailed.
	IfMatch string
}

// Store is the object-storage interface. Keys are slash-separated paths that
// satisfy ValidateKey. Implementations are safe for concurrent use.
type Store interface {
	// Get returns the object, or ErrNotFound.
	Get(ctx context.Context, key string) (*Object, error)
	// Head returns the object's metadata, or ErrNotFound.
	Head(ctx context.Context, key string) (*ObjectInfo, error)
	// Put writes the object atomically and returns its new unquoted ETag.
	Put(ctx context.Context, key string, body []byte, opts PutOptions) (etag string, err error)
	// Delete removes the key; deleting a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// List returns every object whose key starts with prefix, recursively,
	// sorted by key.
	List(ctx context.Context, prefix string) ([]ObjectInfo, error)
}

// ValidateKey checks the rules every backend applies to keys: not empty, at
// most MaxKeyLength bytes, no leading slash, no empty segment ("//"), no ".."
// segment and no NUL byte. The returned error wraps ErrInvalidKey.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	case len(key) > MaxKeyLength:
		return fmt.Errorf("%w: key is %d bytes, longer than %d", ErrInvalidKey, len(key), MaxKeyLength)
	case strings.HasPrefix(key, "/"):
		return fmt.Errorf("%w: %q starts with a slash", ErrInvalidKey, key)
	case strings.Contains(key, "//"):
		return fmt.Errorf("%w: %q contains an empty segment", ErrInvalidKey, key)
	case strings.ContainsRune(key, 0):
		return fmt.Errorf("%w: %q contains a NUL byte", ErrInvalidKey, key)
	case !utf8.ValidString(key):
		// S3 keys are UTF-8; JSON and XML would carry another key.
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrInvalidKey, key)
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == ".." {
			return fmt.Errorf("%w: %q contains a \"..\" segment", ErrInvalidKey, key)
		}
	}
	return nil
}

// ValidatePrefix checks a List prefix. The empty prefix (everything) is
// valid; otherwise the same rules as ValidateKey apply, except that a
// trailing slash is allowed.
func ValidatePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	p := strings.TrimSuffix(prefix, "/")
	if p == "" || strings.HasSuffix(p, "/") {
		return fmt.Errorf("%w: prefix %q", ErrInvalidKey, prefix)
	}
	return ValidateKey(p)
}
