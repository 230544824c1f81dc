package devs3

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/go-logr/logr"
	"golang.org/x/net/http/httpguts"
)

var (
	fuzzCreds = aws.Credentials{AccessKeyID: "devkey", SecretAccessKey: "devsecret"}
	fuzzAt    = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
)

// encodeChunks frames data as aws-chunked with chunk sizes taken from sizes
// (cycled, each 1-256 bytes), signing each chunk when seed is set.
func encodeChunks(t *testing.T, data, sizes, seed []byte) []byte {
	t.Helper()
	var signer *v4.StreamSigner
	if seed != nil {
		signer = v4.NewStreamSigner(fuzzCreds, "s3", "us-east-1", seed)
	}
	var out bytes.Buffer
	write := func(chunk []byte) {
		fmt.Fprintf(&out, "%x", len(chunk))
		if signer != nil {
			sig, err := signer.GetSignature(context.Background(), nil, chunk, fuzzAt)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&out, ";chunk-signature=%x", sig)
		}
		out.WriteString("\r\n")
		out.Write(chunk)
		out.WriteString("\r\n")
	}
	for i := 0; len(data) > 0; i++ {
		n := 1
		if len(sizes) > 0 {
			n = int(sizes[i%len(sizes)]) + 1
		}
		n = min(n, len(data))
		write(data[:n])
		data = data[n:]
	}
	if signer != nil {
		write(nil)
		out.WriteString("\r\n")
	} else {
		out.WriteString("0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n")
	}
	return out.Bytes()
}

func decodeBody(t *testing.T, body []byte, declared int, seed []byte) ([]byte, error) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPut, "/dev/k", bytes.NewReader(body))
	check := &bodyCheck{}
	req = req.WithContext(context.WithValue(req.Context(), bodyCheckKey{}, check))
	req.Header.Set("X-Amz-Decoded-Content-Length", fmt.Sprint(declared))
	req.Header.Set("Content-Encoding", "aws-chunked")
	var cs *chunkSigner
	if seed != nil {
		req.Header.Set("X-Amz-Content-Sha256", streamingSigned)
		cs = &chunkSigner{signer: v4.NewStreamSigner(fuzzCreds, "s3", "us-east-1", seed), at: fuzzAt}
	} else {
		req.Header.Set("X-Amz-Content-Sha256", streamingUnsignedTrailer)
	}
	if aerr := decodeChunked(req, cs); aerr != nil {
		return nil, fmt.Errorf("%s: %s", aerr.code, aerr.detail)
	}
	out, err := io.ReadAll(req.Body)
	if err != nil && check.get() == nil {
		t.Fatalf("the body failed (%v) without recording a refusal for the response", err)
	}
	return out, err
}

// FuzzChunked checks the aws-chunked decoder. Any data framed in any chunk
// sizes, signed or not, decodes to exactly that data; a signed body with one
// byte changed is refused; arbitrary bodies never panic and never yield
// more bytes than they hold.
func FuzzChunked(f *testing.F) {
	f.Add([]byte("hello world"), []byte{4, 0}, true, []byte("5\r\nhello\r\n0\r\n\r\n"), uint8(3))
	f.Add([]byte("hello world"), []byte{255}, false, []byte("5;chunk-signature=00\r\nhello\r\n0\r\n\r\n"), uint8(0))
	f.Add(bytes.Repeat([]byte("a"), 1000), []byte{99, 0, 250}, true, []byte("ffffffffffffffff\r\n"), uint8(7))
	f.Add([]byte{}, []byte{}, false, []byte("-1\r\n"), uint8(0))
	f.Add([]byte("x"), []byte{0}, true, []byte("1\r\nx\r\n0\r\nx-amz-checksum-crc32:DUoRhQ==\r\n\r\n"), uint8(1))
	f.Add([]byte("x"), []byte{0}, false, []byte("8000000000000000\r\n"), uint8(1))
	seed, _ := hex.DecodeString("4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9")
	f.Fuzz(func(t *testing.T, data, sizes []byte, signed bool, raw []byte, flip uint8) {
		if len(data) > 1<<14 || len(raw) > 1<<16 {
			return
		}
		var s []byte
		if signed {
			s = seed
		}
		body := encodeChunks(t, data, sizes, s)
		got, err := decodeBody(t, body, len(data), s)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("framed %d bytes (signed %v) decode to %d bytes, error %v", len(data), signed, len(got), err)
		}
		if signed && len(data) > 0 {
			// Change one byte of chunk data: the chunk signature fails.
			at := bytes.Index(body, []byte("\r\n")) + 2 + int(flip)%min(len(data), int(sizes0(sizes)))
			tampered := append([]byte(nil), body...)
			tampered[at] ^= 0x01
			if _, err := decodeBody(t, tampered, len(data), s); err == nil {
				t.Fatalf("a signed body with byte %d changed was accepted", at)
			}
		}
		out, err := decodeBody(t, raw, len(raw), s)
		if len(out) > len(raw) {
			t.Fatalf("%d body bytes decoded to %d", len(raw), len(out))
		}
		if signed && err == nil && len(out) > 0 {
			t.Fatalf("an arbitrary body passed the chunk signature check: %q", raw)
		}
	})
}

