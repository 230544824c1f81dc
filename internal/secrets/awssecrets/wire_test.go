package awssecrets

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/secrets"
)

// wireCall is one request the fake endpoint received.
type wireCall struct {
	target string
	body   map[string]any
}

// awsJSONServer answers the awsJson1_1 protocol: it checks every request's
// method, path, content type, target and SigV4 headers for service, and
// answers with respond(target, body) -> (status, JSON).
func awsJSONServer(t *testing.T, service, region string, respond func(target string, body map[string]any) (int, string)) (*httptest.Server, func() []wireCall) {
	t.Helper()
	var mu sync.Mutex
	var calls []wireCall
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fail := func(format string, args ...any) {
			t.Errorf(format, args...)
			http.Error(w, fmt.Sprintf(format, args...), http.StatusBadRequest)
		}
		if r.Method != http.MethodPost || r.URL.Path != "/" {
			fail("want POST /, got %s %s", r.Method, r.URL.Path)
			return
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/x-amz-json-1.1" {
			fail("Content-Type %q", ct)
			return
		}
		auth := r.Header.Get("Authorization")
		if !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 Credential=AKIDWIRE/") || !strings.Contains(auth, "/"+region+"/"+service+"/aws4_request") ||
			!strings.Contains(auth, "SignedHeaders=") || !strings.Contains(auth, "Signature=") {
			fail("Authorization is not SigV4 for %s in %s: %q", service, region, auth)
			return
		}
		if r.Header.Get("X-Amz-Date") == "" {
			fail("X-Amz-Date missing")
			return
		}
		b, _ := io.ReadAll(r.Body)
		var body map[string]any
		if err := json.Unmarshal(b, &body); err != nil {
			fail("body is not JSON: %v: %s", err, b)
			return
		}
		target := r.Header.Get("X-Amz-Target")
		mu.Lock()
		calls = append(calls, wireCall{target: target, body: body})
		mu.Unlock()
		status, resp := respond(target, body)
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		w.Header().Set("X-Amzn-RequestId", "wire-test")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, resp)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []wireCall {
		mu.Lock()
		defer mu.Unlock()
		return append([]wireCall(nil), calls...)
	}
}

func wireConfig(region string) aws.Config {
	return aws.Config{Region: region, Credentials: credentials.NewStaticCredentialsProvider("AKIDWIRE", "wire-secret", ""), RetryMaxAttempts: 1}
}

// The real Secrets Manager client against an endpoint that checks each
// GetSecretValue request and answers with the API's response shapes
// (SecretBinary is base64 in JSON; errors carry __type).
func TestWireSecretsManagerGetSecretValue(t *testing.T) {
	key := rawKey(9)
	srv, calls := awsJSONServer(t, "secretsmanager", "eu-west-1", func(target string, body map[string]any) (int, string) {
		if target != "secretsmanager.GetSecretValue" {
			return 400, `{"__type":"UnknownOperationException"}`
		}
		switch body["SecretId"] {
		case "bin":
			return 200, fmt.Sprintf(`{"ARN":"arn:aws:secretsmanager:eu-west-1:123456789012:secret:bin-AbCdEf","Name":"bin","VersionId":"a1b2c3d4-5678-90ab-cdef-EXAMPLE11111",`+
				`"SecretBinary":%q,"VersionStages":["AWSPREVIOUS"],"CreatedDate":1.700000000E9}`, base64.StdEncoding.EncodeToString(key))
		case "str":
			return 200, fmt.Sprintf(`{"ARN":"arn:aws:secretsmanager:eu-west-1:123456789012:secret:str-AbCdEf","Name":"str","VersionId":"a1b2c3d4-5678-90ab-cdef-EXAMPLE22222",`+
				`"SecretString":%q,"VersionStages":["AWSCURRENT"],"CreatedDate":1700000000}`, base64.StdEncoding.EncodeToString(key))
		}
		return 400, `{"__type":"ResourceNotFoundException","Message":"Secrets Manager can't find the specified secret."}`
	})
	sm := secretsmanager.NewFromConfig(wireConfig("eu-west-1"), func(o *secretsmanager.Options) { o.BaseEndpoint = aws.String(srv.URL) })
	f := New(func(context.Context, string) (SecretsManagerAPI, SSMAPI, error) { return sm, nil, nil })
	l := secrets.Loader{Remote: f}
	ctx := context.Background()
	want, err := secrets.ParseKey(key)
	require.NoError(t, err)

	bin := smSource("bin")
	bin.VersionStage = "AWSPREVIOUS"
	k, err := l.Load(ctx, bin)
	require.NoError(t, err)
	require.Equal(t, want.ID, k.ID)
	str := smSource("str")
	str.VersionID = "a1b2c3d4-5678-90ab-cdef-EXAMPLE22222"
	k, err = l.Load(ctx, str)
	require.NoError(t, err)
	require.Equal(t, want.ID, k.ID)
	_, err = l.Load(ctx, smSource("missing"))
	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorContains(t, err, "can't find the specified secret")

	got := calls()
	require.Len(t, got, 3)
	require.Equal(t, map[string]any{"SecretId": "bin", "VersionStage": "AWSPREVIOUS"}, got[0].body)
	require.Equal(t, map[string]any{"SecretId": "str", "VersionId": "a1b2c3d4-5678-90ab-cdef-EXAMPLE22222"}, got[1].body)
	require.Equal(t, map[string]any{"SecretId": "missing"}, got[2].body)
	for _, c := range got {
		require.Equal(t, "secretsmanager.GetSecretValue", c.target)
	}
}

