package adminapp_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/admin/adminapp"
)

func TestReorder(t *testing.T) {
	app := adminapp.New()
	for _, tc := range []struct{ in, want []string }{
		{[]string{"instance", "get", "web-1", "-o", "json"}, []string{"instance", "get", "-o", "json", "--", "web-1"}},
		{[]string{"instance", "list", "-w", "--group", "db", "-o=yaml"}, []string{"instance", "list", "-w", "--group", "db", "-o=yaml"}},
		{[]string{"group", "create", "db", "--template", "worker", "--all-shards", "--size", "2"},
			[]string{"group", "create", "--template", "worker", "--all-shards", "--size", "2", "--", "db"}},
		{[]string{"context", "set", "dev", "--servers", "a=b:1"}, []string{"context", "set", "--servers", "a=b:1", "--", "dev"}},
		{[]string{"instance", "get", "--", "-odd"}, []string{"instance", "get", "--", "-odd"}},
		{[]string{"group"}, []string{"group"}},
		{[]string{"group", "help"}, []string{"group", "help"}},
		{[]string{"--help"}, []string{"--help"}},
		{[]string{"nope", "x", "-o", "json"}, []string{"nope", "x", "-o", "json"}},
	} {
		got := adminapp.Reorder(app, append([]string{"nstance-admin"}, tc.in...))
		require.Equal(t, append([]string{"nstance-admin"}, tc.want...), got, "%v", tc.in)
	}
}