// sizes0 is the size of the first chunk encodeChunks writes.
func sizes0(sizes []byte) int {
	if len(sizes) == 0 {
		return 1
	}
	return int(sizes[0]) + 1
}

// signedPair builds a request as an S3 client sends it (signed by
// aws-sdk-go-v2) and the same request as the server receives it.
func signedPair(t *testing.T, method, target, hdrName, hdrValue string, body []byte, payload string, presign bool) (*http.Request, bool) {
	t.Helper()
	req, err := http.NewRequest(method, "http://127.0.0.1:8989"+target, bytes.NewReader(body))
	if err != nil || req.URL.Host != "127.0.0.1:8989" || req.URL.Opaque != "" {
		return nil, false
	}
	if hdrName != "" {
		if !httpguts.ValidHeaderFieldName(hdrName) || !httpguts.ValidHeaderFieldValue(hdrValue) {
			return nil, false // an HTTP server refuses such a header line
		}
		req.Header.Set(hdrName, hdrValue)
	}
	req.Header.Set("X-Amz-Content-Sha256", payload)
	signer := v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true })
	if presign {
		q := req.URL.Query() // as the SDK's presign client: the lifetime is in the query
		q.Set("X-Amz-Expires", "900")
		req.URL.RawQuery = q.Encode()
		u, _, err := signer.PresignHTTP(context.Background(), fuzzCreds, req, payload, "s3", "us-east-1", fuzzAt)
		if err != nil {
			return nil, false
		}
		if req.URL, err = url.Parse(u); err != nil {
			return nil, false
		}
	} else if err := signer.SignHTTP(context.Background(), fuzzCreds, req, payload, "s3", "us-east-1", fuzzAt); err != nil {
		return nil, false
	}
	uri := req.URL.RequestURI()
	if strings.ContainsAny(uri, " \t\r\n") || !strings.HasPrefix(uri, "/") {
		return nil, false
	}
	var srv *http.Request
	func() {
		defer func() {
			if recover() != nil { // httptest.NewRequest panics on what no server would parse
				srv = nil
			}
		}()
		srv = httptest.NewRequest(method, uri, bytes.NewReader(body))
	}()
	if srv == nil {
		return nil, false
	}
	srv.Host = req.Host
	for k, v := range req.Header {
		srv.Header[k] = v
	}
	srv.ContentLength = int64(len(body))
	return srv, true
}

