package imagelookup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/imagelookup"
)

func TestOverlay(t *testing.T) {
	base := func() *config.Config {
		return &config.Config{
			Defaults: config.Defaults{Args: map[string]string{"image_name": "base"}},
			Templates: map[string]config.Template{
				"plain":    {Args: map[string]string{"x": "1"}},
				"named":    {Args: map[string]string{"image_name": "gpu"}},
				"explicit": {Args: map[string]string{"image_name": "gpu", "image": "ami-pinned"}},
				"unknown":  {Args: map[string]string{"image_name": "nope"}},
			},
		}
	}
	for _, tc := range []struct {
		name     string
		ids      map[string]string
		defaults map[string]string
		tmpl     map[string]map[string]string
		same     bool
	}{
		{name: "nothing resolved", ids: nil, same: true},
		{name: "both resolved", ids: map[string]string{"base": "ami-base", "gpu": "ami-gpu"},
			defaults: map[string]string{"image_name": "base", "image": "ami-base"},
			tmpl: map[string]map[string]string{"plain": {"x": "1"}, "named": {"image_name": "gpu", "image": "ami-gpu"},
				"explicit": {"image_name": "gpu", "image": "ami-pinned"}, "unknown": {"image_name": "nope"}}},
		{name: "one resolved", ids: map[string]string{"gpu": "ami-gpu"},
			defaults: map[string]string{"image_name": "base"},
			tmpl: map[string]map[string]string{"plain": {"x": "1"}, "named": {"image_name": "gpu", "image": "ami-gpu"},
				"explicit": {"image_name": "gpu", "image": "ami-pinned"}, "unknown": {"image_name": "nope"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := base()
			out := imagelookup.Overlay(in, tc.ids)
			require.Equal(t, base(), in, "the input is not modified")
			if tc.same {
				require.Same(t, in, out)
				return
			}
			require.Equal(t, tc.defaults, out.Defaults.Args)
			for name, args := range tc.tmpl {
				require.Equal(t, args, out.Templates[name].Args, name)
			}
		})
	}
}

type resolver struct {
	ids      map[string]string
	err      error
	fallback string
}

func (r *resolver) ImageNames() []string { return []string{"base"} }
func (r *resolver) ResolveImage(context.Context, string) (string, error) {
	if r.err != nil {
		return "", r.err
	}
	return r.ids["base"], nil
}
func (r *resolver) ImageFallback(string) string         { return r.fallback }
func (r *resolver) ImageRefreshInterval() time.Duration { return time.Hour }

func TestTableRefresh(t *testing.T) {
	ctx := context.Background()
	r := &resolver{err: errors.New("denied"), fallback: "ami-fallback"}
	changes := 0
	type failure struct{ name, kept, err string }
	var fails []failure
	tab := &imagelookup.Table{Resolver: r, OnChange: func() { changes++ },
		OnError: func(name, kept string, err error) { fails = append(fails, failure{name, kept, err.Error()}) }}
	live := &config.Config{Templates: map[string]config.Template{"w": {Args: map[string]string{"image_name": "base"}}}}
	cfg := tab.Config(func() *config.Config { return live })

	// First lookup fails: the fallback is used and reported.
	tab.Refresh(ctx)
	require.Equal(t, map[string]string{"base": "ami-fallback"}, tab.IDs())
	require.Equal(t, []failure{{"base", "ami-fallback", "denied"}}, fails)
	require.Equal(t, 1, changes)
	require.Equal(t, "ami-fallback", cfg().Templates["w"].Args["image"])
	require.Same(t, cfg(), cfg(), "the overlay is cached while nothing changes")

	// A lookup succeeds: changed once.
	r.err, r.ids = nil, map[string]string{"base": "ami-1"}
	tab.Refresh(ctx)
	tab.Refresh(ctx)
	require.Equal(t, 2, changes)
	require.Equal(t, "ami-1", cfg().Templates["w"].Args["image"])

	// A failure later keeps the last id.
	r.err = errors.New("throttled")
	tab.Refresh(ctx)
	require.Equal(t, 2, changes)
	require.Equal(t, map[string]string{"base": "ami-1"}, tab.IDs())
	require.Equal(t, failure{"base", "ami-1", "throttled"}, fails[len(fails)-1])

	// A new config is overlaid too.
	live = &config.Config{Templates: map[string]config.Template{"w": {Args: map[string]string{"image_name": "base", "k": "v"}}}}
	require.Equal(t, map[string]string{"image_name": "base", "k": "v", "image": "ami-1"}, cfg().Templates["w"].Args)
}
