package devs3_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/devs3"
	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
)

const bucket = devs3test.Bucket

func md5hex(b []byte) string {
	s := md5.Sum(b)
	return hex.EncodeToString(s[:])
}

func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

func TestHealthz(t *testing.T) {
	srv := devs3test.Start(t, "")
	resp, err := http.Get(srv.URL + "/healthz")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// rawRequest sends bytes exactly as given, so no client cleans the path.
func rawRequest(t *testing.T, addr, method, target, body string) (int, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", method, target, addr, len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

func TestPathEscapeRejected(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "bucket")
	require.NoError(t, os.WriteFile(filepath.Join(base, "secret.txt"), []byte("do not serve"), 0o644))
	srv := devs3test.Start(t, dir)
	addr := strings.TrimPrefix(srv.URL, "http://")
	targets := []string{
		"/dev/../secret.txt",
		"/dev/..%2Fsecret.txt",
		"/dev/%2E%2E%2Fsecret.txt",
		"/dev/a/..%2F..%2Fsecret.txt",
		"/dev/a/%2e%2e/%2e%2e/secret.txt",
		"/dev/%2Fetc%2Fpasswd",
		"/dev//etc/passwd",
		"/dev/.dev-s3/locks/00",
		"/dev/x%00y",
	}
	for _, target := range targets {
		for _, method := range []string{"GET", "PUT", "DELETE", "HEAD"} {
			t.Run(method+" "+target, func(t *testing.T) {
				status, body := rawRequest(t, addr, method, target, "overwritten")
				require.Equal(t, http.StatusBadRequest, status, body)
				if method != "HEAD" {
					require.Contains(t, body, "<Code>InvalidArgument</Code>")
				}
			})
		}
	}
	data, err := os.ReadFile(filepath.Join(base, "secret.txt"))
	require.NoError(t, err)
	require.Equal(t, "do not serve", string(data))
	entries, err := os.ReadDir(base)
	require.NoError(t, err)
	require.Len(t, entries, 2, "nothing was written next to the bucket directory")
}

func TestStartupErrors(t *testing.T) {
	base := t.TempDir()
	file := filepath.Join(base, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	ro := "/proc"
	if os.Geteuid() != 0 {
		ro = filepath.Join(base, "ro")
		require.NoError(t, os.Mkdir(ro, 0o555))
	}
	tests := []struct{ name, dir, bucket, want string }{
		{"cannot create", filepath.Join(file, "sub"), "dev", "create bucket directory"},
		{"not a directory", file, "dev", "not a directory"},
		{"not writable", ro, "dev", "not writable"},
		{"bad bucket name", filepath.Join(base, "ok"), "Bad_Bucket!", "bucket name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := devs3.New(devs3.Config{Bucket: tc.bucket, Dir: tc.dir, Log: logr.Discard()})
			require.ErrorContains(t, err, tc.want)
		})
	}
	t.Run("missing directory is created", func(t *testing.T) {
		dir := filepath.Join(base, "a", "b")
		srv, err := devs3.New(devs3.Config{Dir: dir, Log: logr.Discard()})
		require.NoError(t, err)
		require.Equal(t, dir, srv.Dir())
		require.DirExists(t, dir)
	})
}

func TestPlainFilesAndMetadata(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	srv := devs3test.Start(t, dir)
	c := devs3test.Client(srv.URL)

	// Written by hand, served as an object with an MD5 ETag.
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "cluster"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cluster", "ca.crt"), []byte("PEM"), 0o644))
	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("cluster/ca.crt")})
	require.NoError(t, err)
	body, _ := io.ReadAll(out.Body)
	out.Body.Close()
	require.Equal(t, "PEM", string(body))
	require.Equal(t, `"`+md5hex([]byte("PEM"))+`"`, aws.ToString(out.ETag))

	// Written through S3: a plain file, metadata kept in the hidden sidecar.
	_, err = c.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(bucket), Key: aws.String("config/dev-1.jsonc"), Body: strings.NewReader(`{"x":1}`),
		ContentType: aws.String("application/jsonc"), Metadata: map[string]string{"owner": "test"},
	})
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(dir, "config", "dev-1.jsonc"))
	require.NoError(t, err)
	require.Equal(t, `{"x":1}`, string(data))
	head, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String("config/dev-1.jsonc")})
	require.NoError(t, err)
	require.Equal(t, "application/jsonc", aws.ToString(head.ContentType))
	require.Equal(t, "test", head.Metadata["owner"])
	require.Equal(t, int64(7), aws.ToInt64(head.ContentLength))

	// Range reads.
	rng, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("config/dev-1.jsonc"), Range: aws.String("bytes=1-3")})
	require.NoError(t, err)
	part, _ := io.ReadAll(rng.Body)
	rng.Body.Close()
	require.Equal(t, `"x"`, string(part))

	// The hidden tree is not listed.
	list, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(bucket)})
	require.NoError(t, err)
	var keys []string
	for _, o := range list.Contents {
		keys = append(keys, aws.ToString(o.Key))
	}
	require.Equal(t, []string{"cluster/ca.crt", "config/dev-1.jsonc"}, keys)

	_, err = c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("missing")})
	require.Equal(t, "NoSuchKey", apiCode(err))
	_, err = c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("other"), Key: aws.String("cluster/ca.crt")})
	require.Equal(t, "NoSuchBucket", apiCode(err))
}

