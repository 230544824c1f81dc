package awssecrets

import (
	"context"
	"encoding/base64"
	"fmt"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/secrets"
)

// Template files of kind secret read any value, not only keys: the real
// clients against the checking endpoints return SecretString, SecretBinary
// and a decrypted SecureString byte for byte, per region.
func TestWireFetchFileValues(t *testing.T) {
	pem := "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n"
	bin := []byte{0, 1, 2, 0xff}
	smSrv, smCalls := awsJSONServer(t, "secretsmanager", "eu-west-1", func(_ string, body map[string]any) (int, string) {
		switch body["SecretId"] {
		case "app/tls":
			return 200, fmt.Sprintf(`{"Name":"app/tls","VersionId":"v7","SecretString":%q,"VersionStages":["AWSCURRENT"]}`, pem)
		case "app/blob":
			return 200, fmt.Sprintf(`{"Name":"app/blob","VersionId":"v1","SecretBinary":%q,"VersionStages":["AWSCURRENT"]}`, base64.StdEncoding.EncodeToString(bin))
		}
		return 400, `{"__type":"ResourceNotFoundException","Message":"Secrets Manager can't find the specified secret."}`
	})
	ssmSrv, ssmCalls := awsJSONServer(t, "ssm", "eu-west-1", func(_ string, body map[string]any) (int, string) {
		if body["Name"] == "/app/token" {
			return 200, `{"Parameter":{"Name":"/app/token","Type":"SecureString","Value":"tok en\n","Version":3}}`
		}
		return 400, `{"__type":"ParameterNotFound"}`
	})
	f := New(func(_ context.Context, region string) (SecretsManagerAPI, SSMAPI, error) {
		require.Equal(t, "eu-west-1", region)
		return secretsmanager.NewFromConfig(wireConfig(region), func(o *secretsmanager.Options) { o.BaseEndpoint = aws.String(smSrv.URL) }),
			ssm.NewFromConfig(wireConfig(region), func(o *ssm.Options) { o.BaseEndpoint = aws.String(ssmSrv.URL) }), nil
	})
	ctx := context.Background()
	got, err := f.Fetch(ctx, secrets.Source{Provider: secrets.ProviderAWSSecretsManager, SecretID: "app/tls", VersionStage: "AWSCURRENT", Region: "eu-west-1"})
	require.NoError(t, err)
	require.Equal(t, pem, string(got))
	got, err = f.Fetch(ctx, secrets.Source{Provider: secrets.ProviderAWSSecretsManager, SecretID: "app/blob", Region: "eu-west-1"})
	require.NoError(t, err)
	require.Equal(t, bin, got)
	got, err = f.Fetch(ctx, secrets.Source{Provider: secrets.ProviderAWSSSM, Parameter: "/app/token", Region: "eu-west-1"})
	require.NoError(t, err)
	require.Equal(t, "tok en\n", string(got))
	_, err = f.Fetch(ctx, secrets.Source{Provider: secrets.ProviderAWSSecretsManager, SecretID: "app/none", Region: "eu-west-1"})
	require.ErrorIs(t, err, ErrNotFound)

	require.Equal(t, map[string]any{"SecretId": "app/tls", "VersionStage": "AWSCURRENT"}, smCalls()[0].body)
	require.Equal(t, map[string]any{"Name": "/app/token", "WithDecryption": true}, ssmCalls()[0].body)
}
