package devs3

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/johannesboyne/gofakes3"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/devguard"
	"github.com/nstance-dev/nstance/pkg/objstore/fsbucket"
)

// Defaults used by cmd/dev-s3.
const (
	// DefaultAddr is loopback only: nothing outside the machine reaches
	// dev-s3 unless --addr widens it.
	DefaultAddr   = "127.0.0.1:8989"
	DefaultBucket = "dev"
	DefaultDir    = "temp/dev-s3"
	// DefaultUploadExpiry is how long an unfinished multipart upload is
	// kept.
	DefaultUploadExpiry = 24 * time.Hour
)

// Config configures a Server.
type Config struct {
	// Bucket is the single bucket name served.
	Bucket string
	// Dir is the directory that holds the bucket's objects; created when
	// missing.
	Dir string
	// Log receives start-up messages and, at V(1), one line per request.
	Log logr.Logger
	// ShutdownTimeout bounds the graceful stop; default 10s.
	ShutdownTimeout time.Duration
	// AccessKey and SecretKey, when set, make every S3 request carry a
	// valid AWS Signature Version 4 (header or presigned URL) for them;
	// empty accepts any credentials.
	AccessKey, SecretKey string
	// UploadExpiry removes multipart uploads not completed within it
	// (checked at start and every UploadExpiry/4, at most hourly); default
	// DefaultUploadExpiry.
	UploadExpiry time.Duration
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
	// AllowedHosts are the host names (or host:port) clients may use in
	// the Host header besides IP addresses and localhost; any other Host
	// is refused with 421 (DNS rebinding, see internal/devguard).
	AllowedHosts []string
}

// Server is a dev-s3 instance.
type Server struct {
	cfg     Config
	backend *backend
	handler http.Handler
	// auth checks signatures; nil when any credentials are accepted.
	auth *verifier
}

// New opens the directory and builds the handler. It fails with a clear
// error when the directory cannot be created or written.
func New(cfg Config) (*Server, error) {
	if cfg.Bucket == "" {
		cfg.Bucket = DefaultBucket
	}
	if err := gofakes3.ValidateBucketName(cfg.Bucket); err != nil {
		return nil, fmt.Errorf("bucket name %q: %w", cfg.Bucket, err)
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	if cfg.UploadExpiry <= 0 {
		cfg.UploadExpiry = DefaultUploadExpiry
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if (cfg.AccessKey == "") != (cfg.SecretKey == "") {
		return nil, errors.New("dev-s3: give both an access key and a secret key, or neither")
	}
	guard, err := devguard.New(devguard.Options{Server: "dev-s3", Flag: "--allowed-host", AllowedHosts: cfg.AllowedHosts})
	if err != nil {
		return nil, fmt.Errorf("dev-s3: %w", err)
	}
	store, err := fsbucket.Open(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("dev-s3: %w", err)
	}
	be, err := newBackend(cfg.Bucket, store, cfg.Now)
	if err != nil {
		return nil, fmt.Errorf("dev-s3: %w", err)
	}
	s := &Server{cfg: cfg, backend: be}
	if cfg.AccessKey != "" {
		s.auth = newVerifier(cfg.AccessKey, cfg.SecretKey, cfg.Now)
	}
	fake := gofakes3.New(s.backend,
		gofakes3.WithLogger(gofakesLogger{cfg.Log}),
		gofakes3.WithoutVersioning(),
	)
	// gofakes3 grants every origin CORS access (no option turns that
	// off): its Access-Control-* headers are removed and the guard refuses
	// preflights and foreign Host names before anything else runs.
	s.handler = guard.Wrap(s.wrap(devguard.StripCORS(fake.Server())))
	return s, nil
}

// Dir returns the absolute directory served.
func (s *Server) Dir() string { return s.backend.store.Root() }

// Handler returns the HTTP handler (S3 API plus /healthz), behind the
// Host check and without CORS.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve answers requests on ln until ctx is cancelled, then stops
// gracefully: it stops accepting, waits for requests in flight (up to the
// shutdown timeout) and returns nil.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 30 * time.Second}
	s.expireUploads()
	sweepCtx, stopSweep := context.WithCancel(ctx)
	defer stopSweep()
	go s.sweepUploads(sweepCtx)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.cfg.Log.Info("dev-s3 serving", "addr", ln.Addr().String(), "bucket", s.cfg.Bucket, "dir", s.Dir(),
		"signatures", s.auth != nil, "uploadExpiry", s.cfg.UploadExpiry.String())
	select {
	case err := <-errc:
		return fmt.Errorf("dev-s3 serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
		return fmt.Errorf("dev-s3 shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("dev-s3 serve: %w", err)
	}
	s.cfg.Log.Info("dev-s3 stopped")
	return nil
}

// expireUploads removes multipart uploads older than the expiry.
func (s *Server) expireUploads() {
	n, err := s.backend.uploads.expire(s.cfg.Now().Add(-s.cfg.UploadExpiry))
	if err != nil {
		s.cfg.Log.Error(err, "expiring abandoned multipart uploads")
	}
	if n > 0 {
		s.cfg.Log.Info("expired abandoned multipart uploads", "count", n, "olderThan", s.cfg.UploadExpiry.String())
	}
}

// sweepUploads runs expireUploads every UploadExpiry/4 (1s to 1h) until
// ctx ends.
func (s *Server) sweepUploads(ctx context.Context) {
	every := min(max(s.cfg.UploadExpiry/4, time.Second), time.Hour)
	_ = wait.PollUntilContextCancel(ctx, every, false, func(context.Context) (bool, error) {
		s.expireUploads()
		return false, nil // every interval until ctx ends
	})
}

// wrap puts health, logging, signatures, key safety and multipart
// conditions in front of gofakes3.
func (s *Server) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusOK)
			if r.Method == http.MethodGet {
				_, _ = w.Write([]byte("ok\n"))
			}
			return
		}
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		s.serveS3(rec, r, next)
		if log := s.cfg.Log.V(1); log.Enabled() {
			log.Info("request", "op", operation(r), "method", r.Method, "path", r.URL.Path,
				"status", rec.status, "bytes", r.ContentLength, "duration", time.Since(start).String())
		}
	})
}