func TestListDelimiterAndPaging(t *testing.T) {
	ctx := context.Background()
	srv := devs3test.Start(t, "")
	c := devs3test.Client(srv.URL)
	for _, k := range []string{"a-x", "a/1", "a/2/deep", "a/3", "b/1", "b/2", "c", "d/e/f"} {
		_, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(k), Body: strings.NewReader(k)})
		require.NoError(t, err)
	}
	tests := []struct {
		prefix, delim string
		max           int32
		wantKeys      []string
		wantPrefixes  []string
	}{
		{"", "/", 1000, []string{"a-x", "c"}, []string{"a/", "b/", "d/"}},
		{"", "/", 2, []string{"a-x", "c"}, []string{"a/", "b/", "d/"}},
		{"a/", "/", 1, []string{"a/1", "a/3"}, []string{"a/2/"}},
		{"a", "", 2, []string{"a-x", "a/1", "a/2/deep", "a/3"}, nil},
		{"", "", 3, []string{"a-x", "a/1", "a/2/deep", "a/3", "b/1", "b/2", "c", "d/e/f"}, nil},
		{"zzz", "/", 10, nil, nil},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("prefix=%q delim=%q max=%d", tc.prefix, tc.delim, tc.max), func(t *testing.T) {
			in := &s3.ListObjectsV2Input{Bucket: aws.String(bucket), MaxKeys: aws.Int32(tc.max)}
			if tc.prefix != "" {
				in.Prefix = aws.String(tc.prefix)
			}
			if tc.delim != "" {
				in.Delimiter = aws.String(tc.delim)
			}
			var keys, prefixes []string
			pages := 0
			p := s3.NewListObjectsV2Paginator(c, in)
			for p.HasMorePages() {
				page, err := p.NextPage(ctx)
				require.NoError(t, err)
				pages++
				require.LessOrEqual(t, len(page.Contents)+len(page.CommonPrefixes), int(tc.max))
				for _, o := range page.Contents {
					keys = append(keys, aws.ToString(o.Key))
					require.Equal(t, `"`+md5hex([]byte(aws.ToString(o.Key)))+`"`, aws.ToString(o.ETag))
				}
				for _, cp := range page.CommonPrefixes {
					prefixes = append(prefixes, aws.ToString(cp.Prefix))
				}
			}
			require.Equal(t, tc.wantKeys, keys)
			require.Equal(t, tc.wantPrefixes, prefixes)
			want := (len(tc.wantKeys) + len(tc.wantPrefixes) + int(tc.max) - 1) / int(tc.max)
			require.Equal(t, max(want, 1), pages)
		})
	}
}

func TestConditionalPut(t *testing.T) {
	ctx := context.Background()
	srv := devs3test.Start(t, "")
	c := devs3test.Client(srv.URL)
	put := func(key, body string, ifNone bool, ifMatch string) (*s3.PutObjectOutput, error) {
		in := &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: strings.NewReader(body)}
		if ifNone {
			in.IfNoneMatch = aws.String("*")
		}
		if ifMatch != "" {
			in.IfMatch = aws.String(ifMatch)
		}
		return c.PutObject(ctx, in)
	}
	out, err := put("k", "v1", true, "")
	require.NoError(t, err)
	e1 := aws.ToString(out.ETag)
	_, err = put("k", "v2", true, "")
	require.Equal(t, "PreconditionFailed", apiCode(err))
	out, err = put("k", "v2", false, e1)
	require.NoError(t, err)
	_, err = put("k", "v3", false, e1)
	require.Equal(t, "PreconditionFailed", apiCode(err))
	_, err = put("k", "v3", false, strings.Trim(aws.ToString(out.ETag), `"`)) // unquoted is accepted too
	require.NoError(t, err)

	// The raw 412 carries an S3 XML error body.
	req, err := http.NewRequest(http.MethodPut, srv.URL+"/dev/k", strings.NewReader("v4"))
	require.NoError(t, err)
	req.Header.Set("If-None-Match", "*")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusPreconditionFailed, resp.StatusCode)
	require.Contains(t, string(body), "<Code>PreconditionFailed</Code>")
}

