package strategy_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLimitRanges creates, gets and lists a LimitRange through the API,
// and reads it as kubectl does (a Table).
func TestLimitRanges(t *testing.T) {
	a := startAPI(t)
	const path = "/api/v1/namespaces/default/limitranges"
	code, obj := a.call(t, http.MethodPost, path, `{"apiVersion":"v1","kind":"LimitRange","metadata":{"name":"lr"},
		"spec":{"limits":[{"type":"Container","default":{"cpu":"500m"}}]},"unknown":"pruned"}`)
	require.Equal(t, http.StatusCreated, code, "%v", obj)
	require.NotContains(t, obj, "unknown", "the object goes through its Go type")
	require.NotEmpty(t, obj["metadata"].(map[string]any)["uid"])

	code, obj = a.call(t, http.MethodGet, path+"/lr", "")
	require.Equal(t, http.StatusOK, code, "%v", obj)
	limits := obj["spec"].(map[string]any)["limits"].([]any)
	require.Equal(t, "500m", limits[0].(map[string]any)["default"].(map[string]any)["cpu"])

	code, obj = a.call(t, http.MethodGet, path, "")
	require.Equal(t, http.StatusOK, code, "%v", obj)
	require.Equal(t, "LimitRangeList", obj["kind"])
	require.Len(t, obj["items"], 1)

	code, obj = a.call(t, http.MethodGet, path, "", "Accept", tableAccept)
	require.Equal(t, http.StatusOK, code, "%v", obj)
	require.Equal(t, []string{"Name", "Created At"}, columnNames(t, obj))

	code, obj = a.call(t, http.MethodGet, "/api/v1", "")
	require.Equal(t, http.StatusOK, code, "%v", obj)
	found := false
	for _, r := range obj["resources"].([]any) {
		if m := r.(map[string]any); m["name"] == "limitranges" {
			found = true
			require.Equal(t, []any{"limits"}, m["shortNames"])
		}
	}
	require.True(t, found, "discovery lists limitranges")
}
