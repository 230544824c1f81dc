package devs3

import (
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/stretchr/testify/require"
)

// awsExample is the signed streaming upload of AWS's documentation
// ("Signature calculations for the Authorization header: transferring
// payload in multiple chunks"): 65536 + 1024 bytes of 'a' in two chunks,
// with the published seed and chunk signatures.
func awsExample(tamper bool) string {
	first := strings.Repeat("a", 65536)
	if tamper {
		first = "b" + first[1:]
	}
	return "10000;chunk-signature=ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648\r\n" + first + "\r\n" +
		"400;chunk-signature=0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497\r\n" + strings.Repeat("a", 1024) + "\r\n" +
		"0;chunk-signature=b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9\r\n\r\n"
}

func decodeAWSExample(t *testing.T, tamper bool) ([]byte, error, *bodyCheck) {
	t.Helper()
	seed, err := hex.DecodeString("4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9")
	require.NoError(t, err)
	creds := aws.Credentials{AccessKeyID: "AKIAIOSFODNN7EXAMPLE", SecretAccessKey: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}
	at := time.Date(2013, 5, 24, 0, 0, 0, 0, time.UTC)
	req, err := http.NewRequest(http.MethodPut, "http://s3.amazonaws.com/examplebucket/chunkObject.txt", strings.NewReader(awsExample(tamper)))
	require.NoError(t, err)
	check := &bodyCheck{}
	req = req.WithContext(context.WithValue(req.Context(), bodyCheckKey{}, check))
	req.Header.Set("X-Amz-Decoded-Content-Length", "66560")
	req.Header.Set("X-Amz-Content-Sha256", streamingSigned)
	req.Header.Set("Content-Encoding", "aws-chunked")
	require.Nil(t, decodeChunked(req, &chunkSigner{signer: v4.NewStreamSigner(creds, "s3", "us-east-1", seed), at: at}))
	require.Equal(t, int64(66560), req.ContentLength)
	require.Empty(t, req.Header.Get("Content-Encoding"), "aws-chunked is not the object's encoding")
	data, err := io.ReadAll(req.Body)
	return data, err, check
}

// TestChunkSignaturesMatchAWSExample checks chunk signatures against the
// values AWS publishes, so the check does not only agree with itself.
func TestChunkSignaturesMatchAWSExample(t *testing.T) {
	data, err, _ := decodeAWSExample(t, false)
	require.NoError(t, err)
	require.True(t, bytes.Equal(bytes.Repeat([]byte("a"), 66560), data))

	_, err, check := decodeAWSExample(t, true)
	require.Error(t, err)
	require.Equal(t, "SignatureDoesNotMatch", check.get().code)
}

func TestUnsignedChunkedWithTrailer(t *testing.T) {
	body := "5\r\nhello\r\n6\r\n world\r\n0\r\nx-amz-checksum-crc32:DUoRhQ==\r\n\r\n"
	req, err := http.NewRequest(http.MethodPut, "http://x/dev/k", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("X-Amz-Decoded-Content-Length", "11")
	req.Header.Set("X-Amz-Content-Sha256", streamingUnsignedTrailer)
	req.Header.Set("Content-Encoding", "aws-chunked,gzip")
	require.Nil(t, decodeChunked(req, nil))
	require.Equal(t, "gzip", req.Header.Get("Content-Encoding"))
	data, err := io.ReadAll(req.Body)
	require.NoError(t, err)
	require.Equal(t, "hello world", string(data))

	for name, bad := range map[string]string{
		"cut inside a chunk": "5\r\nhel",
		"no CRLF after data": "5\r\nhelloXX0\r\n\r\n",
		"size is not hex":    "zz\r\nhello\r\n",
		"header never ends":  strings.Repeat("5", 5000),
	} {
		req, err := http.NewRequest(http.MethodPut, "http://x/dev/k", strings.NewReader(bad))
		require.NoError(t, err)
		req.Header.Set("X-Amz-Decoded-Content-Length", "5")
		require.Nil(t, decodeChunked(req, nil))
		_, err = io.ReadAll(req.Body)
		require.Error(t, err, name)
	}
}