// FuzzSigV4 checks the signature verifier. A request signed by the AWS SDK
// with the right key, in the header or as a presigned URL, is accepted (and
// its body read back intact); the same request with a signed part changed
// (method, path, query, a signed header, the date, the body under a hex
// payload hash) or signed with another secret is refused. Arbitrary
// Authorization headers and query strings never panic and are never
// accepted.
func FuzzSigV4(f *testing.F) {
	f.Add(uint8(0), "/dev/a/b.txt", "", "Content-Type", "text/plain", []byte("hello"), uint8(0), uint8(0), "", "")
	f.Add(uint8(1), "/dev/a/b%20c+d.txt", "x-id=PutObject", "X-Amz-Meta-A", "1", []byte("hello"), uint8(1), uint8(1), "", "")
	f.Add(uint8(2), "/dev", "list-type=2&prefix=a%2F", "", "", []byte{}, uint8(2), uint8(2), "", "")
	f.Add(uint8(3), "/dev/k", "uploadId=0123456789abcdef0123456789abcdef&partNumber=1", "", "", []byte("part"), uint8(3), uint8(3), "", "")
	f.Add(uint8(0), "/dev/k", "", "", "", []byte("x"), uint8(4), uint8(4),
		"AWS4-HMAC-SHA256 Credential=devkey/20260102/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-date, Signature=00", "")
	f.Add(uint8(0), "/dev/k", "", "", "", []byte("x"), uint8(5), uint8(5), "",
		"X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=devkey%2F20260102%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20260102T030405Z&X-Amz-Expires=60&X-Amz-SignedHeaders=host&X-Amz-Signature=00")
	f.Add(uint8(0), "/dev/k", "", "", "", []byte("x"), uint8(6), uint8(6), "AWS AKID:sig", "AWSAccessKeyId=x")
	f.Add(uint8(0), "/dev/presigned/k.txt", "versionId=1", "", "", []byte{}, uint8(0x80), uint8(2), "", "")
	f.Add(uint8(1), "/dev/presigned", "", "X-Amz-Meta-B", "2", []byte("x"), uint8(0x81), uint8(1), "", "")

	good := newVerifier(fuzzCreds.AccessKeyID, fuzzCreds.SecretAccessKey, func() time.Time { return fuzzAt.Add(time.Minute) })
	methods := []string{http.MethodGet, http.MethodPut, http.MethodHead, http.MethodPost, http.MethodDelete}
	f.Fuzz(func(t *testing.T, m uint8, path, query, hdrName, hdrValue string, body []byte, payloadMode, mutate uint8, rawAuthz, rawQuery string) {
		method := methods[int(m)%len(methods)]
		// Arbitrary credentials: refused, without a panic.
		if req, err := http.NewRequest(method, "http://127.0.0.1:8989/dev/k?"+rawQuery, bytes.NewReader(body)); err == nil {
			req.RequestURI = req.URL.RequestURI()
			req.Header.Set("Authorization", rawAuthz)
			req.Header.Set("X-Amz-Date", fuzzAt.Format(amzDateFormat))
			req.Header.Set("X-Amz-Content-Sha256", unsignedPayload)
			if _, aerr := good.verify(req); aerr == nil {
				t.Fatalf("accepted made-up credentials: Authorization %q, query %q", rawAuthz, rawQuery)
			}
		}

		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		target := path
		if query != "" {
			target += "?" + query
		}
		sum := sha256.Sum256(body)
		payload := []string{unsignedPayload, hex.EncodeToString(sum[:]), emptySHA256}[int(payloadMode)%3]
		if payload == emptySHA256 {
			body = nil
		}
		presign := payloadMode&0x80 != 0
		req, ok := signedPair(t, method, target, hdrName, hdrValue, body, payload, presign)
		if !ok {
			return
		}
		checked, aerr := good.verify(req)
		if aerr != nil {
			t.Fatalf("refused a request the SDK signed (%s %s, presigned %v): %s: %s", method, req.RequestURI, presign, aerr.code, aerr.detail)
		}
		if got, err := io.ReadAll(checked.Body); err != nil || !bytes.Equal(got, body) {
			t.Fatalf("the body of a signed request reads back as %q (%v)", got, err)
		}

		wrong := newVerifier(fuzzCreds.AccessKeyID, "another-secret", func() time.Time { return fuzzAt.Add(time.Minute) })
		req, _ = signedPair(t, method, target, hdrName, hdrValue, body, payload, presign)
		if _, aerr := wrong.verify(req); aerr == nil {
			t.Fatal("accepted a request signed with another secret")
		}

		req, _ = signedPair(t, method, target, hdrName, hdrValue, body, payload, presign)
		what := ""
		switch mutate % 6 {
		case 0:
			req.Method = methods[(int(m)+1)%len(methods)]
			what = "method"
		case 1:
			req.RequestURI = "/x" + req.RequestURI
			req.URL.Path = "/x" + req.URL.Path
			what = "path"
		case 2:
			if req.URL.RawQuery == "" {
				req.URL.RawQuery = "z=1"
			} else {
				req.URL.RawQuery += "&z=1"
			}
			req.RequestURI = req.URL.Path + "?" + req.URL.RawQuery
			what = "query"
		case 3:
			if presign {
				return
			}
			req.Header.Set("X-Amz-Date", fuzzAt.Add(time.Second).Format(amzDateFormat))
			what = "date"
		case 4:
			if presign {
				return
			}
			req.Header.Set("X-Amz-Content-Sha256", strings.Repeat("0", 64))
			what = "payload hash"
		case 5:
			if payload == unsignedPayload || payload == emptySHA256 || presign {
				return
			}
			changed := append([]byte("!"), body...)
			req.Body = io.NopCloser(bytes.NewReader(changed))
			req.ContentLength = int64(len(changed))
			checked, aerr := good.verify(req)
			if aerr != nil {
				return
			}
			if _, err := io.ReadAll(checked.Body); err == nil {
				t.Fatal("a changed body passed the signed payload hash")
			}
			return
		}
		if _, aerr := good.verify(req); aerr == nil {
			t.Fatalf("accepted a signed request with its %s changed: %s %s", what, req.Method, req.RequestURI)
		}
	})
}

