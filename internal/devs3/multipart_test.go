package devs3_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/devs3"
	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
)

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return b
}

// uploadDirs lists the upload directories under the bucket's hidden dir.
func uploadDirs(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, ".dev-s3", "uploads"))
	require.NoError(t, err)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func partFiles(t *testing.T, dir, id string) map[string]int64 {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, ".dev-s3", "uploads", id))
	require.NoError(t, err)
	out := map[string]int64{}
	for _, e := range ents {
		info, err := e.Info()
		require.NoError(t, err)
		out[e.Name()] = info.Size()
	}
	return out
}

// TestMultipartOnDisk follows an upload whose parts live in files, across
// a restart, through part replacement, listing and completion.
func TestMultipartOnDisk(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	first, err := devs3.Start(ctx, mustListen(t), devs3.Config{Bucket: bucket, Dir: dir, Log: logr.Discard()})
	require.NoError(t, err)
	c := devs3test.Client(first.URL)
	up, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String("big/object"), ContentType: aws.String("text/plain")})
	require.NoError(t, err)
	id := *up.UploadId
	require.Equal(t, []string{id}, uploadDirs(t, dir))

	p1, p2 := randomBytes(t, 5<<20), randomBytes(t, 1<<20)
	upload := func(c *s3.Client, n int32, body []byte) string {
		out, err := c.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String(bucket), Key: aws.String("big/object"), UploadId: up.UploadId, PartNumber: aws.Int32(n), Body: bytes.NewReader(body)})
		require.NoError(t, err)
		return *out.ETag
	}
	upload(c, 1, randomBytes(t, 1000)) // replaced below
	e2 := upload(c, 2, p2)
	e1 := upload(c, 1, p1)
	files := partFiles(t, dir, id)
	require.Len(t, files, 3, "upload.json and one file per part: %v", files)
	require.Contains(t, files, "00001-"+md5hex(p1)+".part")
	require.Equal(t, int64(len(p1)), files["00001-"+md5hex(p1)+".part"])
	require.Equal(t, int64(len(p2)), files["00002-"+md5hex(p2)+".part"])

	// A restart keeps the upload.
	require.NoError(t, first.Stop())
	second, err := devs3.Start(ctx, mustListen(t), devs3.Config{Bucket: bucket, Dir: dir, Log: logr.Discard()})
	require.NoError(t, err)
	defer func() { require.NoError(t, second.Stop()) }()
	c = devs3test.Client(second.URL)
	parts, err := c.ListParts(ctx, &s3.ListPartsInput{Bucket: aws.String(bucket), Key: aws.String("big/object"), UploadId: up.UploadId})
	require.NoError(t, err)
	require.Len(t, parts.Parts, 2)
	require.Equal(t, e1, *parts.Parts[0].ETag)
	require.Equal(t, int64(len(p1)), *parts.Parts[0].Size)
	page, err := c.ListParts(ctx, &s3.ListPartsInput{Bucket: aws.String(bucket), Key: aws.String("big/object"), UploadId: up.UploadId, MaxParts: aws.Int32(1)})
	require.NoError(t, err)
	require.Len(t, page.Parts, 1)
	require.True(t, *page.IsTruncated)
	ups, err := c.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket)})
	require.NoError(t, err)
	require.Len(t, ups.Uploads, 1)
	require.Equal(t, "big/object", *ups.Uploads[0].Key)

	// Another key's upload ID, a missing part, a wrong ETag.
	_, err = c.ListParts(ctx, &s3.ListPartsInput{Bucket: aws.String(bucket), Key: aws.String("other"), UploadId: up.UploadId})
	require.Equal(t, "NoSuchUpload", apiCode(err))
	complete := func(parts ...types.CompletedPart) error {
		_, err := c.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String("big/object"), UploadId: up.UploadId,
			MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}})
		return err
	}
	require.Equal(t, "InvalidPart", apiCode(complete(types.CompletedPart{PartNumber: aws.Int32(1), ETag: aws.String(e1)}, types.CompletedPart{PartNumber: aws.Int32(3), ETag: aws.String(e2)})))
	require.Equal(t, "InvalidPart", apiCode(complete(types.CompletedPart{PartNumber: aws.Int32(1), ETag: aws.String(e2)})))
	require.NoError(t, complete(types.CompletedPart{PartNumber: aws.Int32(1), ETag: aws.String(e1)}, types.CompletedPart{PartNumber: aws.Int32(2), ETag: aws.String(e2)}))
	data, err := os.ReadFile(filepath.Join(dir, "big", "object"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(append(append([]byte{}, p1...), p2...), data))
	head, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String("big/object")})
	require.NoError(t, err)
	require.Equal(t, "text/plain", *head.ContentType, "metadata given at creation is kept")
	require.Empty(t, uploadDirs(t, dir), "a completed upload leaves nothing behind")
	require.Equal(t, "NoSuchUpload", apiCode(complete(types.CompletedPart{PartNumber: aws.Int32(1), ETag: aws.String(e1)})))
}

