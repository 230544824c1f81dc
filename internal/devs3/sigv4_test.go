package devs3_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/devs3"
	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
)

const (
	testAK = "devkey"
	testSK = "devsecret"
)

type xmlError struct {
	Code string `xml:"Code"`
}

// rawCall sends req and returns the status and S3 error code.
func rawCall(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	var e xmlError
	_ = xml.Unmarshal(body, &e)
	return res.StatusCode, e.Code
}

func signedRequest(t *testing.T, method, url string, body []byte, payloadHash, secret string, at time.Time) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("X-Amz-Content-Sha256", payloadHash)
	require.NoError(t, v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true }).SignHTTP(context.Background(),
		aws.Credentials{AccessKeyID: testAK, SecretAccessKey: secret}, req, payloadHash, "s3", "us-east-1", at))
	return req
}

func hashHex(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestSignatures(t *testing.T) {
	dir := t.TempDir()
	srv := devs3test.StartWith(t, devs3.Config{Dir: dir, AccessKey: testAK, SecretKey: testSK})
	ctx := context.Background()
	good := devs3test.ClientWith(srv.URL, testAK, testSK)

	t.Run("signed SDK requests work", func(t *testing.T) {
		_, err := good.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("dev"), Key: aws.String("a/b c+d.txt"), Body: strings.NewReader("hello")})
		require.NoError(t, err)
		out, err := good.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("dev"), Key: aws.String("a/b c+d.txt")})
		require.NoError(t, err)
		data, _ := io.ReadAll(out.Body)
		out.Body.Close()
		require.Equal(t, "hello", string(data))
		list, err := good.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("dev"), Prefix: aws.String("a/")})
		require.NoError(t, err)
		require.Len(t, list.Contents, 1)
		// A multipart upload, signed part by part.
		up, err := good.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("dev"), Key: aws.String("mp")})
		require.NoError(t, err)
		part, err := good.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("dev"), Key: aws.String("mp"), UploadId: up.UploadId,
			PartNumber: aws.Int32(1), Body: bytes.NewReader([]byte("part one"))})
		require.NoError(t, err)
		_, err = good.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("dev"), Key: aws.String("mp"), UploadId: up.UploadId,
			MultipartUpload: &types.CompletedMultipartUpload{Parts: []types.CompletedPart{{PartNumber: aws.Int32(1), ETag: part.ETag}}}})
		require.NoError(t, err)
		data, err = os.ReadFile(filepath.Join(dir, "mp"))
		require.NoError(t, err)
		require.Equal(t, "part one", string(data))
	})

	t.Run("refusals", func(t *testing.T) {
		cases := []struct {
			name   string
			client *s3.Client
			code   string
		}{
			{name: "wrong secret", client: devs3test.ClientWith(srv.URL, testAK, "other"), code: "SignatureDoesNotMatch"},
			{name: "unknown key", client: devs3test.ClientWith(srv.URL, "nobody", testSK), code: "InvalidAccessKeyId"},
			{name: "anonymous", client: s3.New(s3.Options{BaseEndpoint: aws.String(srv.URL), Region: "us-east-1", UsePathStyle: true, Credentials: aws.AnonymousCredentials{}}), code: "AccessDenied"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				_, err := tc.client.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("dev"), Key: aws.String("refused"), Body: strings.NewReader("x")})
				require.Error(t, err)
				require.Equal(t, tc.code, apiCode(err), "%v", err)
				var re interface{ HTTPStatusCode() int }
				require.True(t, errors.As(err, &re))
				require.Equal(t, http.StatusForbidden, re.HTTPStatusCode())
				_, err = tc.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("dev"), Key: aws.String("a/b c+d.txt")})
				require.Equal(t, tc.code, apiCode(err), "%v", err)
			})
		}
		require.NoFileExists(t, filepath.Join(dir, "refused"))

		// Plain HTTP without any signature.
		res, err := http.Get(srv.URL + "/dev/a/b%20c%2Bd.txt")
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusForbidden, res.StatusCode)
		// /healthz stays open.
		res, err = http.Get(srv.URL + "/healthz")
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode)

		// A signature from an hour ago.
		code, s3code := rawCall(t, signedRequest(t, http.MethodGet, srv.URL+"/dev/a/b%20c%2Bd.txt", nil, hashHex(nil), testSK, time.Now().Add(-time.Hour)))
		require.Equal(t, http.StatusForbidden, code)
		require.Equal(t, "RequestTimeTooSkewed", s3code)
		// The signed path differs from the one requested.
		req := signedRequest(t, http.MethodGet, srv.URL+"/dev/a/other", nil, hashHex(nil), testSK, time.Now())
		req.URL.Path, req.URL.RawPath = "/dev/a/b c+d.txt", "/dev/a/b%20c%2Bd.txt"
		code, s3code = rawCall(t, req)
		require.Equal(t, http.StatusForbidden, code)
		require.Equal(t, "SignatureDoesNotMatch", s3code)
	})

	t.Run("payload hash is checked", func(t *testing.T) {
		// Signed for one body, sent with another: refused, nothing stored.
		req := signedRequest(t, http.MethodPut, srv.URL+"/dev/tampered", []byte("other body"), hashHex([]byte("signed body")), testSK, time.Now())
		code, s3code := rawCall(t, req)
		require.Equal(t, http.StatusBadRequest, code)
		require.Equal(t, "XAmzContentSHA256Mismatch", s3code)
		require.NoFileExists(t, filepath.Join(dir, "tampered"))
		// The same for a part of a multipart upload.
		up, err := good.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("dev"), Key: aws.String("mp2")})
		require.NoError(t, err)
		req = signedRequest(t, http.MethodPut, srv.URL+"/dev/mp2?partNumber=1&uploadId="+*up.UploadId, []byte("other body"), hashHex([]byte("signed body")), testSK, time.Now())
		code, s3code = rawCall(t, req)
		require.Equal(t, http.StatusBadRequest, code)
		require.Equal(t, "XAmzContentSHA256Mismatch", s3code)
		parts, err := good.ListParts(ctx, &s3.ListPartsInput{Bucket: aws.String("dev"), Key: aws.String("mp2"), UploadId: up.UploadId})
		require.NoError(t, err)
		require.Empty(t, parts.Parts)
	})

	t.Run("presigned URLs", func(t *testing.T) {
		pc := s3.NewPresignClient(good)
		put, err := pc.PresignPutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("dev"), Key: aws.String("pre/signed")}, s3.WithPresignExpires(5*time.Minute))
		require.NoError(t, err)
		req, err := http.NewRequest(put.Method, put.URL, strings.NewReader("via presigned URL"))
		require.NoError(t, err)
		for k, v := range put.SignedHeader {
			if k != "Host" {
				req.Header[k] = v
			}
		}
		code, s3code := rawCall(t, req)
		require.Equal(t, http.StatusOK, code, s3code)
		get, err := pc.PresignGetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("dev"), Key: aws.String("pre/signed")}, s3.WithPresignExpires(5*time.Minute))
		require.NoError(t, err)
		res, err := http.Get(get.URL)
		require.NoError(t, err)
		data, _ := io.ReadAll(res.Body)
		res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.Equal(t, "via presigned URL", string(data))

		// Another key with the same signature; an expired URL.
		code, s3code = rawCall(t, mustRequest(t, http.MethodGet, strings.Replace(get.URL, "pre/signed", "a/b%20c%2Bd.txt", 1)))
		require.Equal(t, http.StatusForbidden, code)
		require.Equal(t, "SignatureDoesNotMatch", s3code)
		old, err := pc.PresignGetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("dev"), Key: aws.String("pre/signed")}, s3.WithPresignExpires(time.Second))
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			code, s3code = rawCall(t, mustRequest(t, http.MethodGet, old.URL))
			return code == http.StatusForbidden
		}, 10*time.Second, 200*time.Millisecond, "the URL expires after a second")
		require.Equal(t, "AccessDenied", s3code)
	})
}