// completeXML is a CompleteMultipartUpload body.
type completeXML struct {
	Parts []struct {
		PartNumber int
		ETag       string
	} `xml:"Part"`
}

func etagOf(b []byte) string {
	s := md5.Sum(b)
	return `"` + hex.EncodeToString(s[:]) + `"`
}

// FuzzMultipart drives dev-s3's multipart API through its HTTP handler with
// an arbitrary upload id, part number, part body and
// CompleteMultipartUpload XML. Nothing is ever written outside the data
// directory, no request fails with a server error, and an upload that
// completes holds exactly the parts its XML lists, in order.
func FuzzMultipart(f *testing.F) {
	one := []byte("part-one")
	good := fmt.Sprintf(`<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>%s</ETag></Part></CompleteMultipartUpload>`, etagOf(one))
	f.Add("", "2", []byte("part-two"), []byte(good), "key")
	f.Add("", "2", []byte("part-two"), []byte(fmt.Sprintf(`<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>%s</ETag></Part><Part><PartNumber>2</PartNumber><ETag>%s</ETag></Part></CompleteMultipartUpload>`, etagOf(one), etagOf([]byte("part-two")))), "a/b")
	f.Add("", "1", []byte("again"), []byte(fmt.Sprintf(`<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>%s</ETag></Part></CompleteMultipartUpload>`, etagOf([]byte("again")))), "k")
	f.Add("../../../../x", "0", []byte("x"), []byte(`<CompleteMultipartUpload></CompleteMultipartUpload>`), "k")
	f.Add("0123456789abcdef0123456789abcdef", "10001", []byte("x"), []byte(`<CompleteMultipartUpload><Part><PartNumber>-1</PartNumber></Part>`), "k")
	f.Add("", "99999999999999999999", []byte(""), []byte(`<!DOCTYPE x [<!ENTITY a "aaaa">]><CompleteMultipartUpload><Part><PartNumber>&a;</PartNumber></Part></CompleteMultipartUpload>`), "../k")
	f.Add("", "2", []byte("p"), []byte(`<CompleteMultipartUpload><Part><PartNumber>2</PartNumber><ETag>x</ETag></Part><Part><PartNumber>1</PartNumber><ETag>y</ETag></Part></CompleteMultipartUpload>`), "k%2F..")

	base := f.TempDir()
	dir := filepath.Join(base, "data")
	s, err := New(Config{Dir: dir, Log: logr.Discard()})
	if err != nil {
		f.Fatal(err)
	}
	h := s.Handler()
	do := func(t *testing.T, method, target string, body []byte) (int, []byte) {
		t.Helper()
		rec := httptest.NewRecorder()
		var req *http.Request
		func() {
			defer func() {
				if recover() != nil {
					req = nil // a request line no server would parse
				}
			}()
			req = httptest.NewRequest(method, target, bytes.NewReader(body))
			req.Host = "127.0.0.1:8989" // an address dev-s3 serves (internal/devguard)
		}()
		if req == nil {
			return 0, nil
		}
		req.Header.Set("Content-Length", fmt.Sprint(len(body)))
		h.ServeHTTP(rec, req)
		if rec.Code == http.StatusMisdirectedRequest || rec.Code == http.StatusForbidden && strings.Contains(rec.Body.String(), "dev-s3: refused") {
			t.Fatalf("%s %s: refused by the request guard, so nothing reached the S3 handler: %s", method, target, rec.Body.String())
		}
		if rec.Code >= 500 && rec.Code != http.StatusNotImplemented {
			t.Fatalf("%s %s: server error %d: %s", method, target, rec.Code, rec.Body.String())
		}
		return rec.Code, rec.Body.Bytes()
	}

	f.Fuzz(func(t *testing.T, uploadID, partNumber string, part, complete []byte, key string) {
		if len(part) > 1<<16 || len(complete) > 1<<16 {
			return
		}
		k := url.PathEscape(key)
		if k == "" {
			k = "k"
		}
		code, body := do(t, http.MethodPost, "/dev/"+k+"?uploads", nil)
		if code != http.StatusOK {
			return // an invalid key
		}
		var created struct{ UploadId string }
		if err := xml.Unmarshal(body, &created); err != nil || created.UploadId == "" {
			t.Fatalf("CreateMultipartUpload: %s", body)
		}
		id := created.UploadId
		if code, body := do(t, http.MethodPut, "/dev/"+k+"?partNumber=1&uploadId="+id, one); code != http.StatusOK {
			t.Fatalf("UploadPart 1: %d %s", code, body)
		}
		parts := map[int][]byte{1: one}
		useID := id
		if uploadID != "" {
			useID = uploadID
		}
		q := url.Values{"partNumber": {partNumber}, "uploadId": {useID}}.Encode()
		if code, _ := do(t, http.MethodPut, "/dev/"+k+"?"+q, part); code == http.StatusOK {
			n, err := strconv.Atoi(partNumber)
			if err != nil || n < 1 || n > 10000 || useID != id {
				t.Fatalf("UploadPart accepted part number %q of upload %q", partNumber, useID)
			}
			parts[n] = part
		}
		code, _ = do(t, http.MethodPost, "/dev/"+k+"?"+url.Values{"uploadId": {useID}}.Encode(), complete)
		if code == http.StatusOK {
			var c completeXML
			if err := xml.Unmarshal(complete, &c); err != nil {
				t.Fatalf("completed with XML that does not parse: %v", err)
			}
			var want []byte
			for _, p := range c.Parts {
				b, ok := parts[p.PartNumber]
				if !ok || strings.Trim(p.ETag, `"`) != strings.Trim(etagOf(b), `"`) {
					t.Fatalf("completed with part %d (%q), which was not uploaded so", p.PartNumber, p.ETag)
				}
				want = append(want, b...)
			}
			if code, got := do(t, http.MethodGet, "/dev/"+k, nil); code != http.StatusOK || !bytes.Equal(got, want) {
				t.Fatalf("completed object: %d, %d bytes, want %d bytes", code, len(got), len(want))
			}
		}
		do(t, http.MethodDelete, "/dev/"+k+"?uploadId="+id, nil)
		err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if p != base && p != dir && !strings.HasPrefix(p, dir+string(os.PathSeparator)) {
				t.Fatalf("%s was written outside the data directory", p)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// TestKeyNotUTF8Refused is the regression test of the FuzzMultipart finding
// testdata/fuzz/FuzzMultipart/bee2bd67d289c8a0: a key of invalid UTF-8 was
// accepted by CreateMultipartUpload, stored in upload.json as U+FFFD, and
// every UploadPart for it then answered NoSuchUpload. Such keys are now
// refused up front (objstore.ValidateKey), for every operation.
func TestKeyNotUTF8Refused(t *testing.T) {
	s, err := New(Config{Dir: t.TempDir(), Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ method, target string }{
		{http.MethodPost, "/dev/%E2?uploads"},
		{http.MethodPut, "/dev/a/%FF.txt"},
		{http.MethodGet, "/dev/%C3%28"},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(c.method, c.target, strings.NewReader("x"))
		req.Host = "127.0.0.1:8989"
		req.Header.Set("Content-Length", "1")
		s.Handler().ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "InvalidArgument") {
			t.Errorf("%s %s: %d %s, want 400 InvalidArgument", c.method, c.target, rec.Code, rec.Body.String())
		}
	}
}