func TestConcurrentCreateOnly(t *testing.T) {
	ctx := context.Background()
	srv := devs3test.Start(t, "")
	c := devs3test.Client(srv.URL)
	for round := range 3 {
		key := fmt.Sprintf("cluster/leader-%d.json", round)
		var wg sync.WaitGroup
		codes := make([]string, 20)
		for i := range codes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key),
					Body: strings.NewReader(fmt.Sprint(i)), IfNoneMatch: aws.String("*")})
				if err == nil {
					codes[i] = "OK"
				} else {
					codes[i] = apiCode(err)
				}
			}()
		}
		wg.Wait()
		counts := map[string]int{}
		for _, code := range codes {
			counts[code]++
		}
		require.Equal(t, map[string]int{"OK": 1, "PreconditionFailed": 19}, counts)
	}
}

func TestMultipartConditionalComplete(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	srv := devs3test.Start(t, dir)
	c := devs3test.Client(srv.URL)
	part1 := bytes.Repeat([]byte("a"), 5<<20)
	part2 := []byte("tail")
	upload := func(key string) (string, []types.CompletedPart) {
		cr, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String(key)})
		require.NoError(t, err)
		var parts []types.CompletedPart
		for i, p := range [][]byte{part1, part2} {
			up, err := c.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String(bucket), Key: aws.String(key), UploadId: cr.UploadId,
				PartNumber: aws.Int32(int32(i + 1)), Body: bytes.NewReader(p)})
			require.NoError(t, err)
			parts = append(parts, types.CompletedPart{ETag: up.ETag, PartNumber: aws.Int32(int32(i + 1))})
		}
		return aws.ToString(cr.UploadId), parts
	}
	complete := func(key, id string, parts []types.CompletedPart, ifNone bool, ifMatch string) (*s3.CompleteMultipartUploadOutput, error) {
		in := &s3.CompleteMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String(key), UploadId: aws.String(id),
			MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}}
		if ifNone {
			in.IfNoneMatch = aws.String("*")
		}
		if ifMatch != "" {
			in.IfMatch = aws.String(ifMatch)
		}
		return c.CompleteMultipartUpload(ctx, in)
	}
	whole := append(append([]byte{}, part1...), part2...)

	id, parts := upload("big")
	out, err := complete("big", id, parts, true, "")
	require.NoError(t, err)
	require.Equal(t, `"`+md5hex(whole)+`"`, aws.ToString(out.ETag))
	data, err := os.ReadFile(filepath.Join(dir, "big"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(whole, data))

	id, parts = upload("big")
	_, err = complete("big", id, parts, true, "")
	require.Equal(t, "PreconditionFailed", apiCode(err), "create-only complete over an existing key")
	_, err = complete("big", id, parts, false, `"0123"`)
	require.Equal(t, "PreconditionFailed", apiCode(err), "stale If-Match")
	_, err = complete("big", id, parts, false, aws.ToString(out.ETag))
	require.NoError(t, err, "matching If-Match")
}

// Stopping the server and starting a new one on the same directory keeps
// every object, its ETag and its metadata.
func TestRestartKeepsData(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	type obj struct{ etag, ctype string }
	want := map[string]obj{}
	{
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		srv, err := devs3.Start(ctx, ln, devs3.Config{Bucket: bucket, Dir: dir, Log: logr.Discard()})
		require.NoError(t, err)
		c := devs3test.Client(srv.URL)
		for i := range 30 {
			key := fmt.Sprintf("shard/dev-1/instances/i-%02d.json", i)
			out, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key),
				Body: strings.NewReader(fmt.Sprintf(`{"n":%d}`, i)), ContentType: aws.String("application/json")})
			require.NoError(t, err)
			want[key] = obj{aws.ToString(out.ETag), "application/json"}
		}
		require.NoError(t, srv.Stop())
		_, err = c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String("shard/dev-1/instances/i-00.json")})
		require.Error(t, err, "the stopped server no longer answers")
	}
	srv := devs3test.Start(t, dir)
	c := devs3test.Client(srv.URL)
	list, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(bucket)})
	require.NoError(t, err)
	require.Len(t, list.Contents, len(want))
	for key, w := range want {
		h, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
		require.NoError(t, err)
		require.Equal(t, w.etag, aws.ToString(h.ETag))
		require.Equal(t, w.ctype, aws.ToString(h.ContentType))
	}
}

func TestDeleteObjects(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	srv := devs3test.Start(t, dir)
	c := devs3test.Client(srv.URL)
	for _, k := range []string{"x/1", "x/2"} {
		_, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(k), Body: strings.NewReader(k)})
		require.NoError(t, err)
	}
	out, err := c.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: aws.String(bucket), Delete: &types.Delete{Objects: []types.ObjectIdentifier{
		{Key: aws.String("x/1")}, {Key: aws.String("x/2")}, {Key: aws.String("../escape")},
	}}})
	require.NoError(t, err)
	require.Len(t, out.Deleted, 2)
	require.Len(t, out.Errors, 1)
	require.Equal(t, "../escape", aws.ToString(out.Errors[0].Key))
	require.NoDirExists(t, filepath.Join(dir, "x"), "empty directories are pruned")
}
