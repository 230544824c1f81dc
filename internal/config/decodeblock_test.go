package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDecodeBlock(t *testing.T) {
	type inner struct {
		N int      `json:"n"`
		D Duration `json:"d"`
	}
	type block struct {
		Name  string   `json:"name"`
		Keep  string   `json:"keep"`
		List  []string `json:"list"`
		Inner inner    `json:"inner"`
	}
	out := block{Name: "default", Keep: "kept"}
	require.Empty(t, DecodeBlock("x", map[string]any{"name": "set", "list": []any{"a"}, "inner": map[string]any{"n": 2.0, "d": "5s"}}, &out))
	require.Equal(t, block{Name: "set", Keep: "kept", List: []string{"a"}, Inner: inner{N: 2, D: Duration(5e9)}}, out, "absent keys keep their defaults")

	out = block{Name: "default"}
	errs := DecodeBlock("shard.infra.options", map[string]any{"nme": "x", "list": []any{1.0}, "inner": map[string]any{"n": 1.5, "d": "soon"}}, &out)
	require.Equal(t, Errors{
		{Key: "shard.infra.options.inner.d", Reason: `invalid duration "soon": time: invalid duration "soon"`},
		{Key: "shard.infra.options.inner.n", Reason: "want integer, got 1.5"},
		{Key: "shard.infra.options.list[0]", Reason: "want string, got number"},
		{Key: "shard.infra.options.nme", Reason: "unknown key"},
	}, errs)
	require.Equal(t, block{Name: "default"}, out, "a rejected block changes nothing")

	require.Empty(t, DecodeBlock("x", nil, &out), "no block, defaults stand")
	require.Equal(t, Errors{{Key: "x", Reason: "cannot decode into config.block"}}, DecodeBlock("x", map[string]any{"a": 1.0}, out))
}
