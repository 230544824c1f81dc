package s3store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/pkg/objstore"
)

// DefaultRegion is used when no region is configured.
const DefaultRegion = "us-east-1"

// Store is an objstore.Store over one bucket, optionally under a key prefix.
type Store struct {
	client *s3.Client
	bucket string
	prefix string
}

var _ objstore.Store = (*Store)(nil)

// New builds a client from the standard AWS environment (see the package
// doc) and returns a store over bucket. prefix, when not empty, is
// prepended to every key (a trailing slash is added when missing).
func New(ctx context.Context, bucket, prefix string) (*Store, error) {
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("load AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = DefaultRegion
	}
	pathStyle := false
	if v := os.Getenv("AWS_S3_USE_PATH_STYLE"); v != "" {
		if pathStyle, err = strconv.ParseBool(v); err != nil {
			return nil, fmt.Errorf("AWS_S3_USE_PATH_STYLE=%q is not a boolean: %w", v, err)
		}
	}
	client := s3.NewFromConfig(cfg, func(o *s3.Options) {
		o.UsePathStyle = pathStyle
		o.DisableLogOutputChecksumValidationSkipped = true
		Tune(o)
	})
	return NewWithClient(client, bucket, prefix)
}

// NewWithClient returns a store that uses an existing client.
func NewWithClient(client *s3.Client, bucket, prefix string) (*Store, error) {
	if bucket == "" {
		return nil, errors.New("s3store: bucket name is empty")
	}
	if prefix != "" {
		if err := objstore.ValidatePrefix(prefix); err != nil {
			return nil, fmt.Errorf("s3store: key prefix: %w", err)
		}
		if !strings.HasSuffix(prefix, "/") {
			prefix += "/"
		}
	}
	return &Store{client: client, bucket: bucket, prefix: prefix}, nil
}

// Client returns the underlying S3 client.
func (s *Store) Client() *s3.Client { return s.client }

func (s *Store) full(key string) string { return s.prefix + key }

// validate applies objstore.ValidateKey and checks that the prefixed key
// still fits S3's key length limit.
func (s *Store) validate(key string) error {
	if err := objstore.ValidateKey(key); err != nil {
		return err
	}
	if n := len(s.prefix) + len(key); n > objstore.MaxKeyLength {
		return fmt.Errorf("%w: %q with the store prefix %q is %d bytes, longer than %d", objstore.ErrInvalidKey, key, s.prefix, n, objstore.MaxKeyLength)
	}
	return nil
}

func unquote(etag *string) string { return strings.Trim(aws.ToString(etag), `"`) }

// mapErr turns S3 errors into objstore errors, keeping the original text.
func mapErr(op, key string, err error) error {
	var re *awshttp.ResponseError
	status := 0
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	code := ""
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	switch {
	case status == http.StatusNotFound || code == "NoSuchKey" || code == "NotFound":
		return fmt.Errorf("%s %s: %w: %v", op, key, objstore.ErrNotFound, err)
	case code == codeObjectIsDirectory:
		return fmt.Errorf("%s %s: %w: %w", op, key, errDirectoryRace, err)
	case status == http.StatusPreconditionFailed || code == "PreconditionFailed" || code == "ConditionalRequestConflict" ||
		(status == http.StatusConflict && code != "BucketNotEmpty" && code != "BucketAlreadyExists"):
		return fmt.Errorf("%s %s: %w: %v", op, key, objstore.ErrPreconditionFailed, err)
	}
	return fmt.Errorf("%s %s: %w", op, key, err)
}

// codeObjectIsDirectory is Versity Gateway's 409 for a PUT into a directory
// its posix backend removed meanwhile (a DELETE of the directory's last
// object prunes it). It says nothing about the key's current object, so it
// must not read as a failed precondition (a create-only write would look
// taken, a nonce used): the PUT is tried again instead.
const codeObjectIsDirectory = "ExistingObjectIsDirectory"

var errDirectoryRace = errors.New("the store raced a removal of the key's parent directory")

