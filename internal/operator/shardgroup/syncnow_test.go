package shardgroup

import (
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
)

func TestSentGuard(t *testing.T) {
	type step struct {
		uid types.UID
		gen int64
	}
	tests := []struct {
		name string
		sent []step // recorded in order
		ask  step
		want bool // outdated
	}{
		{"nothing sent", nil, step{"a", 1}, false},
		{"same generation", []step{{"a", 3}}, step{"a", 3}, false},
		{"newer copy", []step{{"a", 3}}, step{"a", 4}, false},
		{"older copy", []step{{"a", 3}}, step{"a", 2}, true},
		{"an older send never lowers the mark", []step{{"a", 5}, {"a", 3}}, step{"a", 4}, true},
		{"re-created shard group starts over", []step{{"a", 5}, {"b", 1}}, step{"b", 2}, false},
		{"the old object's copy after a re-creation", []step{{"a", 5}, {"b", 1}}, step{"a", 2}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var e sent
			for _, s := range tt.sent {
				e.record(s.uid, s.gen)
			}
			require.Equal(t, tt.want, e.outdated(tt.ask.uid, tt.ask.gen))
		})
	}
}
