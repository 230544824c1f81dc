package auth

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func request(path, token string) *http.Request {
	r, _ := http.NewRequest(http.MethodGet, "https://dev-k8s"+path, nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	return r
}

func TestAdminTokenAndKeyPersist(t *testing.T) {
	dir := t.TempDir()
	a, err := New(context.Background(), Options{StateDir: dir})
	require.NoError(t, err)
	b, err := New(context.Background(), Options{StateDir: dir})
	require.NoError(t, err)
	require.Equal(t, a.AdminToken(), b.AdminToken(), "a restart keeps the admin token")
	tok, err := a.IssueServiceAccountToken("ns", "sa", "uid-1", []string{Audience}, time.Now(), time.Now().Add(time.Hour))
	require.NoError(t, err)
	b.sa = func(ns, name string) (string, bool) { return "uid-1", ns == "ns" && name == "sa" }
	u, err := b.Authenticate(request("/api", tok))
	require.NoError(t, err, "tokens issued before a restart still verify")
	require.Equal(t, "system:serviceaccount:ns:sa", u.GetName())
	info, err := os.Stat(filepath.Join(dir, adminTokenFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	require.NoError(t, os.WriteFile(filepath.Join(dir, signingKeyFile), []byte("short\n"), 0o600))
	_, err = New(context.Background(), Options{StateDir: dir})
	require.ErrorContains(t, err, "delete it to generate a new one")
}

func TestServiceAccountTokens(t *testing.T) {
	uids := map[string]string{"ns/sa": "uid-1"}
	a, err := New(context.Background(), Options{StateDir: t.TempDir(), ServiceAccounts: func(ns, name string) (string, bool) {
		uid, ok := uids[ns+"/"+name]
		return uid, ok
	}})
	require.NoError(t, err)
	now := time.Now()
	issue := func(uid string, aud []string, from, until time.Time) string {
		tok, err := a.IssueServiceAccountToken("ns", "sa", uid, aud, from, until)
		require.NoError(t, err)
		return tok
	}
	valid := issue("uid-1", []string{"other", Audience}, now, now.Add(time.Hour))
	u, err := a.Authenticate(request("/api", valid))
	require.NoError(t, err)
	require.Equal(t, []string{"system:serviceaccounts", "system:serviceaccounts:ns", "system:authenticated"}, u.GetGroups())
	require.Contains(t, u.GetExtra()["authentication.kubernetes.io/credential-id"][0], "JTI=")

	for name, tok := range map[string]string{
		"other audience": issue("uid-1", []string{"https://vault.example"}, now, now.Add(time.Hour)),
		"expired":        issue("uid-1", []string{Audience}, now.Add(-2*time.Hour), now.Add(-time.Hour)),
		"other UID":      issue("uid-0", []string{Audience}, now, now.Add(time.Hour)),
		"not a token":    "abc",
		"other issuer's": "eyJhbGciOiJIUzI1NiJ9.eyJpc3MiOiJ4In0.c2ln",
	} {
		_, err := a.Authenticate(request("/api", tok))
		require.Error(t, err, name)
	}
	delete(uids, "ns/sa")
	_, err = a.Authenticate(request("/api", valid))
	require.ErrorContains(t, err, "deleted")
}

func TestAnonymousOnlyOnHealthAndVersion(t *testing.T) {
	a, err := New(context.Background(), Options{StateDir: t.TempDir()})
	require.NoError(t, err)
	for _, p := range AnonymousPaths {
		u, err := a.Authenticate(request(p, ""))
		require.NoError(t, err, p)
		require.Equal(t, "system:anonymous", u.GetName())
		_, err = a.Authenticate(request(p, "bad"))
		require.Error(t, err, "%s with a bad token", p)
	}
	for _, p := range []string{"/api", "/healthz/etcd", "/apis", "/"} {
		_, err := a.Authenticate(request(p, ""))
		require.Error(t, err, p)
	}
	u, err := a.Authenticate(request("/api", a.AdminToken()))
	require.NoError(t, err)
	require.Equal(t, AdminUser, u.GetName())
	require.Equal(t, []string{AdminGroup, "system:authenticated"}, u.GetGroups())
}

func TestTokenFile(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "tokens.csv")
	require.NoError(t, os.WriteFile(f, []byte("t1,alice,uid-a,\"g1,g2\"\nt2,bob,uid-b\n"), 0o600))
	a, err := New(context.Background(), Options{StateDir: filepath.Join(dir, "state"), TokenFile: f})
	require.NoError(t, err)
	u, err := a.Authenticate(request("/api", "t1"))
	require.NoError(t, err)
	require.Equal(t, "alice", u.GetName())
	require.Equal(t, []string{"g1", "g2", "system:authenticated"}, u.GetGroups())
	u, err = a.Authenticate(request("/api", "t2"))
	require.NoError(t, err)
	require.Equal(t, "uid-b", u.GetUID())

	_, err = New(context.Background(), Options{StateDir: filepath.Join(dir, "state"), TokenFile: filepath.Join(dir, "missing.csv")})
	require.ErrorContains(t, err, "token file")
	require.NoError(t, os.WriteFile(f, []byte("t1,alice\n"), 0o600))
	_, err = New(context.Background(), Options{StateDir: filepath.Join(dir, "state"), TokenFile: f})
	require.ErrorContains(t, err, "at least 3 columns")
}
