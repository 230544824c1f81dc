package awssecrets

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	smtypes "github.com/aws/aws-sdk-go-v2/service/secretsmanager/types"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"

	"github.com/nstance-dev/nstance/internal/secrets"
)

// SecretsManagerAPI is the part of the Secrets Manager client used here.
type SecretsManagerAPI interface {
	GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, optFns ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error)
}

// SSMAPI is the part of the SSM client used here.
type SSMAPI interface {
	GetParameter(ctx context.Context, in *ssm.GetParameterInput, optFns ...func(*ssm.Options)) (*ssm.GetParameterOutput, error)
}

// ErrNotFound is wrapped by errors about a missing secret, secret version
// or parameter.
var ErrNotFound = errors.New("not found")

// Clients returns the clients for region ("": the SDK's default region).
type Clients func(ctx context.Context, region string) (SecretsManagerAPI, SSMAPI, error)

// DefaultClients builds clients from the SDK's default configuration
// (credentials chain, AWS_REGION or instance metadata for the region),
// with optFns applied.
func DefaultClients(optFns ...func(*awsconfig.LoadOptions) error) Clients {
	return func(ctx context.Context, region string) (SecretsManagerAPI, SSMAPI, error) {
		opts := append([]func(*awsconfig.LoadOptions) error{}, optFns...)
		if region != "" {
			opts = append(opts, awsconfig.WithRegion(region))
		}
		cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
		if err != nil {
			return nil, nil, fmt.Errorf("loading the AWS configuration: %w", err)
		}
		return secretsmanager.NewFromConfig(cfg), ssm.NewFromConfig(cfg), nil
	}
}

// Fetcher implements secrets.Remote; clients are built once per region on
// first use.
type Fetcher struct {
	clients Clients

	mu       sync.Mutex
	byRegion map[string]pair
}

type pair struct {
	sm  SecretsManagerAPI
	ssm SSMAPI
}

// New returns a Fetcher using clients.
func New(clients Clients) *Fetcher {
	return &Fetcher{clients: clients, byRegion: map[string]pair{}}
}

func (f *Fetcher) pair(ctx context.Context, region string) (pair, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.byRegion[region]; ok {
		return p, nil
	}
	sm, ps, err := f.clients(ctx, region)
	if err != nil {
		return pair{}, err
	}
	p := pair{sm: sm, ssm: ps}
	f.byRegion[region] = p
	return p, nil
}

// Fetch returns the key material src names.
func (f *Fetcher) Fetch(ctx context.Context, src secrets.Source) ([]byte, error) {
	p, err := f.pair(ctx, src.Region)
	if err != nil {
		return nil, err
	}
	switch src.Provider {
	case secrets.ProviderAWSSecretsManager:
		return getSecret(ctx, p.sm, src)
	case secrets.ProviderAWSSSM:
		return getParameter(ctx, p.ssm, src)
	}
	return nil, fmt.Errorf("awssecrets: provider %q is not an AWS provider", src.Provider)
}

func getSecret(ctx context.Context, c SecretsManagerAPI, src secrets.Source) ([]byte, error) {
	if src.SecretID == "" {
		return nil, errors.New("secrets manager: secret_id is empty")
	}
	in := &secretsmanager.GetSecretValueInput{SecretId: aws.String(src.SecretID)}
	which := "AWSCURRENT"
	if src.VersionID != "" {
		in.VersionId, which = aws.String(src.VersionID), "version "+src.VersionID
	} else if src.VersionStage != "" {
		in.VersionStage, which = aws.String(src.VersionStage), src.VersionStage
	}
	out, err := c.GetSecretValue(ctx, in)
	if err != nil {
		var nf *smtypes.ResourceNotFoundException
		if errors.As(err, &nf) {
			return nil, fmt.Errorf("secrets manager: secret %q (%s): %w: %s", src.SecretID, which, ErrNotFound, nf.ErrorMessage())
		}
		return nil, fmt.Errorf("secrets manager: reading secret %q (%s): %w", src.SecretID, which, err)
	}
	switch {
	case len(out.SecretBinary) > 0:
		return append([]byte(nil), out.SecretBinary...), nil
	case aws.ToString(out.SecretString) != "":
		return []byte(aws.ToString(out.SecretString)), nil
	}
	return nil, fmt.Errorf("secrets manager: secret %q (%s) has no value", src.SecretID, which)
}

func getParameter(ctx context.Context, c SSMAPI, src secrets.Source) ([]byte, error) {
	if src.Parameter == "" {
		return nil, errors.New("ssm: parameter is empty")
	}
	out, err := c.GetParameter(ctx, &ssm.GetParameterInput{Name: aws.String(src.Parameter), WithDecryption: aws.Bool(true)})
	if err != nil {
		var pnf *ssmtypes.ParameterNotFound
		var vnf *ssmtypes.ParameterVersionNotFound
		switch {
		case errors.As(err, &pnf):
			return nil, fmt.Errorf("ssm: parameter %q: %w", src.Parameter, ErrNotFound)
		case errors.As(err, &vnf):
			return nil, fmt.Errorf("ssm: parameter %q: version %w", src.Parameter, ErrNotFound)
		}
		return nil, fmt.Errorf("ssm: reading parameter %q: %w", src.Parameter, err)
	}
	if out.Parameter == nil || aws.ToString(out.Parameter.Value) == "" {
		return nil, fmt.Errorf("ssm: parameter %q has no value", src.Parameter)
	}
	if t := out.Parameter.Type; t == ssmtypes.ParameterTypeStringList {
		return nil, fmt.Errorf("ssm: parameter %q is a StringList; store the key as a SecureString", src.Parameter)
	}
	return []byte(aws.ToString(out.Parameter.Value)), nil
}
