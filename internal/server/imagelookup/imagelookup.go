// Package imagelookup resolves the images templates name (the image_name
// arg) through the provider's lookup (provider.ImageResolver; aws:
// DescribeImages), keeps the ids it found and lays them over the running
// config as the image arg, so a newly resolved image changes the groups'
// effective settings and the normal rotation rolls it. A failed lookup
// keeps the last id (or the entry's fallback) and is reported.
package imagelookup

import (
	"context"
	"maps"
	"sync"
	"time"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
)

// Table holds the resolved image ids. Safe for concurrent use.
type Table struct {
	// Resolver looks images up.
	Resolver provider.ImageResolver
	// OnChange is called after a refresh changed an id (the reconciler
	// resyncs its groups).
	OnChange func()
	// OnError is called for every failed lookup with the id kept ("": none).
	OnError func(name, kept string, err error)

	mu      sync.Mutex
	ids     map[string]string
	version uint64
	// cache is the overlay of the last base config at version.
	cacheBase *config.Config
	cacheVer  uint64
	cacheOut  *config.Config
}

// IDs returns a copy of the resolved ids by image name.
func (t *Table) IDs() map[string]string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.ids)
}

// Refresh looks every image up once. A name whose lookup fails keeps its
// id; one that never resolved gets its fallback id (if any). OnChange runs
// once when any id changed.
func (t *Table) Refresh(ctx context.Context) {
	changed := false
	for _, name := range t.Resolver.ImageNames() {
		id, err := t.Resolver.ResolveImage(ctx, name)
		t.mu.Lock()
		if t.ids == nil {
			t.ids = map[string]string{}
		}
		kept := t.ids[name]
		if err != nil && kept == "" {
			kept = t.Resolver.ImageFallback(name)
			id = kept
		}
		if id != "" && id != t.ids[name] {
			t.ids[name] = id
			t.version++
			changed = true
		}
		t.mu.Unlock()
		if err != nil && t.OnError != nil {
			t.OnError(name, kept, err)
		}
	}
	if changed && t.OnChange != nil {
		t.OnChange()
	}
}

// Run refreshes at the resolver's interval until ctx ends (the first
// refresh after one interval: callers refresh once before).
func (t *Table) Run(ctx context.Context) {
	tick := time.NewTicker(t.Resolver.ImageRefreshInterval())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			t.Refresh(ctx)
		}
	}
}

// Config wraps a config source: what it returns carries the resolved
// images (Overlay), rebuilt only when the base config or an id changed.
func (t *Table) Config(base func() *config.Config) func() *config.Config {
	return func() *config.Config {
		cfg := base()
		t.mu.Lock()
		defer t.mu.Unlock()
		if cfg == t.cacheBase && t.version == t.cacheVer && t.cacheOut != nil {
			return t.cacheOut
		}
		out := Overlay(cfg, t.ids)
		t.cacheBase, t.cacheVer, t.cacheOut = cfg, t.version, out
		return out
	}
}

// Overlay returns cfg with the image arg set to ids[name] in the defaults'
// and every template's args that carry image_name = name and no image of
// their own. Names not resolved are left alone (the provider refuses to
// launch from them). cfg is not modified; without anything to set it is
// returned as is.
func Overlay(cfg *config.Config, ids map[string]string) *config.Config {
	set := func(args map[string]string) (map[string]string, bool) {
		name := args[provider.ArgImageName]
		if name == "" || args[provider.ArgImage] != "" || ids[name] == "" {
			return args, false
		}
		out := maps.Clone(args)
		out[provider.ArgImage] = ids[name]
		return out, true
	}
	var out *config.Config
	clone := func() {
		if out == nil {
			c := *cfg
			c.Templates = maps.Clone(cfg.Templates)
			out = &c
		}
	}
	if args, ok := set(cfg.Defaults.Args); ok {
		clone()
		out.Defaults.Args = args
	}
	for name, tmpl := range cfg.Templates {
		if args, ok := set(tmpl.Args); ok {
			clone()
			tmpl.Args = args
			out.Templates[name] = tmpl
		}
	}
	if out == nil {
		return cfg
	}
	return out
}