func (s *Server) serveS3(w http.ResponseWriter, r *http.Request, next http.Handler) {
	check := &bodyCheck{}
	r = r.WithContext(context.WithValue(r.Context(), bodyCheckKey{}, check))
	w = &checkedWriter{ResponseWriter: w, r: r, check: check}
	refuse := func(aerr *authError) {
		if log := s.cfg.Log.V(1); log.Enabled() {
			log.Info("request refused", "code", aerr.code, "reason", aerr.detail, "method", r.Method, "path", r.URL.Path)
		}
		writeError(w, r, aerr.status, aerr.code, aerr.message, r.URL.Path)
	}
	if s.auth != nil {
		checked, aerr := s.auth.verify(r)
		if aerr != nil {
			refuse(aerr)
			return
		}
		r = checked
	}
	if isChunked(r) {
		if aerr := decodeChunked(r, nil); aerr != nil {
			refuse(aerr)
			return
		}
	}
	path := strings.TrimPrefix(r.URL.Path, "/")
	bucket, key, _ := strings.Cut(path, "/")
	if bucket != "" && key != "" {
		if err := fsbucket.ValidateKey(key); err != nil {
			writeError(w, r, http.StatusBadRequest, "InvalidArgument", err.Error(), r.URL.Path)
			return
		}
	}
	q := r.URL.Query()
	if id := q.Get("uploadId"); id != "" && r.Method == http.MethodPost {
		var c gofakes3.PutConditions
		if v := r.Header.Get("If-None-Match"); v != "" {
			c.IfNoneMatch = &v
		}
		if v := r.Header.Get("If-Match"); v != "" {
			c.IfMatch = &v
		}
		if c.IfNoneMatch != nil || c.IfMatch != nil {
			cond, err := conditionsFrom(&c)
			if err != nil {
				writeError(w, r, http.StatusBadRequest, "InvalidArgument", err.Error(), r.URL.Path)
				return
			}
			done := s.backend.setPending(gofakes3.UploadID(id), cond)
			defer done()
		}
	}
	next.ServeHTTP(w, r)
}

