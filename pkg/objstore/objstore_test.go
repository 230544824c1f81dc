package objstore_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/pkg/objstore"
)

func TestValidateKey(t *testing.T) {
	tests := []struct {
		key string
		ok  bool
	}{
		{"cluster/ca.crt", true},
		{"config/dev-1.jsonc", true},
		{"a", true},
		{"a/b/c.d..e", true}, // ".." inside a segment is fine
		{"..a/b", true},
		{strings.Repeat("x", objstore.MaxKeyLength), true},
		{"", false},
		{"/abs", false},
		{"a//b", false},
		{"..", false},
		{"../x", false},
		{"a/../b", false},
		{"a/..", false},
		{"a\x00b", false},
		{strings.Repeat("x", objstore.MaxKeyLength+1), false},
	}
	for _, tc := range tests {
		t.Run(tc.key, func(t *testing.T) {
			err := objstore.ValidateKey(tc.key)
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, objstore.ErrInvalidKey)
			}
		})
	}
}

func TestValidatePrefix(t *testing.T) {
	for _, p := range []string{"", "a", "a/", "shard/dev-1/"} {
		require.NoError(t, objstore.ValidatePrefix(p), p)
	}
	for _, p := range []string{"/", "../", "/a", "a//", "a/../"} {
		require.ErrorIs(t, objstore.ValidatePrefix(p), objstore.ErrInvalidKey, p)
	}
}
