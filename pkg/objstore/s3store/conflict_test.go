package s3store_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/s3store"
)

// conflictServer answers the first `fail` PUTs with 409 and code, then
// stores nothing and answers 200 with an ETag; it counts the PUTs.
func conflictServer(t *testing.T, code string, fail int64) (*s3store.Store, *atomic.Int64) {
	t.Helper()
	var puts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Method != http.MethodPut {
			http.Error(w, "unexpected "+r.Method, http.StatusMethodNotAllowed)
			return
		}
		if n := puts.Add(1); n <= fail {
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>`+code+`</Code><Message>conflict</Message></Error>`)
			return
		}
		w.Header().Set("ETag", `"0123456789abcdef0123456789abcdef"`)
	}))
	t.Cleanup(srv.Close)
	client := s3.New(s3.Options{BaseEndpoint: aws.String(srv.URL), Region: "us-east-1", UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider("key", "secret", "")})
	st, err := s3store.NewWithClient(client, "b", "")
	require.NoError(t, err)
	return st, &puts
}

// Versity Gateway answers 409 ExistingObjectIsDirectory to a PUT that
// raced the removal of its parent directory: that is tried again, and never
// read as a failed precondition (a create-only write would look taken).
// Other 409s keep their meaning.
func TestConflictCodes(t *testing.T) {
	ctx := context.Background()
	t.Run("directory race, then stored", func(t *testing.T) {
		st, puts := conflictServer(t, "ExistingObjectIsDirectory", 2)
		etag, err := st.Put(ctx, "shard/c1/probe/x", []byte("x"), objstore.PutOptions{IfNoneMatch: true})
		require.NoError(t, err)
		require.Equal(t, "0123456789abcdef0123456789abcdef", etag)
		require.EqualValues(t, 3, puts.Load())
	})
	t.Run("directory race every time", func(t *testing.T) {
		st, puts := conflictServer(t, "ExistingObjectIsDirectory", 1000)
		_, err := st.Put(ctx, "shard/c1/probe/x", []byte("x"), objstore.PutOptions{IfNoneMatch: true})
		require.Error(t, err)
		require.False(t, errors.Is(err, objstore.ErrPreconditionFailed), "%v", err)
		require.ErrorContains(t, err, "ExistingObjectIsDirectory")
		require.EqualValues(t, 5, puts.Load())
	})
	t.Run("a conditional conflict is a failed precondition", func(t *testing.T) {
		st, puts := conflictServer(t, "ConditionalRequestConflict", 1000)
		_, err := st.Put(ctx, "k", []byte("x"), objstore.PutOptions{IfNoneMatch: true})
		require.ErrorIs(t, err, objstore.ErrPreconditionFailed)
		require.EqualValues(t, 1, puts.Load(), "not retried")
	})
}
