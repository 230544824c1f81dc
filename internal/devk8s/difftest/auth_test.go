package difftest

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// as sends a request with the given Authorization header ("" for none)
// and no other credentials.
func (c *tc) as(authorization, method, path string, body any) resp {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		require.NoError(c.t, err)
		rd = strings.NewReader(string(data))
	}
	req, err := http.NewRequestWithContext(c.ctx, method, strings.TrimRight(c.tg.cfg.Host, "/")+c.path(path), rd)
	require.NoError(c.t, err)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	res, err := c.tg.anon.Do(req)
	require.NoError(c.t, err, "%s %s %s", c.tg.name, method, path)
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	require.NoError(c.t, err)
	out := resp{Code: res.StatusCode, Raw: data, CT: res.Header.Get("Content-Type")}
	_ = json.Unmarshal(data, &out.Obj)
	return out
}

var selfSubjectReview = map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}

// whoami summarises a SelfSubjectReview answer: the user's name, groups
// and extra keys (values such as the token's JTI differ by server).
func whoami(r resp) any {
	if r.Code != http.StatusCreated {
		return summary(r)
	}
	status, _ := r.Obj["status"].(map[string]any)
	ui, _ := status["userInfo"].(map[string]any)
	extra, _ := ui["extra"].(map[string]any)
	var keys []string
	for k, v := range extra {
		vals, _ := v.([]any)
		for _, x := range vals {
			s, _ := x.(string)
			keys = append(keys, k+"="+uuidRE.ReplaceAllString(s, "<uuid>"))
		}
	}
	return map[string]any{"code": r.Code, "kind": r.Obj["kind"], "username": ui["username"], "groups": ui["groups"], "extra": keys, "hasUID": ui["uid"] != nil}
}

func saToken(c *tc, name string, audiences ...string) string {
	c.t.Helper()
	spec := map[string]any{}
	if len(audiences) > 0 {
		spec["audiences"] = audiences
	}
	r := c.must(c.post("/api/v1/namespaces/{ns}/serviceaccounts/"+name+"/token",
		map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}))
	status, _ := r.Obj["status"].(map[string]any)
	tok, _ := status["token"].(string)
	require.NotEmpty(c.t, tok, "%s: no token in %s", c.tg.name, r.Raw)
	return tok
}

func authCases() []diffCase {
	var cases []diffCase
	add := func(name string, run func(c *tc) any) { cases = append(cases, diffCase{name: name, run: run}) }
	sa := func(name string) map[string]any {
		return map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": name}}
	}

	add("auth/no-token", func(c *tc) any { return summary(c.as("", http.MethodGet, "/api/v1/namespaces", nil)) })
	add("auth/no-token-discovery", func(c *tc) any { return summary(c.as("", http.MethodGet, "/apis", nil)) })
	add("auth/no-token-create", func(c *tc) any {
		return summary(c.as("", http.MethodPost, cmPath, cm("a", nil, nil)))
	})
	add("auth/wrong-token", func(c *tc) any {
		return summary(c.as("Bearer not-a-token", http.MethodGet, "/api/v1/namespaces", nil))
	})
	add("auth/wrong-jwt", func(c *tc) any {
		return summary(c.as("Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl", http.MethodGet, "/api/v1/namespaces", nil))
	})
	add("auth/basic-is-not-a-token", func(c *tc) any {
		return summary(c.as("Basic ZGV2OmRldg==", http.MethodGet, "/api/v1/namespaces", nil))
	})
	add("auth/empty-bearer", func(c *tc) any { return summary(c.as("Bearer ", http.MethodGet, "/api/v1/namespaces", nil)) })
	add("auth/anonymous-health-and-version", func(c *tc) any {
		var codes []any
		for _, p := range []string{"/healthz", "/livez", "/readyz", "/version", "/healthz/ping", "/livez/ping", "/openapi/v3"} {
			codes = append(codes, p, c.as("", http.MethodGet, p, nil).Code)
		}
		return codes
	})
	add("auth/wrong-token-on-healthz", func(c *tc) any { return summary(c.as("Bearer not-a-token", http.MethodGet, "/healthz", nil)) })
	add("auth/static-token-user", func(c *tc) any {
		return whoami(c.as("Bearer "+userToken, http.MethodPost, "/apis/authentication.k8s.io/v1/selfsubjectreviews", selfSubjectReview))
	})
	add("auth/anonymous-whoami", func(c *tc) any {
		return whoami(c.as("", http.MethodPost, "/apis/authentication.k8s.io/v1/selfsubjectreviews", selfSubjectReview))
	})
	add("auth/service-account-token", func(c *tc) any {
		c.must(c.post("/api/v1/namespaces/{ns}/serviceaccounts", sa("robot")))
		tok := saToken(c, "robot")
		return whoami(c.as("Bearer "+tok, http.MethodPost, "/apis/authentication.k8s.io/v1/selfsubjectreviews", selfSubjectReview))
	})
	add("auth/service-account-token-other-audience", func(c *tc) any {
		c.must(c.post("/api/v1/namespaces/{ns}/serviceaccounts", sa("robot")))
		tok := saToken(c, "robot", "https://vault.example")
		return summary(c.as("Bearer "+tok, http.MethodPost, "/apis/authentication.k8s.io/v1/selfsubjectreviews", selfSubjectReview))
	})
	add("auth/service-account-deleted", func(c *tc) any {
		c.must(c.post("/api/v1/namespaces/{ns}/serviceaccounts", sa("robot")))
		tok := saToken(c, "robot")
		c.must(c.del("/api/v1/namespaces/{ns}/serviceaccounts/robot", nil))
		return summary(c.as("Bearer "+tok, http.MethodGet, "/healthz", nil))
	})
	add("auth/service-account-recreated", func(c *tc) any {
		c.must(c.post("/api/v1/namespaces/{ns}/serviceaccounts", sa("robot")))
		tok := saToken(c, "robot")
		c.must(c.del("/api/v1/namespaces/{ns}/serviceaccounts/robot", nil))
		c.must(c.post("/api/v1/namespaces/{ns}/serviceaccounts", sa("robot")))
		return summary(c.as("Bearer "+tok, http.MethodGet, "/healthz", nil))
	})
	add("auth/tampered-service-account-token", func(c *tc) any {
		c.must(c.post("/api/v1/namespaces/{ns}/serviceaccounts", sa("robot")))
		tok := saToken(c, "robot")
		parts := strings.Split(tok, ".")
		sig := []byte(parts[2])
		if sig[0] == 'A' {
			sig[0] = 'B'
		} else {
			sig[0] = 'A'
		}
		return summary(c.as("Bearer "+parts[0]+"."+parts[1]+"."+string(sig), http.MethodGet, "/healthz", nil))
	})
	return cases
}

func TestAuth(t *testing.T) { runTable(t, authCases()) }
