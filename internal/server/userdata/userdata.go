package userdata

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// Formats of bootstrap data, as Cluster API bootstrap secrets name them.
const (
	FormatCloudConfig = "cloud-config"
	FormatIgnition    = "ignition"
)

// Sum is the hex SHA-256 of data.
func Sum(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

// CheckFormat normalizes a format ("" means cloud-config).
func CheckFormat(f string) (string, error) {
	switch f {
	case "", FormatCloudConfig:
		return FormatCloudConfig, nil
	case FormatIgnition:
		return FormatIgnition, nil
	}
	return "", fmt.Errorf("user_data_format: must be %q or %q, got %q", FormatCloudConfig, FormatIgnition, f)
}

// CheckSize refuses data above limit (shard.limits.max_user_data_bytes),
// naming what it belongs to.
func CheckSize(what string, data []byte, limit int) error {
	if limit > 0 && len(data) > limit {
		return fmt.Errorf("%s: user data is %d bytes, more than shard.limits.max_user_data_bytes (%d)", what, len(data), limit)
	}
	return nil
}

// Store keeps tenants' bootstrap data encrypted in object storage.
type Store struct {
	Secrets *secrets.Store
	Keys    layout.Keys
	Shard   string
}

// Put stores data for tenant and returns its hex SHA-256. The same bytes
// are stored once (create-only; an existing object is the same data).
func (s *Store) Put(ctx context.Context, tenant string, data []byte) (string, error) {
	if s == nil || s.Secrets == nil {
		return "", errors.New("user data: no secret store (the server has no encryption key)")
	}
	sum := Sum(data)
	err := s.Secrets.Put(ctx, s.Keys.UserData(s.Shard, tenant, sum), data, objstore.PutOptions{IfNoneMatch: true})
	if err != nil && !errors.Is(err, objstore.ErrPreconditionFailed) {
		return "", fmt.Errorf("storing user data: %w", err)
	}
	return sum, nil
}

// Get reads the data stored for tenant under sum and checks it.
func (s *Store) Get(ctx context.Context, tenant, sum string) ([]byte, error) {
	if s == nil || s.Secrets == nil {
		return nil, errors.New("user data: no secret store (the server has no encryption key)")
	}
	data, err := s.Secrets.Get(ctx, s.Keys.UserData(s.Shard, tenant, sum))
	if err != nil {
		return nil, fmt.Errorf("reading user data %s: %w", sum, err)
	}
	if Sum(data) != sum {
		return nil, fmt.Errorf("user data %s: stored bytes do not match their hash", sum)
	}
	return data, nil
}

// Render renders template t's userdata for one instance: the inline text,
// or the object userdata_object names (read with readObject), as a Go
// template over data. A template without userdata renders to nothing.
func Render(ctx context.Context, key string, t config.Template, data config.TemplateData, readObject func(ctx context.Context, key string) ([]byte, error)) ([]byte, error) {
	text := t.Userdata
	if t.UserdataObject != "" {
		if err := layout.CheckTemplateObject(t.UserdataObject); err != nil {
			return nil, fmt.Errorf("%s.userdata_object: %w", key, err)
		}
		b, err := readObject(ctx, t.UserdataObject)
		if err != nil {
			return nil, fmt.Errorf("%s.userdata_object: reading %s: %w", key, t.UserdataObject, err)
		}
		text = string(b)
	}
	if text == "" {
		return nil, nil
	}
	out, err := config.Render(key+".userdata", text, data)
	if err != nil {
		return nil, err
	}
	return []byte(out), nil
}

// Prune deletes the stored data of this shard that keep does not name and
// that was written before notAfter (data stored moments ago may belong to
// a request whose group or instance is not written yet). It returns how
// many objects it deleted.
func (s *Store) Prune(ctx context.Context, keep func(tenant, sum string) bool, notAfter time.Time) (int, error) {
	if s == nil || s.Secrets == nil {
		return 0, nil
	}
	prefix := s.Keys.UserDataPrefix(s.Shard)
	objs, err := s.Secrets.Objects.List(ctx, prefix)
	if err != nil {
		return 0, fmt.Errorf("listing user data: %w", err)
	}
	n := 0
	for _, o := range objs {
		tenant, sum, ok := strings.Cut(strings.TrimPrefix(o.Key, prefix), "/")
		if !ok || strings.Contains(sum, "/") || keep(tenant, sum) || !o.LastModified.Before(notAfter) {
			continue
		}
		if err := s.Secrets.Objects.Delete(ctx, o.Key); err != nil {
			return n, fmt.Errorf("deleting user data %s: %w", o.Key, err)
		}
		n++
	}
	return n, nil
}