// operation names the S3 call for the request log.
func operation(r *http.Request) string {
	q := r.URL.Query()
	_, key, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	switch {
	case q.Has("uploadId") && r.Method == http.MethodPut:
		return "UploadPart"
	case q.Has("uploadId") && r.Method == http.MethodPost:
		return "CompleteMultipartUpload"
	case q.Has("uploadId") && r.Method == http.MethodDelete:
		return "AbortMultipartUpload"
	case q.Has("uploadId"):
		return "ListParts"
	case q.Has("uploads") && r.Method == http.MethodPost:
		return "CreateMultipartUpload"
	case q.Has("uploads"):
		return "ListMultipartUploads"
	case q.Has("delete") && r.Method == http.MethodPost:
		return "DeleteObjects"
	case key == "" && r.Method == http.MethodGet:
		return "ListObjects"
	case key == "":
		return r.Method + "Bucket"
	case r.Method == http.MethodPut && r.Header.Get("X-Amz-Copy-Source") != "":
		return "CopyObject"
	}
	switch r.Method {
	case http.MethodGet:
		return "GetObject"
	case http.MethodHead:
		return "HeadObject"
	case http.MethodPut:
		return "PutObject"
	case http.MethodDelete:
		return "DeleteObject"
	}
	return r.Method
}

type statusRecorder struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (s *statusRecorder) WriteHeader(code int) {
	if !s.wrote {
		s.status, s.wrote = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(p []byte) (int, error) {
	s.wrote = true
	return s.ResponseWriter.Write(p)
}

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

type errorBody struct {
	XMLName  xml.Name `xml:"Error"`
	Code     string   `xml:"Code"`
	Message  string   `xml:"Message"`
	Resource string   `xml:"Resource"`
}

// writeError sends an S3-style XML error.
func writeError(w http.ResponseWriter, r *http.Request, status int, code, msg, resource string) {
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write([]byte(xml.Header))
	_ = xml.NewEncoder(w).Encode(errorBody{Code: code, Message: msg, Resource: resource})
}

// gofakesLogger sends gofakes3's own messages to logr: errors as errors,
// the rest at V(2).
type gofakesLogger struct{ log logr.Logger }

func (g gofakesLogger) Print(level gofakes3.LogLevel, v ...any) {
	if level != gofakes3.LogErr && !g.log.V(2).Enabled() {
		return // gofakes3 logs every request at info: format nothing unseen
	}
	msg := strings.TrimSuffix(fmt.Sprintln(v...), "\n")
	if level == gofakes3.LogErr {
		g.log.Error(errors.New(msg), "gofakes3")
		return
	}
	g.log.V(2).Info(msg, "source", "gofakes3", "level", string(level))
}

// Endpoint is the URL clients use for a listener address (loopback for an
// unspecified address).
func Endpoint(addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return "http://" + addr.String()
	}
	ip := tcp.IP
	if ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
	}
	return "http://" + net.JoinHostPort(ip.String(), strconv.Itoa(tcp.Port))
}

// Usage is the short guide printed at start: the endpoint and an aws CLI
// example.
func (s *Server) Usage(addr net.Addr) string {
	ep := Endpoint(addr)
	creds := "AWS_ACCESS_KEY_ID=dev AWS_SECRET_ACCESS_KEY=dev"
	note := "any credentials are accepted"
	if s.auth != nil {
		creds = "AWS_ACCESS_KEY_ID=" + s.cfg.AccessKey + " AWS_SECRET_ACCESS_KEY=<--secret-key>"
		note = "requests must be signed (SigV4) with --access-key/--secret-key"
	}
	return fmt.Sprintf("dev-s3 is serving bucket %q at %s (files in %s; %s)\n  %s aws --endpoint-url %s --region us-east-1 s3 ls s3://%s/\n",
		s.cfg.Bucket, ep, s.Dir(), note, creds, ep, s.cfg.Bucket)
}
