package gcpsecrets

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"net/http"
	"sync"

	secretmanager "cloud.google.com/go/secretmanager/apiv1"
	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"
	"github.com/googleapis/gax-go/v2"
	"github.com/googleapis/gax-go/v2/apierror"
	"google.golang.org/api/option"
	"google.golang.org/grpc/codes"

	"github.com/nstance-dev/nstance/internal/secrets"
)

// AccessAPI is the part of the Secret Manager client used here.
type AccessAPI interface {
	AccessSecretVersion(ctx context.Context, req *secretmanagerpb.AccessSecretVersionRequest, opts ...gax.CallOption) (*secretmanagerpb.AccessSecretVersionResponse, error)
}

// ErrNotFound is wrapped by errors about a missing secret or version.
var ErrNotFound = errors.New("not found")

// Client returns the client, built on first use.
type Client func(ctx context.Context) (AccessAPI, error)

// DefaultClient builds a REST client with Application Default Credentials
// (GOOGLE_APPLICATION_CREDENTIALS, the metadata server), with opts applied.
func DefaultClient(opts ...option.ClientOption) Client {
	return func(ctx context.Context) (AccessAPI, error) {
		c, err := secretmanager.NewRESTClient(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("creating the Secret Manager client: %w", err)
		}
		return c, nil
	}
}

// Fetcher implements secrets.Remote for provider gcp-secret-manager; the
// client is built once, on first use.
type Fetcher struct {
	client Client

	mu  sync.Mutex
	api AccessAPI
}

// New returns a Fetcher using client.
func New(client Client) *Fetcher { return &Fetcher{client: client} }

func (f *Fetcher) get(ctx context.Context) (AccessAPI, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.api == nil {
		api, err := f.client(ctx)
		if err != nil {
			return nil, err
		}
		f.api = api
	}
	return f.api, nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Fetch returns the payload of the version src names.
func (f *Fetcher) Fetch(ctx context.Context, src secrets.Source) ([]byte, error) {
	if src.Provider != secrets.ProviderGCPSecretManager {
		return nil, fmt.Errorf("gcpsecrets: provider %q is not %s", src.Provider, secrets.ProviderGCPSecretManager)
	}
	if !secrets.ValidGCPSecretID(src.SecretID) {
		return nil, fmt.Errorf("secret manager: secret_id %q is not projects/PROJECT/secrets/NAME", src.SecretID)
	}
	version := src.VersionID
	if version == "" {
		version = "latest"
	}
	name := src.SecretID + "/versions/" + version
	api, err := f.get(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := api.AccessSecretVersion(ctx, &secretmanagerpb.AccessSecretVersionRequest{Name: name})
	if err != nil {
		if notFound(err) {
			return nil, fmt.Errorf("secret manager: %s: %w: %v", name, ErrNotFound, err)
		}
		return nil, fmt.Errorf("secret manager: accessing %s: %w", name, err)
	}
	p := resp.GetPayload()
	if len(p.GetData()) == 0 {
		return nil, fmt.Errorf("secret manager: %s has no value", name)
	}
	if p.DataCrc32C != nil && int64(crc32.Checksum(p.GetData(), castagnoli)) != p.GetDataCrc32C() {
		return nil, fmt.Errorf("secret manager: %s: the payload does not match its CRC32C checksum", name)
	}
	return append([]byte(nil), p.GetData()...), nil
}

// notFound reports a missing secret or version (gRPC NOT_FOUND or HTTP 404).
func notFound(err error) bool {
	var ae *apierror.APIError
	if !errors.As(err, &ae) {
		return false
	}
	return ae.HTTPCode() == http.StatusNotFound || (ae.GRPCStatus() != nil && ae.GRPCStatus().Code() == codes.NotFound)
}