func mustListen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return ln
}

func TestMultipartAbortAndListing(t *testing.T) {
	dir := t.TempDir()
	srv := devs3test.Start(t, dir)
	c := devs3test.Client(srv.URL)
	ctx := context.Background()
	var ids []string
	for _, k := range []string{"b", "a", "b"} {
		up, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String(k)})
		require.NoError(t, err)
		ids = append(ids, *up.UploadId)
	}
	// Sorted by key: a, then b's two uploads; pages of two.
	page, err := c.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket), MaxUploads: aws.Int32(2)})
	require.NoError(t, err)
	require.Len(t, page.Uploads, 2)
	require.True(t, *page.IsTruncated)
	require.Equal(t, "a", *page.Uploads[0].Key)
	rest, err := c.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket), KeyMarker: page.NextKeyMarker, UploadIdMarker: page.NextUploadIdMarker})
	require.NoError(t, err)
	require.Len(t, rest.Uploads, 1)
	require.Equal(t, "b", *rest.Uploads[0].Key)
	require.NotEqual(t, *page.Uploads[1].UploadId, *rest.Uploads[0].UploadId)
	pfx, err := c.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket), Prefix: aws.String("a")})
	require.NoError(t, err)
	require.Len(t, pfx.Uploads, 1)

	_, err = c.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String("a"), UploadId: aws.String(ids[1])})
	require.NoError(t, err)
	require.NotContains(t, uploadDirs(t, dir), ids[1])
	_, err = c.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String("a"), UploadId: aws.String(ids[1])})
	require.Equal(t, "NoSuchUpload", apiCode(err))

	// Upload IDs that are not ours never reach the file system.
	outside := filepath.Join(filepath.Dir(dir), "outside-"+filepath.Base(dir))
	require.NoError(t, os.MkdirAll(outside, 0o755))
	for _, bad := range []string{"../../../outside", "..", ".", ids[0] + "/..", "x"} {
		_, err := c.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String(bucket), Key: aws.String("b"), UploadId: aws.String(bad), PartNumber: aws.Int32(1), Body: bytes.NewReader([]byte("x"))})
		require.Equal(t, "NoSuchUpload", apiCode(err), bad)
		_, err = c.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String("b"), UploadId: aws.String(bad)})
		require.Equal(t, "NoSuchUpload", apiCode(err), bad)
	}
	ents, err := os.ReadDir(outside)
	require.NoError(t, err)
	require.Empty(t, ents)
	require.Len(t, uploadDirs(t, dir), 2)
}

