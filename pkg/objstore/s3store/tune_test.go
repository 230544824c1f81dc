package s3store_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/devs3"
	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/objstoretest"
	"github.com/nstance-dev/nstance/pkg/objstore/s3store"
)

// wire counts the writes of the client's connections.
type wire struct {
	writes atomic.Int64
}

type countingConn struct {
	net.Conn
	w *wire
}

func (c countingConn) Write(p []byte) (int, error) {
	c.w.writes.Add(1)
	return c.Conn.Write(p)
}

// tunedStore runs dev-s3 with signature checks (so the signed payload hash
// is verified) and returns a store on it; tune says
// whether the client is built with s3store.Tune.
func tunedStore(t *testing.T, tune bool) (*s3store.Store, *wire) {
	t.Helper()
	w := &wire{}
	srv, err := devs3.New(devs3.Config{Dir: t.TempDir(), Bucket: devs3test.Bucket, AccessKey: "key", SecretKey: "secret"})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: time.Minute}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	var d net.Dialer
	opts := s3.Options{
		BaseEndpoint: aws.String("http://" + ln.Addr().String()), Region: "us-east-1", UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider("key", "secret", ""),
		HTTPClient: &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countingConn{c, w}, nil
		}}},
	}
	var client *s3.Client
	if tune {
		client = s3.New(opts, s3store.Tune)
	} else {
		client = s3.New(opts)
	}
	st, err := s3store.NewWithClient(client, devs3test.Bucket, "")
	require.NoError(t, err)
	return st, w
}

// The contract holds with a tuned client against a dev-s3 that checks
// signatures, bodies of every size included.
func TestContractTuned(t *testing.T) {
	objstoretest.Run(t, func(t *testing.T) objstore.Store {
		st, _ := tunedStore(t, true)
		return st
	})
}

// A tuned client sends a small PUT in one write, an untuned one in two
// (so this test sees the difference).
func TestTunedPut(t *testing.T) {
	ctx := context.Background()
	for _, tune := range []bool{false, true} {
		st, w := tunedStore(t, tune)
		// Open the connection first: the dial and the first request are
		// not what is counted.
		_, err := st.Put(ctx, "warm", []byte("x"), objstore.PutOptions{})
		require.NoError(t, err)
		body := bytes.Repeat([]byte("n"), 1024)
		before := w.writes.Load()
		_, err = st.Put(ctx, "marker", body, objstore.PutOptions{IfNoneMatch: true})
		require.NoError(t, err)
		writes := w.writes.Load() - before
		_, err = st.Put(ctx, "marker", body, objstore.PutOptions{IfNoneMatch: true})
		require.ErrorIs(t, err, objstore.ErrPreconditionFailed)
		got, err := st.Get(ctx, "marker")
		require.NoError(t, err)
		require.Equal(t, body, got.Body)

		if tune {
			require.EqualValues(t, 1, writes, "tuned PUT of 1 KiB: headers and body in one write")
		} else {
			require.EqualValues(t, 2, writes, "untuned PUT: headers flushed apart from the body")
		}
	}
}

// A body larger than the in-memory limit is streamed as before.
func TestTunedLargePut(t *testing.T) {
	ctx := context.Background()
	st, _ := tunedStore(t, true)
	body := bytes.Repeat([]byte("L"), 64<<10+1)
	_, err := st.Put(ctx, "large", body, objstore.PutOptions{})
	require.NoError(t, err)
	got, err := st.Get(ctx, "large")
	require.NoError(t, err)
	require.Equal(t, body, got.Body)
}

// Tune asks for checksums only where required unless the environment chose
// (AWS_REQUEST_CHECKSUM_CALCULATION lands in the options), and wraps the
// HTTP client once.
func TestTuneOptions(t *testing.T) {
	for _, tc := range []struct {
		in, want aws.RequestChecksumCalculation
	}{
		{aws.RequestChecksumCalculationUnset, aws.RequestChecksumCalculationWhenRequired},
		{aws.RequestChecksumCalculationWhenSupported, aws.RequestChecksumCalculationWhenSupported},
		{aws.RequestChecksumCalculationWhenRequired, aws.RequestChecksumCalculationWhenRequired},
	} {
		o := s3.Options{RequestChecksumCalculation: tc.in}
		s3store.Tune(&o)
		require.Equal(t, tc.want, o.RequestChecksumCalculation)
		wrapped := o.HTTPClient
		require.NotNil(t, wrapped)
		s3store.Tune(&o)
		require.Equal(t, wrapped, o.HTTPClient, "a second Tune does not wrap again")
	}
}
