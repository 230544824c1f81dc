package strategy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/devk8s/apiserver"
)

// api is a dev-k8s API server for tests that go through HTTP, as clients
// do.
type api struct {
	url, token string
}

func startAPI(t *testing.T) *api {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := apiserver.New(ctx, logr.Discard(), apiserver.Options{Dir: t.TempDir()})
	require.NoError(t, err)
	hs := httptest.NewServer(s)
	t.Cleanup(func() {
		hs.Close()
		cancel()
		require.NoError(t, s.Close())
	})
	return &api{url: hs.URL, token: s.AdminToken()}
}

// call sends a JSON request and decodes the JSON answer.
func (a *api) call(t *testing.T, method, path, body string, header ...string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, a.url+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+a.token)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	var obj map[string]any
	require.NoError(t, json.Unmarshal(data, &obj), "%s", data)
	return res.StatusCode, obj
}

// tableAccept asks for meta.k8s.io/v1 Table output, as kubectl get does.
const tableAccept = "application/json;as=Table;v=v1;g=meta.k8s.io"

func columnNames(t *testing.T, table map[string]any) []string {
	t.Helper()
	var out []string
	for _, c := range table["columnDefinitions"].([]any) {
		out = append(out, c.(map[string]any)["name"].(string))
	}
	return out
}

// TestStrategiesThroughAPI checks that the apiserver calls the strategies:
// defaults and validation on create, field selectors and table columns.
func TestStrategiesThroughAPI(t *testing.T) {
	a := startAPI(t)
	code, obj := a.call(t, http.MethodPost, "/api/v1/namespaces/default/secrets", `{"metadata":{"name":"s"}}`)
	require.Equal(t, http.StatusCreated, code, "%v", obj)
	require.Equal(t, "Opaque", obj["type"], "the Secret default")

	code, obj = a.call(t, http.MethodPost, "/api/v1/namespaces/default/pods", `{"metadata":{"name":"p"},"spec":{}}`)
	require.Equal(t, http.StatusUnprocessableEntity, code, "%v", obj)
	require.Contains(t, obj["message"], "spec.containers: Required value")

	code, obj = a.call(t, http.MethodGet, "/api/v1/namespaces/default/secrets?fieldSelector=type%3DOpaque", "")
	require.Equal(t, http.StatusOK, code, "%v", obj)
	require.Len(t, obj["items"], 1)
	code, obj = a.call(t, http.MethodGet, "/api/v1/namespaces/default/secrets?fieldSelector=spec.nodeName%3Dx", "")
	require.Equal(t, http.StatusBadRequest, code, "%v", obj)
	require.Contains(t, obj["message"], `only "metadata.name", "metadata.namespace", "type"`)

	code, obj = a.call(t, http.MethodGet, "/api/v1/namespaces/default/secrets", "", "Accept", tableAccept)
	require.Equal(t, http.StatusOK, code, "%v", obj)
	require.Equal(t, []string{"Name", "Type", "Data", "Age"}, columnNames(t, obj))
	code, obj = a.call(t, http.MethodGet, "/api/v1/namespaces/default/serviceaccounts", "", "Accept", tableAccept)
	require.Equal(t, http.StatusOK, code, "%v", obj)
	require.Equal(t, []string{"Name", "Age"}, columnNames(t, obj), "a kind without columns of its own")
}
