package s3store

import (
	"bytes"
	"fmt"
	"io"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// smallBody is the largest request body sent from memory in the same
// write as its headers (see inMemoryBody).
const smallBody = 64 << 10

// Tune applies the per-request savings this store relies on to o; New
// applies it, and callers of NewWithClient should build their client with
// it (s3.New(opts, s3store.Tune)).
//
//   - Request checksums only where an operation requires one. Over TLS the
//     SDK's default sends every PutObject body aws-chunked with a CRC32
//     trailer (over plain HTTP it sends none either way). Objects here are
//     small JSON documents whose integrity in transit is TLS's job, and
//     conditional writes do not depend on it. A setting from the
//     environment (AWS_REQUEST_CHECKSUM_CALCULATION) is kept.
//   - Small bodies are handed to net/http as in-memory readers, so the
//     request goes out in one write instead of headers and body apart.
//
// Payload signing and retries are left to the SDK.
func Tune(o *s3.Options) {
	if o.RequestChecksumCalculation == aws.RequestChecksumCalculationUnset {
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
	}
	if _, ok := o.HTTPClient.(inMemoryBody); !ok {
		next := o.HTTPClient
		if next == nil {
			next = http.DefaultClient
		}
		o.HTTPClient = inMemoryBody{next: next}
	}
}

// inMemoryBody reads a small request body into memory before sending.
// net/http flushes the headers on their own, in a write (and TCP segment)
// of their own, unless the body is one of the readers it knows never to
// block (bytes.Reader and friends), and the SDK always wraps the body.
type inMemoryBody struct {
	next s3.HTTPClient
}

// Do implements s3.HTTPClient.
func (c inMemoryBody) Do(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Body == http.NoBody || req.ContentLength <= 0 || req.ContentLength > smallBody {
		return c.next.Do(req)
	}
	buf := make([]byte, req.ContentLength)
	_, err := io.ReadFull(req.Body, buf)
	_ = req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("read the %d-byte request body: %w", req.ContentLength, err)
	}
	out := new(http.Request)
	*out = *req
	out.Body = io.NopCloser(bytes.NewReader(buf))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	return c.next.Do(out)
}