// putRetry paces the PUTs that meet errDirectoryRace: 5 tries over about 150 ms.
func putRetry() wait.Backoff {
	return wait.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Steps: 5}
}

// Get implements objstore.Store.
func (s *Store) Get(ctx context.Context, key string) (*objstore.Object, error) {
	if err := s.validate(key); err != nil {
		return nil, fmt.Errorf("get: %w", err)
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: aws.String(s.full(key))})
	if err != nil {
		return nil, mapErr("get", key, err)
	}
	defer out.Body.Close()
	body, err := io.ReadAll(out.Body)
	if err != nil {
		return nil, fmt.Errorf("get %s: read body: %w", key, err)
	}
	return &objstore.Object{
		ObjectInfo: objstore.ObjectInfo{Key: key, ETag: unquote(out.ETag), Size: int64(len(body)), LastModified: aws.ToTime(out.LastModified)},
		Body:       body,
	}, nil
}

// Head implements objstore.Store.
func (s *Store) Head(ctx context.Context, key string) (*objstore.ObjectInfo, error) {
	if err := s.validate(key); err != nil {
		return nil, fmt.Errorf("head: %w", err)
	}
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: aws.String(s.full(key))})
	if err != nil {
		return nil, mapErr("head", key, err)
	}
	return &objstore.ObjectInfo{Key: key, ETag: unquote(out.ETag), Size: aws.ToInt64(out.ContentLength), LastModified: aws.ToTime(out.LastModified)}, nil
}

// Put implements objstore.Store. A conditional write that S3 answers with
// 404 (If-Match on a missing key) is reported as ErrPreconditionFailed, like
// the other backends.
func (s *Store) Put(ctx context.Context, key string, body []byte, opts objstore.PutOptions) (string, error) {
	if err := s.validate(key); err != nil {
		return "", fmt.Errorf("put: %w", err)
	}
	in := &s3.PutObjectInput{
		Bucket:        &s.bucket,
		Key:           aws.String(s.full(key)),
		ContentLength: aws.Int64(int64(len(body))),
	}
	if opts.IfNoneMatch {
		in.IfNoneMatch = aws.String("*")
	}
	if opts.IfMatch != "" {
		in.IfMatch = aws.String(`"` + strings.Trim(opts.IfMatch, `"`) + `"`)
	}
	var (
		out  *s3.PutObjectOutput
		race error
	)
	err := wait.ExponentialBackoffWithContext(ctx, putRetry(), func(ctx context.Context) (bool, error) {
		in.Body = bytes.NewReader(body)
		o, err := s.client.PutObject(ctx, in)
		if err != nil {
			if err = mapErr("put", key, err); errors.Is(err, errDirectoryRace) {
				race = err
				return false, nil
			}
			return false, err
		}
		out = o
		return true, nil
	})
	if wait.Interrupted(err) && race != nil && ctx.Err() == nil {
		err = race // every try met the race
	}
	if err != nil {
		if opts.IfMatch != "" && errors.Is(err, objstore.ErrNotFound) {
			return "", fmt.Errorf("put %s: %w: object does not exist", key, objstore.ErrPreconditionFailed)
		}
		return "", err
	}
	return unquote(out.ETag), nil
}

// Delete implements objstore.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.validate(key); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: aws.String(s.full(key))}); err != nil {
		err = mapErr("delete", key, err)
		if errors.Is(err, objstore.ErrNotFound) {
			return nil
		}
		return err
	}
	return nil
}

// List implements objstore.Store, following every page.
func (s *Store) List(ctx context.Context, prefix string) ([]objstore.ObjectInfo, error) {
	if err := objstore.ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: aws.String(s.full(prefix))})
	out := []objstore.ObjectInfo{}
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, mapErr("list", prefix, err)
		}
		for _, o := range page.Contents {
			out = append(out, objstore.ObjectInfo{
				Key:          strings.TrimPrefix(aws.ToString(o.Key), s.prefix),
				ETag:         unquote(o.ETag),
				Size:         aws.ToInt64(o.Size),
				LastModified: aws.ToTime(o.LastModified),
			})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}
