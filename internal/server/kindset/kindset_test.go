package kindset_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/kindset"
)

type kind struct {
	name string
	ok   bool
}

func build(kinds ...kind) kindset.Set[kind] {
	return kindset.New("test", func(k kind) string { return k.name }, func(k kind) bool { return k.ok }, kinds...)
}

func TestSet(t *testing.T) {
	s := build(kind{"b", true}, kind{"a", true})
	require.Equal(t, []string{"a", "b"}, s.Names())
	k, ok := s.Get("b")
	require.True(t, ok)
	require.Equal(t, "b", k.name)
	_, ok = s.Get("c")
	require.False(t, ok)
	require.PanicsWithValue(t, `test: kind "a" registered twice`, func() { build(kind{"a", true}, kind{"a", true}) })
	require.PanicsWithValue(t, `test: kind "" has no name or no Config`, func() { build(kind{"", true}) })
	require.PanicsWithValue(t, `test: kind "x" has no name or no Config`, func() { build(kind{"x", false}) })
}
