package devs3

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// aws-chunked request bodies (x-amz-content-sha256: STREAMING-...,
// Content-Encoding: aws-chunked) frame the object as
//
//	<hex size>[;chunk-signature=<sig>]\r\n<data>\r\n ... 0[;chunk-signature=<sig>]\r\n[<trailer>:<value>\r\n...]\r\n
//
// decodeChunked replaces such a body by the plain object bytes and fixes
// the headers (Content-Length from x-amz-decoded-content-length,
// aws-chunked dropped from Content-Encoding) so gofakes3 and the backend
// see an ordinary upload. With a signer, every chunk's signature is checked
// (STREAMING-AWS4-HMAC-SHA256-PAYLOAD); each chunk is then held in memory
// until checked, so chunks are limited to maxSignedChunk.

const (
	maxChunkLine   = 4 << 10
	maxSignedChunk = 16 << 20
)

// chunkSigner computes chunk signatures in sequence from the seed (the
// request's signature); StreamSigner's string to sign with no event
// headers is exactly S3's chunk string to sign.
type chunkSigner struct {
	signer *v4.StreamSigner
	at     time.Time
}

func (c *chunkSigner) sign(chunk []byte) ([]byte, error) {
	return c.signer.GetSignature(context.Background(), nil, chunk, c.at)
}

// isChunked reports whether r carries an aws-chunked body.
func isChunked(r *http.Request) bool {
	return strings.HasPrefix(r.Header.Get("X-Amz-Content-Sha256"), "STREAMING-")
}

func decodeChunked(r *http.Request, signer *chunkSigner) *authError {
	n, err := strconv.ParseInt(r.Header.Get("X-Amz-Decoded-Content-Length"), 10, 64)
	if err != nil || n < 0 {
		return &authError{status: http.StatusLengthRequired, code: "MissingContentLength",
			message: "You must provide the x-amz-decoded-content-length header with an aws-chunked body.", detail: "no x-amz-decoded-content-length"}
	}
	r.Body = &chunkedBody{src: r.Body, br: bufio.NewReaderSize(r.Body, maxChunkLine), signer: signer, check: bodyCheckOf(r)}
	r.ContentLength = n
	r.Header.Set("Content-Length", strconv.FormatInt(n, 10))
	r.Header.Del("X-Amz-Decoded-Content-Length")
	// gofakes3 would try to decode STREAMING-AWS4-HMAC-SHA256-PAYLOAD itself.
	r.Header.Set("X-Amz-Content-Sha256", unsignedPayload)
	var enc []string
	for _, e := range strings.Split(r.Header.Get("Content-Encoding"), ",") {
		if e = strings.TrimSpace(e); e != "" && e != "aws-chunked" {
			enc = append(enc, e)
		}
	}
	if len(enc) == 0 {
		r.Header.Del("Content-Encoding")
	} else {
		r.Header.Set("Content-Encoding", strings.Join(enc, ","))
	}
	return nil
}

type chunkedBody struct {
	src    io.Closer
	br     *bufio.Reader
	signer *chunkSigner
	check  *bodyCheck

	left int64  // bytes of the current chunk still to read (unsigned)
	buf  []byte // the current checked chunk (signed)
	done bool
	err  error
}

func (c *chunkedBody) Close() error { return c.src.Close() }

func (c *chunkedBody) fail(e *authError) error {
	c.err = c.check.fail(e)
	return c.err
}

func (c *chunkedBody) badFraming(detail string) error {
	return c.fail(&authError{status: http.StatusBadRequest, code: "IncompleteBody",
		message: "The request body is not valid aws-chunked encoding: " + detail, detail: detail})
}

func (c *chunkedBody) Read(p []byte) (int, error) {
	for {
		if c.err != nil {
			return 0, c.err
		}
		if len(c.buf) > 0 {
			n := copy(p, c.buf)
			c.buf = c.buf[n:]
			return n, nil
		}
		if c.left > 0 {
			if int64(len(p)) > c.left {
				p = p[:c.left]
			}
			n, err := c.br.Read(p)
			c.left -= int64(n)
			if err == io.EOF && c.left > 0 {
				return n, c.badFraming("body ended inside a chunk")
			}
			if c.left == 0 {
				if err := c.endChunk(); err != nil {
					return n, err
				}
			}
			return n, nil
		}
		if c.done {
			return 0, io.EOF
		}
		if err := c.nextChunk(); err != nil {
			return 0, err
		}
	}
}

// nextChunk reads a chunk header (and, when signed, the whole chunk).
func (c *chunkedBody) nextChunk() error {
	line, err := c.line()
	if err != nil {
		return err
	}
	sizeText, ext, _ := strings.Cut(line, ";")
	size, err := strconv.ParseInt(strings.TrimSpace(sizeText), 16, 64)
	if err != nil || size < 0 {
		return c.badFraming(fmt.Sprintf("chunk size %q", sizeText))
	}
	if c.signer == nil {
		if size == 0 {
			return c.trailers()
		}
		c.left = size
		return nil
	}
	sigText, ok := strings.CutPrefix(ext, "chunk-signature=")
	want, herr := hex.DecodeString(sigText)
	if !ok || herr != nil {
		return c.fail(mismatch("chunk without a chunk-signature"))
	}
	if size > maxSignedChunk {
		return c.badFraming(fmt.Sprintf("signed chunks are limited to %d bytes", maxSignedChunk))
	}
	chunk := make([]byte, size)
	if _, err := io.ReadFull(c.br, chunk); err != nil {
		return c.badFraming("body ended inside a chunk")
	}
	got, err := c.signer.sign(chunk)
	if err != nil || !hmac.Equal(got, want) {
		return c.fail(mismatch("chunk signature differs"))
	}
	if size == 0 {
		return c.trailers()
	}
	c.buf = chunk
	return c.endChunk()
}

// endChunk consumes the CRLF after a chunk's data.
func (c *chunkedBody) endChunk() error {
	var crlf [2]byte
	if _, err := io.ReadFull(c.br, crlf[:]); err != nil || !bytes.Equal(crlf[:], []byte("\r\n")) {
		return c.badFraming("chunk data not followed by CRLF")
	}
	return nil
}

// trailers consumes trailing headers (checksums) up to the empty line.
func (c *chunkedBody) trailers() error {
	for {
		line, err := c.line()
		if err == io.EOF {
			break // some clients end right after the last chunk
		}
		if err != nil {
			return err
		}
		if line == "" {
			break
		}
	}
	c.done = true
	return nil
}

func (c *chunkedBody) line() (string, error) {
	line, err := c.br.ReadSlice('\n')
	if err == io.EOF && len(line) == 0 {
		return "", io.EOF
	}
	if err != nil {
		return "", c.badFraming("chunk header too long or cut short")
	}
	return strings.TrimRight(string(line), "\r\n"), nil
}
