package gcpsecrets

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"testing"

	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"

	"github.com/nstance-dev/nstance/internal/secrets"
)

// permissions maps each REST call of Secret Manager v1 that the fake
// endpoint recognises to the IAM permission it needs (from the API's
// reference: projects.secrets.versions.access needs
// secretmanager.versions.access). Any other request fails the test.
var permissions = []struct {
	method string
	path   *regexp.Regexp
	perm   string
}{
	{http.MethodGet, regexp.MustCompile(`^/v1/projects/[^/]+/secrets/[^/]+/versions/[^/:]+:access$`), "secretmanager.versions.access"},
}

// secretManagerREST answers the Secret Manager REST API from a fake and
// records the permission of every call.
func secretManagerREST(t *testing.T, fake *fakeSecretManager) (*httptest.Server, func() []string) {
	t.Helper()
	var mu sync.Mutex
	seen := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		perm := ""
		for _, p := range permissions {
			if r.Method == p.method && p.path.MatchString(r.URL.Path) {
				perm = p.perm
			}
		}
		if perm == "" {
			t.Errorf("unexpected call %s %s", r.Method, r.URL.Path)
			http.Error(w, "unexpected", http.StatusNotImplemented)
			return
		}
		if r.Header.Get("Authorization") != "" {
			t.Errorf("credentials sent to the test endpoint: %q", r.Header.Get("Authorization"))
		}
		mu.Lock()
		seen[perm] = true
		mu.Unlock()
		name := r.URL.Path[len("/v1/") : len(r.URL.Path)-len(":access")]
		resp, err := fake.AccessSecretVersion(r.Context(), accessRequest(name))
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			code, status := http.StatusNotFound, "NOT_FOUND"
			if !notFound(err) {
				code, status = http.StatusBadRequest, "FAILED_PRECONDITION"
			}
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "message": err.Error(), "status": status}})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{
			"name": resp.GetName(),
			"payload": map[string]any{
				"data":       base64.StdEncoding.EncodeToString(resp.GetPayload().GetData()),
				"dataCrc32c": strconv.FormatInt(resp.GetPayload().GetDataCrc32C(), 10),
			},
		})
	}))
	t.Cleanup(srv.Close)
	return srv, func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := make([]string, 0, len(seen))
		for p := range seen {
			out = append(out, p)
		}
		sort.Strings(out)
		return out
	}
}

// The real client (REST transport) reads the current and a numbered version
// and reports a missing one as ErrNotFound; the calls it makes need exactly
// the documented permission, secretmanager.versions.access.
func TestWireRealClient(t *testing.T) {
	ctx := context.Background()
	fake := newFake()
	fake.add(secretID, key(1))
	fake.add(secretID, key(2))
	srv, seen := secretManagerREST(t, fake)
	f := New(DefaultClient(option.WithEndpoint(srv.URL), option.WithoutAuthentication(), option.WithHTTPClient(srv.Client())))

	got, err := f.Fetch(ctx, secrets.Source{Provider: secrets.ProviderGCPSecretManager, SecretID: secretID})
	require.NoError(t, err)
	require.Equal(t, key(2), got)
	got, err = f.Fetch(ctx, secrets.Source{Provider: secrets.ProviderGCPSecretManager, SecretID: secretID, VersionID: "1"})
	require.NoError(t, err)
	require.Equal(t, key(1), got)
	_, err = f.Fetch(ctx, secrets.Source{Provider: secrets.ProviderGCPSecretManager, SecretID: "projects/p1/secrets/nope"})
	require.True(t, errors.Is(err, ErrNotFound), "%v", err)
	fake.disable(secretID, 1)
	_, err = f.Fetch(ctx, secrets.Source{Provider: secrets.ProviderGCPSecretManager, SecretID: secretID, VersionID: "1"})
	require.Error(t, err)
	require.False(t, errors.Is(err, ErrNotFound), "a disabled version is not a missing one: %v", err)

	require.Equal(t, []string{"secretmanager.versions.access"}, seen())
	require.Equal(t, []string{secretID + "/versions/latest", secretID + "/versions/1", "projects/p1/secrets/nope/versions/latest", secretID + "/versions/1"}, fake.calls)
}

func accessRequest(name string) *secretmanagerpb.AccessSecretVersionRequest {
	return &secretmanagerpb.AccessSecretVersionRequest{Name: name}
}
