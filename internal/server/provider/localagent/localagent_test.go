package localagent_test

import (
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/localagent"
)

// TestWriteNodeReportsKubeletConditions decodes the fake Node file as the
// Kubernetes Node type and checks it carries every condition core Cluster
// API's NodeHealthy summarises, each in its healthy state with timestamps.
func TestWriteNodeReportsKubeletConditions(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	req := provider.CreateRequest{InstanceID: "i-1", ProviderID: "nstance://s/i-1", Shard: "s", GroupID: "g"}
	require.NoError(t, localagent.WriteNode(dir, req, now))
	b, err := os.ReadFile(localagent.NodePath(dir, "i-1"))
	require.NoError(t, err)
	var node corev1.Node
	require.NoError(t, json.Unmarshal(b, &node))
	require.Equal(t, "nstance://s/i-1", node.Spec.ProviderID)

	want := map[corev1.NodeConditionType]corev1.ConditionStatus{
		corev1.NodeReady:          corev1.ConditionTrue,
		corev1.NodeMemoryPressure: corev1.ConditionFalse,
		corev1.NodeDiskPressure:   corev1.ConditionFalse,
		corev1.NodePIDPressure:    corev1.ConditionFalse,
	}
	got := map[corev1.NodeConditionType]corev1.ConditionStatus{}
	for _, c := range node.Status.Conditions {
		got[c.Type] = c.Status
		require.NotEmpty(t, c.Reason, c.Type)
		require.True(t, c.LastHeartbeatTime.Time.Equal(now), c.Type)
		require.True(t, c.LastTransitionTime.Time.Equal(now), c.Type)
	}
	require.Equal(t, want, got)
}