// The real SSM client against an endpoint that checks each GetParameter
// request (decryption asked for) and answers with the API's shapes.
func TestWireSSMGetParameter(t *testing.T) {
	key := rawKey(5)
	srv, calls := awsJSONServer(t, "ssm", "us-east-2", func(target string, body map[string]any) (int, string) {
		if target != "AmazonSSM.GetParameter" {
			return 400, `{"__type":"UnknownOperationException"}`
		}
		switch body["Name"] {
		case "/nstance/key:2":
			return 200, fmt.Sprintf(`{"Parameter":{"ARN":"arn:aws:ssm:us-east-2:123456789012:parameter/nstance/key","DataType":"text",`+
				`"LastModifiedDate":1700000000.123,"Name":"/nstance/key","Selector":":2","Type":"SecureString","Value":%q,"Version":2}}`, hexOf(key))
		case "/nstance/key:7":
			return 400, `{"__type":"ParameterVersionNotFound","message":"Systems Manager could not find version 7 of /nstance/key."}`
		}
		return 400, `{"__type":"ParameterNotFound"}`
	})
	ps := ssm.NewFromConfig(wireConfig("us-east-2"), func(o *ssm.Options) { o.BaseEndpoint = aws.String(srv.URL) })
	l := secrets.Loader{Remote: New(func(context.Context, string) (SecretsManagerAPI, SSMAPI, error) { return nil, ps, nil })}
	ctx := context.Background()
	src := func(name string) secrets.Source {
		return secrets.Source{Provider: secrets.ProviderAWSSSM, Parameter: name}
	}
	want, err := secrets.ParseKey(key)
	require.NoError(t, err)
	k, err := l.Load(ctx, src("/nstance/key:2"))
	require.NoError(t, err)
	require.Equal(t, want.ID, k.ID)
	_, err = l.Load(ctx, src("/nstance/key:7"))
	require.ErrorIs(t, err, ErrNotFound)
	_, err = l.Load(ctx, src("/nstance/none"))
	require.ErrorIs(t, err, ErrNotFound)

	got := calls()
	require.Len(t, got, 3)
	for i, name := range []string{"/nstance/key:2", "/nstance/key:7", "/nstance/none"} {
		require.Equal(t, "AmazonSSM.GetParameter", got[i].target)
		require.Equal(t, map[string]any{"Name": name, "WithDecryption": true}, got[i].body)
	}
}

func hexOf(b []byte) string { return fmt.Sprintf("%x", b) }
