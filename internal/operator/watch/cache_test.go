package watch

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func status(id string, actual uint32, at time.Time) *nstancev1.GroupStatus {
	return &nstancev1.GroupStatus{Spec: &nstancev1.GroupSpec{GroupId: id}, ActualSize: actual, UpdatedAt: timestamppb.New(at)}
}

func TestCacheOrdering(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name  string
		steps func(c *Cache)
		want  uint32
	}{
		{"newer event replaces", func(c *Cache) { c.Put("a", status("g", 1, t0)); c.Put("a", status("g", 2, t0.Add(time.Second))) }, 2},
		{"older event ignored", func(c *Cache) { c.Put("a", status("g", 2, t0.Add(time.Second))); c.Put("a", status("g", 1, t0)) }, 2},
		{"equal event wins", func(c *Cache) { c.PutResponse("a", status("g", 0, t0)); c.Put("a", status("g", 3, t0)) }, 3},
		{"equal response loses", func(c *Cache) { c.Put("a", status("g", 3, t0)); c.PutResponse("a", status("g", 0, t0)) }, 3},
		{"newer response wins", func(c *Cache) {
			c.Put("a", status("g", 3, t0))
			c.PutResponse("a", status("g", 0, t0.Add(time.Second)))
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCache()
			tt.steps(c)
			g, ok := c.Get("a", "g")
			require.True(t, ok)
			require.Equal(t, tt.want, g.GetActualSize())
		})
	}
}

func TestCacheReplaceAndIsolation(t *testing.T) {
	c := NewCache()
	now := time.Now()
	c.Put("a", status("x", 1, now))
	c.Put("a", status("y", 1, now))
	c.Put("b", status("x", 5, now))
	require.False(t, c.Synced("a"))
	gone := c.Replace("a", []*nstancev1.GroupStatus{status("y", 2, now)})
	require.Equal(t, []string{"x"}, gone)
	require.True(t, c.Synced("a"))
	_, ok := c.Get("a", "x")
	require.False(t, ok)
	g, _ := c.Get("b", "x")
	require.Equal(t, uint32(5), g.GetActualSize(), "other shard untouched")
	g.ActualSize = 99
	g2, _ := c.Get("b", "x")
	require.Equal(t, uint32(5), g2.GetActualSize(), "Get returns a copy")
	c.Unsync("a")
	require.False(t, c.Synced("a"))
	require.Len(t, c.List("a"), 1)
	c.Delete("a", "y")
	require.Empty(t, c.List("a"))
}
