package liveconfig

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// Outcome is the result of a refresh.
type Outcome int

// Refresh outcomes.
const (
	Updated Outcome = iota + 1
	NotModified
	Invalid
	StorageError
)

func (o Outcome) String() string {
	switch o {
	case Updated:
		return "updated"
	case NotModified:
		return "not-modified"
	case Invalid:
		return "invalid"
	case StorageError:
		return "storage-error"
	}
	return "unknown"
}

// Result describes one refresh.
type Result struct {
	Outcome      Outcome
	ETag         string
	PreviousETag string
	Message      string
	Errors       []config.FieldError
}

// Holder keeps the running config.
type Holder struct {
	// Checks run on every refreshed document besides config's own
	// validation (e.g. the provider registry's check of
	// shard.infra.options); set them before the first Refresh.
	Checks []config.Check

	obj objstore.Store
	key string

	refreshMu sync.Mutex
	mu        sync.RWMutex
	cfg       *config.Config
	etag      string
	modified  time.Time
	listeners []func(old, cur *config.Config)
}

// New returns a holder that refreshes from key and starts with cfg (which may
// be nil until Refresh or Set).
func New(obj objstore.Store, key string, cfg *config.Config, etag string, modified time.Time) *Holder {
	return &Holder{obj: obj, key: key, cfg: cfg, etag: etag, modified: modified}
}

// Current returns the running config. Callers must not modify it.
func (h *Holder) Current() *config.Config {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.cfg
}

// ConfigVersion returns the etag and last-modified time of the running config.
func (h *Holder) ConfigVersion() (string, time.Time) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.etag, h.modified
}

// OnChange registers fn to run after every applied change.
func (h *Holder) OnChange(fn func(old, cur *config.Config)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.listeners = append(h.listeners, fn)
}

// Set installs a config loaded elsewhere and notifies listeners.
func (h *Holder) Set(cfg *config.Config, etag string, modified time.Time) {
	h.mu.Lock()
	old := h.cfg
	h.cfg, h.etag, h.modified = cfg, etag, modified
	ls := append([]func(old, cur *config.Config){}, h.listeners...)
	h.mu.Unlock()
	for _, fn := range ls {
		fn(old, cfg)
	}
}

// Refresh downloads the config and applies it when it changed and is valid.
// A config may not change cluster.id or shard.id of a running server.
func (h *Holder) Refresh(ctx context.Context) Result {
	h.refreshMu.Lock()
	defer h.refreshMu.Unlock()
	prevETag, _ := h.ConfigVersion()
	res := Result{ETag: prevETag, PreviousETag: prevETag}
	o, err := h.obj.Get(ctx, h.key)
	if err != nil {
		res.Outcome = StorageError
		if errors.Is(err, objstore.ErrNotFound) {
			res.Message = fmt.Sprintf("config %s does not exist in object storage; keeping the running config", h.key)
		} else {
			res.Message = fmt.Sprintf("reading config %s: %v; keeping the running config", h.key, err)
		}
		return res
	}
	if o.ETag == prevETag && prevETag != "" {
		res.Outcome, res.Message = NotModified, "config unchanged (etag "+o.ETag+")"
		return res
	}
	cfg, err := config.Parse(o.Body, h.Checks...)
	if err != nil {
		res.Outcome = Invalid
		if fes, ok := config.AsErrors(err); ok {
			res.Errors = fes
		} else {
			res.Errors = []config.FieldError{{Reason: err.Error()}}
		}
		res.Message = fmt.Sprintf("config %s (etag %s) is invalid, keeping the running config: %v", h.key, o.ETag, err)
		return res
	}
	if cur := h.Current(); cur != nil {
		var fes []config.FieldError
		if cfg.Cluster.ID != cur.Cluster.ID {
			fes = append(fes, config.FieldError{Key: "cluster.id", Reason: fmt.Sprintf("cannot change from %q to %q while running", cur.Cluster.ID, cfg.Cluster.ID)})
		}
		if cfg.Shard.ID != cur.Shard.ID {
			fes = append(fes, config.FieldError{Key: "shard.id", Reason: fmt.Sprintf("cannot change from %q to %q while running", cur.Shard.ID, cfg.Shard.ID)})
		}
		if len(fes) > 0 {
			res.Outcome, res.Errors = Invalid, fes
			res.Message = fmt.Sprintf("config %s (etag %s) is invalid, keeping the running config: %v", h.key, o.ETag, config.Errors(fes))
			return res
		}
	}
	h.Set(cfg, o.ETag, o.LastModified)
	res.Outcome, res.ETag = Updated, o.ETag
	res.Message = "config updated to etag " + o.ETag + "; listener address changes take effect after a restart"
	return res
}
