package v1beta1_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

func TestShardGroupName(t *testing.T) {
	tests := []struct {
		group, shard string
		want         string
	}{
		{"workers", "us-west-2a", "workers--us-west-2a"},
		{"gpu-large", "eu-1", "gpu-large--eu-1"},
		// A shard may itself contain "--": the group never does.
		{"web", "a--b", "web--a--b"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			name := infrav1.ShardGroupName(tt.group, tt.shard)
			require.Equal(t, tt.want, name)
			group, shard, ok := infrav1.ParseShardGroupName(name)
			require.True(t, ok)
			require.Equal(t, tt.group, group)
			require.Equal(t, tt.shard, shard)
		})
	}
}

func TestParseShardGroupNameRejects(t *testing.T) {
	for _, name := range []string{"", "workers", "workers-us", "--us", "workers--"} {
		t.Run(name, func(t *testing.T) {
			_, _, ok := infrav1.ParseShardGroupName(name)
			require.False(t, ok)
		})
	}
}
