package awssecrets

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	smtypes "github.com/aws/aws-sdk-go-v2/service/secretsmanager/types"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"
)

// fakeSM is a stateful Secrets Manager: secrets with versions and staging
// labels, rotated the way PutSecretValue does (the new version becomes
// AWSCURRENT, the old current one AWSPREVIOUS).
type fakeSM struct {
	mu      sync.Mutex
	secrets map[string][]*smVersion
	n       int
}

type smVersion struct {
	id     string
	stages []string
	str    *string
	bin    []byte
}

func newFakeSM() *fakeSM { return &fakeSM{secrets: map[string][]*smVersion{}} }

// put adds a version (str or bin) and returns its id.
func (f *fakeSM) put(name string, str *string, bin []byte) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	v := &smVersion{id: fmt.Sprintf("v%d", f.n), stages: []string{"AWSCURRENT"}, str: str, bin: bin}
	for _, old := range f.secrets[name] {
		old.stages = slices.DeleteFunc(old.stages, func(s string) bool { return s == "AWSPREVIOUS" })
		if i := slices.Index(old.stages, "AWSCURRENT"); i >= 0 {
			old.stages[i] = "AWSPREVIOUS"
		}
	}
	f.secrets[name] = append(f.secrets[name], v)
	return v.id
}

func (f *fakeSM) GetSecretValue(_ context.Context, in *secretsmanager.GetSecretValueInput, _ ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	name := aws.ToString(in.SecretId)
	vs, ok := f.secrets[name]
	if !ok {
		return nil, &smtypes.ResourceNotFoundException{Message: aws.String("Secrets Manager can't find the specified secret.")}
	}
	stage := aws.ToString(in.VersionStage)
	if stage == "" && in.VersionId == nil {
		stage = "AWSCURRENT"
	}
	for _, v := range vs {
		if (in.VersionId == nil || aws.ToString(in.VersionId) == v.id) && (stage == "" || slices.Contains(v.stages, stage)) {
			return &secretsmanager.GetSecretValueOutput{Name: aws.String(name), VersionId: aws.String(v.id), SecretString: v.str,
				SecretBinary: v.bin, VersionStages: slices.Clone(v.stages)}, nil
		}
	}
	return nil, &smtypes.ResourceNotFoundException{Message: aws.String("Secrets Manager can't find the specified secret value for staging label: " + stage)}
}

// fakeSSM is a stateful Parameter Store: each put adds a version; a
// SecureString reads back decrypted only WithDecryption.
type fakeSSM struct {
	mu     sync.Mutex
	params map[string][]ssmtypes.Parameter
}

func newFakeSSM() *fakeSSM { return &fakeSSM{params: map[string][]ssmtypes.Parameter{}} }

func (f *fakeSSM) put(name, value string, typ ssmtypes.ParameterType) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := int64(len(f.params[name]) + 1)
	f.params[name] = append(f.params[name], ssmtypes.Parameter{Name: aws.String(name), Value: aws.String(value), Type: typ, Version: v})
}

func (f *fakeSSM) GetParameter(_ context.Context, in *ssm.GetParameterInput, _ ...func(*ssm.Options)) (*ssm.GetParameterOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	name, sel, hasSel := strings.Cut(aws.ToString(in.Name), ":")
	vs, ok := f.params[name]
	if !ok {
		return nil, &ssmtypes.ParameterNotFound{}
	}
	p := vs[len(vs)-1]
	if hasSel {
		n, err := strconv.Atoi(sel)
		if err != nil || n < 1 || n > len(vs) {
			return nil, &ssmtypes.ParameterVersionNotFound{Message: aws.String("version " + sel)}
		}
		p = vs[n-1]
		p.Selector = aws.String(":" + sel)
	}
	if p.Type == ssmtypes.ParameterTypeSecureString && !aws.ToBool(in.WithDecryption) {
		p.Value = aws.String("AQICAHh-encrypted-" + strconv.Itoa(len(aws.ToString(p.Value))))
	}
	return &ssm.GetParameterOutput{Parameter: &p}, nil
}