// clock is a settable time source.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func TestAbandonedUploadsExpire(t *testing.T) {
	ctx := context.Background()
	t.Run("at start", func(t *testing.T) {
		dir := t.TempDir()
		clk := &clock{t: time.Now()}
		srv, err := devs3.Start(ctx, mustListen(t), devs3.Config{Bucket: bucket, Dir: dir, Log: logr.Discard(), Now: clk.now})
		require.NoError(t, err)
		c := devs3test.Client(srv.URL)
		var ids []string
		for i := 0; i < 2; i++ {
			up, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String("k")})
			require.NoError(t, err)
			_, err = c.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String(bucket), Key: aws.String("k"), UploadId: up.UploadId, PartNumber: aws.Int32(1), Body: bytes.NewReader([]byte("part"))})
			require.NoError(t, err)
			ids = append(ids, *up.UploadId)
			clk.add(2 * time.Hour) // the second upload is two hours younger
		}
		require.NoError(t, srv.Stop())
		// Now the first upload is 25h old and the second 23h.
		clk.add(21 * time.Hour)
		srv, err = devs3.Start(ctx, mustListen(t), devs3.Config{Bucket: bucket, Dir: dir, Log: logr.Discard(), Now: clk.now})
		require.NoError(t, err)
		defer func() { require.NoError(t, srv.Stop()) }()
		require.Eventually(t, func() bool { return len(uploadDirs(t, dir)) == 1 }, 10*time.Second, 20*time.Millisecond)
		require.Equal(t, []string{ids[1]}, uploadDirs(t, dir), "only the upload older than 24h is gone")
		_, err = devs3test.Client(srv.URL).ListParts(ctx, &s3.ListPartsInput{Bucket: aws.String(bucket), Key: aws.String("k"), UploadId: aws.String(ids[0])})
		require.Equal(t, "NoSuchUpload", apiCode(err))
	})
	t.Run("while running", func(t *testing.T) {
		dir := t.TempDir()
		srv := devs3test.StartWith(t, devs3.Config{Dir: dir, UploadExpiry: 2 * time.Second})
		c := devs3test.Client(srv.URL)
		up, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String("k")})
		require.NoError(t, err)
		require.Len(t, uploadDirs(t, dir), 1)
		require.Eventually(t, func() bool { return len(uploadDirs(t, dir)) == 0 }, 30*time.Second, 100*time.Millisecond, "swept after 2s")
		_, err = c.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String(bucket), Key: aws.String("k"), UploadId: up.UploadId, PartNumber: aws.Int32(1), Body: bytes.NewReader([]byte("late"))})
		require.Equal(t, "NoSuchUpload", apiCode(err))
	})
}

// TestPartsStreamToDisk checks that a part is written while it arrives: a
// part whose body is still being sent already has bytes in its temp file.
func TestPartsStreamToDisk(t *testing.T) {
	dir := t.TempDir()
	srv := devs3test.Start(t, dir)
	c := devs3test.Client(srv.URL)
	ctx := context.Background()
	up, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String("s")})
	require.NoError(t, err)
	pr, pw := io.Pipe()
	const size = 8 << 20
	req, err := http.NewRequest(http.MethodPut, srv.URL+"/"+bucket+"/s?partNumber=1&uploadId="+*up.UploadId, pr)
	require.NoError(t, err)
	req.ContentLength = size
	done := make(chan error, 1)
	go func() {
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
		}
		done <- err
	}()
	half := randomBytes(t, size/2)
	_, err = pw.Write(half)
	require.NoError(t, err)
	tmpSize := func() int64 {
		var n int64
		for name, sz := range partFiles(t, dir, *up.UploadId) {
			if name != "upload.json" {
				n += sz
			}
		}
		return n
	}
	require.Eventually(t, func() bool { return tmpSize() >= size/4 }, 10*time.Second, 20*time.Millisecond,
		"half the part was sent; its bytes are on disk before the rest arrives")
	_, err = pw.Write(randomBytes(t, size/2))
	require.NoError(t, err)
	require.NoError(t, pw.Close())
	require.NoError(t, <-done)
	parts, err := c.ListParts(ctx, &s3.ListPartsInput{Bucket: aws.String(bucket), Key: aws.String("s"), UploadId: up.UploadId})
	require.NoError(t, err)
	require.Len(t, parts.Parts, 1)
	require.Equal(t, int64(size), *parts.Parts[0].Size)
}
