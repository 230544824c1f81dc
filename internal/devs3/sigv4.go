package devs3

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/johannesboyne/gofakes3"
)

// Signature checking (optional: Config.AccessKey/SecretKey). Every S3
// request must carry an AWS Signature Version 4, in the Authorization
// header or as a presigned URL, made with the configured key pair. The
// check recomputes the signature with aws-sdk-go-v2's own v4 signer over a
// copy of the request holding exactly the headers the client signed, and
// compares. Payloads are checked too: a hex x-amz-content-sha256 must match
// the body (checked as it streams; a mismatch fails the write before
// anything is stored), and STREAMING-AWS4-HMAC-SHA256-PAYLOAD chunks carry
// valid chunk signatures. Refusals use S3's codes: AccessDenied (no
// signature, expired URL), InvalidAccessKeyId, SignatureDoesNotMatch,
// RequestTimeTooSkewed, AuthorizationHeaderMalformed.

const (
	sigAlgorithm     = "AWS4-HMAC-SHA256"
	amzDateFormat    = "20060102T150405Z"
	maxSkew          = 15 * time.Minute
	maxPresignExpiry = 7 * 24 * time.Hour
	unsignedPayload  = "UNSIGNED-PAYLOAD"
	streamingSigned  = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
	// streamingUnsignedTrailer is aws-chunked framing with a trailing
	// checksum and no signatures.
	streamingUnsignedTrailer = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
	emptySHA256              = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
)

// authError is a refused request.
type authError struct {
	status        int
	code, message string
	// detail says why, for the debug log (S3 does not tell clients).
	detail string
}

func denied(detail string) *authError {
	return &authError{status: http.StatusForbidden, code: "AccessDenied", message: "Access Denied", detail: detail}
}

func mismatch(detail string) *authError {
	return &authError{status: http.StatusForbidden, code: "SignatureDoesNotMatch",
		message: "The request signature we calculated does not match the signature you provided. Check your key and signing method.", detail: detail}
}

func malformed(detail string) *authError {
	return &authError{status: http.StatusBadRequest, code: "AuthorizationHeaderMalformed", message: "The authorization header is malformed; " + detail, detail: detail}
}

var errUnknownKey = &authError{status: http.StatusForbidden, code: "InvalidAccessKeyId", message: "The AWS Access Key Id you provided does not exist in our records.", detail: "unknown access key"}

// verifier checks signatures against one key pair.
type verifier struct {
	creds  aws.Credentials
	now    func() time.Time
	signer *v4.Signer
}

func newVerifier(accessKey, secretKey string, now func() time.Time) *verifier {
	return &verifier{
		creds: aws.Credentials{AccessKeyID: accessKey, SecretAccessKey: secretKey},
		now:   now,
		signer: v4.NewSigner(func(o *v4.SignerOptions) {
			o.DisableURIPathEscaping = true // S3 signs the path as sent
			o.DisableHeaderHoisting = true
		}),
	}
}

// credential is a parsed Credential=AK/date/region/service/aws4_request.
type credential struct {
	accessKey, date, region, service string
}

func parseCredential(s string) (credential, bool) {
	parts := strings.Split(s, "/")
	if len(parts) != 5 || parts[4] != "aws4_request" || parts[0] == "" {
		return credential{}, false
	}
	return credential{accessKey: parts[0], date: parts[1], region: parts[2], service: parts[3]}, true
}

