package machinepool

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSplitReplicas(t *testing.T) {
	tests := []struct {
		name   string
		total  int32
		shards []string
		want   map[string]int32
	}{
		{"five over two", 5, []string{"a", "b"}, map[string]int32{"a": 3, "b": 2}},
		{"order decides remainder", 5, []string{"b", "a"}, map[string]int32{"b": 3, "a": 2}},
		{"one over two", 1, []string{"a", "b"}, map[string]int32{"a": 1, "b": 0}},
		{"zero", 0, []string{"a", "b", "c"}, map[string]int32{"a": 0, "b": 0, "c": 0}},
		{"even", 6, []string{"a", "b", "c"}, map[string]int32{"a": 2, "b": 2, "c": 2}},
		{"remainder two of three", 8, []string{"x", "y", "z"}, map[string]int32{"x": 3, "y": 3, "z": 2}},
		{"single shard", 7, []string{"a"}, map[string]int32{"a": 7}},
		{"negative", -3, []string{"a"}, map[string]int32{"a": 0}},
		{"no shards", 4, nil, map[string]int32{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := SplitReplicas(tt.total, tt.shards)
			require.Equal(t, tt.want, got)
			var sum int32
			for _, v := range got {
				sum += v
			}
			if len(tt.shards) > 0 && tt.total > 0 {
				require.Equal(t, tt.total, sum)
			}
		})
	}
}

func BenchmarkSplitReplicas(b *testing.B) {
	shards := []string{"a", "b", "c", "d", "e"}
	for b.Loop() {
		_ = SplitReplicas(1003, shards)
	}
}