func mustRequest(t *testing.T, method, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	return req
}

// TestSignedStreamingUpload sends STREAMING-AWS4-HMAC-SHA256-PAYLOAD
// bodies (aws-chunked, every chunk signed) as some SDKs do.
func TestSignedStreamingUpload(t *testing.T) {
	dir := t.TempDir()
	srv := devs3test.StartWith(t, devs3.Config{Dir: dir, AccessKey: testAK, SecretKey: testSK})
	data := bytes.Repeat([]byte("0123456789abcdef"), 5000) // 80000 bytes: two chunks
	send := func(key string, tamper bool) (int, string) {
		at := time.Now().UTC()
		chunks := [][]byte{data[:65536], data[65536:], nil}
		var size int
		for _, c := range chunks {
			size += len(fmt.Sprintf("%x;chunk-signature=%064d\r\n", len(c), 0)) + len(c) + 2
		}
		req, err := http.NewRequest(http.MethodPut, srv.URL+"/dev/"+key, nil)
		require.NoError(t, err)
		req.ContentLength = int64(size)
		req.Header.Set("X-Amz-Content-Sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")
		req.Header.Set("X-Amz-Decoded-Content-Length", fmt.Sprint(len(data)))
		req.Header.Set("Content-Encoding", "aws-chunked")
		creds := aws.Credentials{AccessKeyID: testAK, SecretAccessKey: testSK}
		require.NoError(t, v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true }).SignHTTP(context.Background(), creds, req,
			"STREAMING-AWS4-HMAC-SHA256-PAYLOAD", "s3", "us-east-1", at))
		_, seedHex, _ := strings.Cut(req.Header.Get("Authorization"), "Signature=")
		seed, err := hex.DecodeString(seedHex)
		require.NoError(t, err)
		ss := v4.NewStreamSigner(creds, "s3", "us-east-1", seed)
		var body bytes.Buffer
		for i, c := range chunks {
			sig, err := ss.GetSignature(context.Background(), nil, c, at)
			require.NoError(t, err)
			payload := c
			if tamper && i == 1 {
				payload = bytes.ToUpper(c)
			}
			fmt.Fprintf(&body, "%x;chunk-signature=%x\r\n", len(c), sig)
			body.Write(payload)
			body.WriteString("\r\n")
		}
		require.Equal(t, size, body.Len())
		req.Body = io.NopCloser(&body)
		return rawCall(t, req)
	}
	code, s3code := send("streamed", false)
	require.Equal(t, http.StatusOK, code, s3code)
	got, err := os.ReadFile(filepath.Join(dir, "streamed"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got), "stored bytes are the decoded payload")

	code, s3code = send("tampered", true)
	require.Equal(t, http.StatusForbidden, code)
	require.Equal(t, "SignatureDoesNotMatch", s3code)
	require.NoFileExists(t, filepath.Join(dir, "tampered"))
}
