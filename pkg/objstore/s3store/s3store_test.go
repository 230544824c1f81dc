package s3store_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/objstoretest"
	"github.com/nstance-dev/nstance/pkg/objstore/s3store"
)

// The contract runs against a real dev-s3 over HTTP, one server per case.
func TestContract(t *testing.T) {
	objstoretest.Run(t, func(t *testing.T) objstore.Store {
		srv := devs3test.Start(t, "")
		s, err := s3store.NewWithClient(devs3test.Client(srv.URL), devs3test.Bucket, "")
		require.NoError(t, err)
		return s
	})
}

// With a key prefix, the contract still holds and objects land under it.
func TestContractWithPrefix(t *testing.T) {
	objstoretest.Run(t, func(t *testing.T) objstore.Store {
		srv := devs3test.Start(t, "")
		s, err := s3store.NewWithClient(devs3test.Client(srv.URL), devs3test.Bucket, "tenant/a")
		require.NoError(t, err)
		return s
	}, objstoretest.WithMaxKeyLength(objstore.MaxKeyLength-len("tenant/a/")))
}

// isolateAWSEnv points every AWS variable and config file at the test.
func isolateAWSEnv(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(home, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(home, "credentials"))
	for _, v := range []string{"AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"} {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
}

func TestNewFromEnvironment(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	srv := devs3test.Start(t, dir)
	isolateAWSEnv(t)
	t.Setenv("AWS_ENDPOINT_URL", srv.URL)
	t.Setenv("AWS_ACCESS_KEY_ID", "dev")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "dev")
	t.Setenv("AWS_REGION", "")
	os.Unsetenv("AWS_REGION")
	t.Setenv("AWS_S3_USE_PATH_STYLE", "true")

	s, err := s3store.New(ctx, devs3test.Bucket, "pfx")
	require.NoError(t, err)
	_, err = s.Put(ctx, "cluster/ca.crt", []byte("PEM"), objstore.PutOptions{})
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(dir, "pfx", "cluster", "ca.crt"))
	require.NoError(t, err)
	require.Equal(t, "PEM", string(data))
	require.Equal(t, "us-east-1", s.Client().Options().Region)
	list, err := s.List(ctx, "")
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "cluster/ca.crt", list[0].Key)
}

func TestNewRejectsBadInput(t *testing.T) {
	isolateAWSEnv(t)
	t.Setenv("AWS_S3_USE_PATH_STYLE", "maybe")
	_, err := s3store.New(context.Background(), "dev", "")
	require.ErrorContains(t, err, "AWS_S3_USE_PATH_STYLE")
	t.Setenv("AWS_S3_USE_PATH_STYLE", "true")
	_, err = s3store.New(context.Background(), "", "")
	require.ErrorContains(t, err, "bucket")
	_, err = s3store.New(context.Background(), "dev", "../up")
	require.ErrorIs(t, err, objstore.ErrInvalidKey)
}

// Listing more than one page (dev-s3 pages at 1000 keys) returns everything.
func TestListAllPages(t *testing.T) {
	ctx := context.Background()
	srv := devs3test.Start(t, "")
	s, err := s3store.NewWithClient(devs3test.Client(srv.URL), devs3test.Bucket, "")
	require.NoError(t, err)
	const n = 1203
	for i := range n {
		_, err := s.Put(ctx, "many/"+strings.Repeat("0", 4-len(itoa(i)))+itoa(i), []byte("x"), objstore.PutOptions{})
		require.NoError(t, err)
	}
	list, err := s.List(ctx, "many/")
	require.NoError(t, err)
	require.Len(t, list, n)
	for i := 1; i < len(list); i++ {
		require.Less(t, list[i-1].Key, list[i].Key)
	}
}

func itoa(i int) string {
	const digits = "0123456789"
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{digits[i%10]}, b...)
	}
	return string(b)
}
