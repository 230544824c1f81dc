package gcpsecrets

import (
	"context"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"
	"sync"

	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"
	"github.com/googleapis/gax-go/v2"
	"github.com/googleapis/gax-go/v2/apierror"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/secrets"
)

// fakeVersion is one version of a fake secret.
type fakeVersion struct {
	data    []byte
	enabled bool
}

// fakeSecretManager is a stateful Secret Manager: secrets with numbered
// versions, "latest" the newest enabled one, disabled versions refused with
// FAILED_PRECONDITION and missing ones with NOT_FOUND, as the service does.
type fakeSecretManager struct {
	mu      sync.Mutex
	secrets map[string][]fakeVersion // projects/p/secrets/s -> versions 1..n
	calls   []string
	// corrupt makes responses carry a wrong checksum.
	corrupt bool
}

func newFake() *fakeSecretManager { return &fakeSecretManager{secrets: map[string][]fakeVersion{}} }

// add appends a version to secret and returns its number.
func (f *fakeSecretManager) add(secret string, data []byte) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.secrets[secret] = append(f.secrets[secret], fakeVersion{data: data, enabled: true})
	return len(f.secrets[secret])
}

func (f *fakeSecretManager) disable(secret string, version int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.secrets[secret][version-1].enabled = false
}

func apiErr(c codes.Code, format string, args ...any) error {
	ae, _ := apierror.FromError(status.Errorf(c, format, args...))
	return ae
}

func (f *fakeSecretManager) AccessSecretVersion(_ context.Context, req *secretmanagerpb.AccessSecretVersionRequest, _ ...gax.CallOption) (*secretmanagerpb.AccessSecretVersionResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, req.GetName())
	secret, version, ok := strings.Cut(req.GetName(), "/versions/")
	if !ok || !secrets.ValidGCPSecretID(secret) {
		return nil, apiErr(codes.InvalidArgument, "bad name %q", req.GetName())
	}
	versions, ok := f.secrets[secret]
	if !ok {
		return nil, apiErr(codes.NotFound, "Secret [%s] not found or has no versions.", secret)
	}
	n := 0
	if version == "latest" {
		for i := len(versions); i >= 1; i-- {
			if versions[i-1].enabled {
				n = i
				break
			}
		}
		if n == 0 {
			return nil, apiErr(codes.NotFound, "Secret [%s] has no enabled versions.", secret)
		}
	} else {
		var err error
		if n, err = strconv.Atoi(version); err != nil || n < 1 {
			return nil, apiErr(codes.InvalidArgument, "bad version %q", version)
		}
		if n > len(versions) {
			return nil, apiErr(codes.NotFound, "Secret Version [%s] not found.", req.GetName())
		}
		if !versions[n-1].enabled {
			return nil, apiErr(codes.FailedPrecondition, "Secret Version [%s] is in DISABLED state.", req.GetName())
		}
	}
	data := versions[n-1].data
	sum := int64(crc32.Checksum(data, castagnoli))
	if f.corrupt {
		sum++
	}
	return &secretmanagerpb.AccessSecretVersionResponse{
		Name:    fmt.Sprintf("%s/versions/%d", secret, n),
		Payload: &secretmanagerpb.SecretPayload{Data: append([]byte(nil), data...), DataCrc32C: &sum},
	}, nil
}