// verify checks r and returns the request to serve: the same one, with
// its body wrapped by the payload check.
func (v *verifier) verify(r *http.Request) (*http.Request, *authError) {
	if r.URL.Query().Has("X-Amz-Signature") || r.URL.Query().Has("X-Amz-Algorithm") {
		return v.verifyPresigned(r)
	}
	authz := r.Header.Get("Authorization")
	if r.URL.Query().Has("AWSAccessKeyId") || strings.HasPrefix(authz, "AWS ") {
		// Signature Version 2 (e.g. aws CLI v1's default for s3 presign).
		return nil, &authError{status: http.StatusBadRequest, code: "InvalidRequest",
			message: "The authorization mechanism you have provided is not supported. Please use AWS4-HMAC-SHA256.", detail: "signature version 2"}
	}
	if authz == "" {
		return nil, denied("no Authorization header or presigned URL")
	}
	alg, rest, _ := strings.Cut(authz, " ")
	if alg != sigAlgorithm {
		return nil, malformed(fmt.Sprintf("the authorization mechanism %q is not supported; use %s", alg, sigAlgorithm))
	}
	fields := map[string]string{}
	for _, f := range strings.Split(rest, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(f), "=")
		if !ok {
			return nil, malformed(fmt.Sprintf("cannot parse %q", strings.TrimSpace(f)))
		}
		fields[k] = val
	}
	cred, ok := parseCredential(fields["Credential"])
	if !ok || fields["SignedHeaders"] == "" || fields["Signature"] == "" {
		return nil, malformed("expected Credential=<key>/<date>/<region>/<service>/aws4_request, SignedHeaders=..., Signature=...")
	}
	if cred.accessKey != v.creds.AccessKeyID {
		return nil, errUnknownKey
	}
	signed := strings.Split(fields["SignedHeaders"], ";")
	if !contains(signed, "host") {
		return nil, mismatch("host is not a signed header")
	}
	dateText := r.Header.Get("X-Amz-Date")
	if dateText == "" {
		return nil, denied("no x-amz-date header")
	}
	at, err := time.Parse(amzDateFormat, dateText)
	if err != nil {
		return nil, denied(fmt.Sprintf("x-amz-date %q: %v", dateText, err))
	}
	if skew := v.now().Sub(at); skew > maxSkew || skew < -maxSkew {
		return nil, &authError{status: http.StatusForbidden, code: "RequestTimeTooSkewed",
			message: "The difference between the request time and the current time is too large.", detail: fmt.Sprintf("skew %s", skew.Round(time.Second))}
	}
	if cred.date != at.Format("20060102") {
		return nil, mismatch("credential date differs from x-amz-date")
	}
	payload := r.Header.Get("X-Amz-Content-Sha256")
	if payload == "" {
		return nil, &authError{status: http.StatusBadRequest, code: "InvalidRequest",
			message: "Missing required header for this request: x-amz-content-sha256", detail: "no x-amz-content-sha256"}
	}
	want, err := hex.DecodeString(fields["Signature"])
	if err != nil {
		return nil, mismatch("signature is not hex")
	}
	got, err := v.resign(r, signed, payload, cred, at)
	if err != nil {
		return nil, mismatch(err.Error())
	}
	if !hmac.Equal(got, want) {
		return nil, mismatch("signature differs")
	}
	switch {
	case payload == unsignedPayload || payload == streamingUnsignedTrailer:
		// Nothing signed in the body; aws-chunked framing is decoded in
		// serveS3 for every request.
	case payload == streamingSigned:
		if aerr := decodeChunked(r, &chunkSigner{signer: v4.NewStreamSigner(v.creds, cred.service, cred.region, want), at: at}); aerr != nil {
			return nil, aerr
		}
	case strings.HasPrefix(payload, "STREAMING-"):
		return nil, &authError{status: http.StatusNotImplemented, code: "NotImplemented",
			message: "dev-s3 does not support x-amz-content-sha256: " + payload, detail: "unsupported streaming payload"}
	default:
		sum, err := hex.DecodeString(payload)
		if err != nil || len(sum) != sha256.Size {
			return nil, &authError{status: http.StatusBadRequest, code: "InvalidArgument",
				message: "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, STREAMING-AWS4-HMAC-SHA256-PAYLOAD, or a valid sha256 value.", detail: "bad x-amz-content-sha256"}
		}
		r.Body = &sha256Body{ReadCloser: r.Body, h: sha256.New(), want: sum, check: bodyCheckOf(r)}
	}
	return r, nil
}

// verifyPresigned checks a presigned URL (query-string authentication).
func (v *verifier) verifyPresigned(r *http.Request) (*http.Request, *authError) {
	q := r.URL.Query()
	if alg := q.Get("X-Amz-Algorithm"); alg != sigAlgorithm {
		return nil, &authError{status: http.StatusBadRequest, code: "AuthorizationQueryParametersError",
			message: "X-Amz-Algorithm only supports \"AWS4-HMAC-SHA256\"", detail: "algorithm " + alg}
	}
	cred, ok := parseCredential(q.Get("X-Amz-Credential"))
	if !ok || q.Get("X-Amz-SignedHeaders") == "" || q.Get("X-Amz-Signature") == "" || q.Get("X-Amz-Date") == "" || q.Get("X-Amz-Expires") == "" {
		return nil, &authError{status: http.StatusBadRequest, code: "AuthorizationQueryParametersError",
			message: "Query-string authentication version 4 requires the X-Amz-Algorithm, X-Amz-Credential, X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, and X-Amz-Expires parameters.", detail: "missing parameters"}
	}
	if cred.accessKey != v.creds.AccessKeyID {
		return nil, errUnknownKey
	}
	at, err := time.Parse(amzDateFormat, q.Get("X-Amz-Date"))
	if err != nil {
		return nil, denied("bad X-Amz-Date")
	}
	secs, err := strconv.Atoi(q.Get("X-Amz-Expires"))
	if err != nil || secs < 1 || time.Duration(secs)*time.Second > maxPresignExpiry {
		return nil, &authError{status: http.StatusBadRequest, code: "AuthorizationQueryParametersError",
			message: "X-Amz-Expires must be between 1 and 604800 seconds", detail: "bad X-Amz-Expires"}
	}
	now := v.now()
	if now.After(at.Add(time.Duration(secs) * time.Second)) {
		return nil, &authError{status: http.StatusForbidden, code: "AccessDenied", message: "Request has expired", detail: "expired presigned URL"}
	}
	if at.Sub(now) > maxSkew {
		return nil, &authError{status: http.StatusForbidden, code: "AccessDenied", message: "Request is not valid yet", detail: "presigned in the future"}
	}
	want, err := hex.DecodeString(q.Get("X-Amz-Signature"))
	if err != nil {
		return nil, mismatch("signature is not hex")
	}
	signed := strings.Split(q.Get("X-Amz-SignedHeaders"), ";")
	if !contains(signed, "host") {
		return nil, mismatch("host is not a signed header")
	}
	q.Del("X-Amz-Signature")
	payload := unsignedPayload
	if h := r.Header.Get("X-Amz-Content-Sha256"); h != "" && contains(signed, "x-amz-content-sha256") {
		payload = h
	}
	req := v.copyForSigning(r, signed, q.Encode())
	signedURL, _, err := v.signer.PresignHTTP(context.Background(), v.creds, req, payload, cred.service, cred.region, at)
	if err != nil {
		return nil, mismatch(err.Error())
	}
	u, err := url.Parse(signedURL)
	if err != nil {
		return nil, mismatch(err.Error())
	}
	got, err := hex.DecodeString(u.Query().Get("X-Amz-Signature"))
	if err != nil || !hmac.Equal(got, want) {
		return nil, mismatch("signature differs")
	}
	return r, nil
}

