// Package devs3test starts an in-process dev-s3 for tests and gives S3
// clients pointed at it.
package devs3test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/devs3"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/s3store"
)

// Bucket is the bucket name the helpers use.
const Bucket = "dev"

// Start runs dev-s3 on 127.0.0.1:0 over dir (a fresh temp dir when empty)
// and stops it when the test ends.
func Start(t testing.TB, dir string) *devs3.Running {
	t.Helper()
	return StartWithLog(t, dir, testr.NewWithInterface(t, testr.Options{Verbosity: 0}))
}

// StartWithLog is Start with a chosen logger.
func StartWithLog(t testing.TB, dir string, log logr.Logger) *devs3.Running {
	t.Helper()
	return StartWith(t, devs3.Config{Dir: dir, Log: log})
}

// StartWith runs dev-s3 with cfg on 127.0.0.1:0; an empty Bucket is
// Bucket, an empty Dir a fresh temp dir, a zero Log the test log.
func StartWith(t testing.TB, cfg devs3.Config) *devs3.Running {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.Bucket == "" {
		cfg.Bucket = Bucket
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = testr.NewWithInterface(t, testr.Options{Verbosity: 0})
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r, err := devs3.Start(context.Background(), ln, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Stop()) })
	return r
}

// ClientWith is Client with the given key pair.
func ClientWith(endpoint, accessKey, secretKey string) *s3.Client {
	return s3.New(s3.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider(accessKey, secretKey, ""),
		UsePathStyle: true,
		DisableLogOutputChecksumValidationSkipped: true,
	})
}

// Client returns an SDK client for endpoint with static dev credentials,
// path-style addressing and no shared config files.
func Client(endpoint string) *s3.Client { return ClientWith(endpoint, "dev", "dev") }

// Serve is for programs that are not tests (the benchmarks): it runs
// dev-s3 over dir on 127.0.0.1:0 until stop is called and returns an
// object store on it whose client keeps up to conns idle connections (the
// load's concurrency). Stopping ctx stops dev-s3 as well.
func Serve(ctx context.Context, dir string, conns int) (st objstore.Store, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, fmt.Errorf("dev-s3 listener: %w", err)
	}
	srv, err := devs3.Start(ctx, ln, devs3.Config{Bucket: Bucket, Dir: dir, Log: logr.Discard()})
	if err != nil {
		return nil, nil, fmt.Errorf("starting dev-s3 over %s: %w", dir, err)
	}
	client := s3.New(s3.Options{
		BaseEndpoint: aws.String(srv.URL), Region: "us-east-1", UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider("dev", "dev", ""),
		HTTPClient:  &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns}},
	}, s3store.Tune)
	if st, err = s3store.NewWithClient(client, Bucket, ""); err != nil {
		_ = srv.Stop()
		return nil, nil, err
	}
	return st, func() { _ = srv.Stop() }, nil
}