// resign computes the header signature the client should have sent.
func (v *verifier) resign(r *http.Request, signed []string, payload string, cred credential, at time.Time) ([]byte, error) {
	req := v.copyForSigning(r, signed, r.URL.RawQuery)
	if err := v.signer.SignHTTP(context.Background(), v.creds, req, payload, cred.service, cred.region, at); err != nil {
		return nil, err
	}
	_, rest, _ := strings.Cut(req.Header.Get("Authorization"), "Signature=")
	return hex.DecodeString(rest)
}

// copyForSigning builds a bodiless request with the path exactly as sent,
// the given query and only the signed headers.
func (v *verifier) copyForSigning(r *http.Request, signed []string, rawQuery string) *http.Request {
	path := r.RequestURI
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	if !strings.HasPrefix(path, "/") { // absolute-form request target
		path = r.URL.EscapedPath()
	}
	req := &http.Request{
		Method: r.Method,
		URL:    &url.URL{Scheme: "http", Opaque: "//" + r.Host + path, Host: r.Host, RawQuery: rawQuery},
		Host:   r.Host,
		Header: http.Header{},
	}
	for _, name := range signed {
		switch name {
		case "host":
		case "content-length":
			req.ContentLength = r.ContentLength
		default:
			req.Header[http.CanonicalHeaderKey(name)] = r.Header.Values(name)
		}
	}
	return req
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

var errPayloadHash = &authError{status: http.StatusBadRequest, code: "XAmzContentSHA256Mismatch",
	message: "The provided 'x-amz-content-sha256' header does not match what was computed.", detail: "payload hash differs"}

// sha256Body fails the read at EOF when the body's SHA-256 differs from
// the signed one, so the write it feeds is abandoned before anything is
// stored, and records the refusal for the response.
type sha256Body struct {
	io.ReadCloser
	h     hash.Hash
	want  []byte
	check *bodyCheck
}

func (b *sha256Body) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.h.Write(p[:n])
	if errors.Is(err, io.EOF) && !hmac.Equal(b.h.Sum(nil), b.want) {
		return n, b.check.fail(errPayloadHash)
	}
	return n, err
}

// bodyCheck carries a refusal found while the body streams (after gofakes3
// took the request) to the response: checkedWriter answers with it instead
// of whatever error gofakes3 makes of the failed read.
type bodyCheck struct {
	mu     sync.Mutex
	failed *authError
}

type bodyCheckKey struct{}

func bodyCheckOf(r *http.Request) *bodyCheck {
	c, _ := r.Context().Value(bodyCheckKey{}).(*bodyCheck)
	if c == nil {
		c = &bodyCheck{} // not wired to a response; the read still fails
	}
	return c
}

func (c *bodyCheck) fail(e *authError) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed == nil {
		c.failed = e
	}
	return gofakes3.ErrorMessage(gofakes3.ErrorCode(e.code), e.message)
}

func (c *bodyCheck) get() *authError {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed
}

// checkedWriter replaces the response once the body check failed.
type checkedWriter struct {
	http.ResponseWriter
	r        *http.Request
	check    *bodyCheck
	replaced bool
}

func (w *checkedWriter) WriteHeader(code int) {
	if e := w.check.get(); e != nil {
		w.replaced = true
		writeError(w.ResponseWriter, w.r, e.status, e.code, e.message, w.r.URL.Path)
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *checkedWriter) Write(p []byte) (int, error) {
	if w.replaced {
		return len(p), nil
	}
	return w.ResponseWriter.Write(p)
}

func (w *checkedWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok && !w.replaced {
		f.Flush()
	}
}
