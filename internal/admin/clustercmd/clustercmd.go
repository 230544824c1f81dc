package clustercmd

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/golang-jwt/jwt/v5"
	"github.com/urfave/cli/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/admin/cmdutil"
	"github.com/nstance-dev/nstance/internal/admin/output"
	"github.com/nstance-dev/nstance/internal/atomicfile"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/msgsize"
	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/internal/storage"
	"github.com/nstance-dev/nstance/pkg/objstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// DefaultExpiry is the default lifetime of an operator nonce.
const DefaultExpiry = 3 * time.Hour

// Command returns the `cluster` command.
func Command() *cli.Command {
	return &cli.Command{
		Name:        "cluster",
		Usage:       "cluster-wide administration",
		Subcommands: []*cli.Command{nonceCommand(), registerCommand(), rotateCACommand(), rotateKeyCommand(), caCommand(), secretCommand()},
	}
}

// storageFlags are nstance-server's storage flags, with the same names and
// variables. --storage-bucket and --storage-prefix, their names before, still
// work but are no longer shown.
func storageFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "storage", Value: "s3", Usage: "object storage kind: s3, gcs or file", EnvVars: []string{"NSTANCE_STORAGE"}},
		&cli.StringFlag{Name: "bucket", Usage: "S3 bucket (endpoint and credentials from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)", EnvVars: []string{"NSTANCE_STORAGE_BUCKET"}},
		&cli.StringFlag{Name: "prefix", Usage: "key prefix inside the bucket", EnvVars: []string{"NSTANCE_STORAGE_PREFIX"}},
		&cli.StringFlag{Name: "storage-dir", Usage: "directory for --storage file", EnvVars: []string{"NSTANCE_STORAGE_DIR"}},
		&cli.StringFlag{Name: "storage-bucket", Hidden: true, Usage: "old name of --bucket"},
		&cli.StringFlag{Name: "storage-prefix", Hidden: true, Usage: "old name of --prefix"},
	}
}

// renamed returns the value of a flag that also has an old name; giving
// both with different values is an error.
func renamed(c *cli.Context, name, old string) (string, error) {
	v := c.String(name)
	if c.IsSet(old) {
		if c.IsSet(name) && v != c.String(old) {
			return "", fmt.Errorf("--%s %q and --%s %q (its old name) disagree: give only --%s", name, v, old, c.String(old), name)
		}
		return c.String(old), nil
	}
	return v, nil
}

func keyFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "key-provider", Value: "env", Usage: "where the encryption key comes from: env or file"},
		&cli.StringFlag{Name: "key-env", Value: "NSTANCE_ENCRYPTION_KEY", Usage: "variable holding the key for --key-provider env"},
		&cli.StringFlag{Name: "key-file", Usage: "file holding the key for --key-provider file"},
	}
}

func identityFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "cluster-id", Usage: "Nstance cluster id", Required: true, EnvVars: []string{"NSTANCE_CLUSTER_ID"}},
		&cli.StringFlag{Name: "tenant", Value: "default", Usage: "tenant the operator acts for"},
		&cli.StringFlag{Name: "operator-id", Value: "nstance-operator", Usage: "operator id (certificate CN), scoped to --tenant: the same id in another tenant is another operator"},
		&cli.StringFlag{Name: "role", Value: "operator", Usage: "operator, or admin (may also RefreshConfig)"},
	}
}

// outputFlag is -o for the cluster commands. "-", the value --output had
// when it named a file, still means the table form on stdout.
func outputFlag() cli.Flag {
	return &cli.StringFlag{Name: output.FlagName, Aliases: []string{"o"}, Value: string(output.Table),
		Usage: "output format: table, json, yaml",
		Action: func(_ *cli.Context, v string) error {
			if v == "-" {
				return nil
			}
			if _, err := output.Parse(v); err != nil {
				return fmt.Errorf("%w (to write to a file, use --out-file)", err)
			}
			return nil
		}}
}

func printer(c *cli.Context, w io.Writer) (*output.Printer, error) {
	v := c.String(output.FlagName)
	if v == "-" {
		v = string(output.Table)
	}
	f, err := output.Parse(v)
	if err != nil {
		return nil, err
	}
	return &output.Printer{W: w, Format: f, Now: time.Now}, nil
}

// nonceResult is the machine form of `cluster nonce`.
type nonceResult struct {
	Nonce      string `json:"nonce"`
	ClusterID  string `json:"cluster_id"`
	Tenant     string `json:"tenant"`
	OperatorID string `json:"operator_id"`
	ExpiresAt  string `json:"expires_at"`
}

func nonceCommand() *cli.Command {
	flags := append(identityFlags(), storageFlags()...)
	flags = append(flags, keyFlags()...)
	flags = append(flags,
		&cli.DurationFlag{Name: "expiry", Value: DefaultExpiry, Usage: "how long the nonce stays valid"},
		outputFlag(),
		&cli.StringFlag{Name: "out-file", Usage: "write the output to this file (mode 0600) instead of stdout"},
	)
	flags = append(flags, cmdutil.LogFlags()...)
	return &cli.Command{
		Name:  "nonce",
		Usage: "mint a single-use operator registration nonce (table output: the JWT alone)",
		Flags: flags,
		Action: func(c *cli.Context) error {
			var buf bytes.Buffer
			p, err := printer(c, &buf)
			if err != nil {
				return err
			}
			log, flush, err := cmdutil.Logger(c)
			if err != nil {
				return err
			}
			defer flush()
			now := time.Now()
			tok, err := mintFromStorage(c.Context, c, log, now)
			if err != nil {
				return err
			}
			if p.Machine() {
				err = p.Document(nonceResult{Nonce: tok, ClusterID: c.String("cluster-id"), Tenant: c.String("tenant"),
					OperatorID: c.String("operator-id"), ExpiresAt: now.Add(c.Duration("expiry")).UTC().Format(time.RFC3339)})
			} else {
				_, err = fmt.Fprintln(p.W, tok)
			}
			if err != nil {
				return err
			}
			if f := c.String("out-file"); f != "" {
				if err := atomicfile.WritePath(f, buf.Bytes(), 0o600); err != nil {
					return fmt.Errorf("--out-file: %w", err)
				}
				log.V(1).Info("wrote the nonce", "file", f)
				return nil
			}
			_, err = c.App.Writer.Write(buf.Bytes())
			return err
		},
	}
}

// store opens object storage and the key layout from the flags.
func store(ctx context.Context, c *cli.Context) (objstore.Store, layout.Keys, error) {
	kind := c.String("storage")
	bucket, err := renamed(c, "bucket", "storage-bucket")
	if err != nil {
		return nil, layout.Keys{}, err
	}
	prefix, err := renamed(c, "prefix", "storage-prefix")
	if err != nil {
		return nil, layout.Keys{}, err
	}
	if kind == "s3" && bucket == "" {
		return nil, layout.Keys{}, errors.New("--bucket (or NSTANCE_STORAGE_BUCKET) is required for s3 storage")
	}
	return storage.Open(ctx, storage.Options{Kind: kind, Bucket: bucket, Dir: c.String("storage-dir"), Prefix: prefix})
}

// LoadNonceKey reads and decrypts the cluster nonce-signing key.
func LoadNonceKey(ctx context.Context, objs objstore.Store, keys layout.Keys, src secrets.Source) (ed25519.PrivateKey, error) {
	key, err := secrets.Load(src, nil)
	if err != nil {
		return nil, err
	}
	ring, err := secrets.NewKeyring(key)
	if err != nil {
		return nil, err
	}
	p, err := (&secrets.Store{Objects: objs, Ring: ring}).Get(ctx, keys.NonceSigningKey())
	if errors.Is(err, objstore.ErrNotFound) {
		return nil, fmt.Errorf("%s does not exist: start the cluster leader first so it creates the cluster secrets", keys.NonceSigningKey())
	}
	if err != nil {
		return nil, err
	}
	signer, err := pki.ParsePrivateKeyPEM(p)
	if err != nil {
		return nil, fmt.Errorf("nonce-signing key: %w", err)
	}
	k, ok := signer.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("nonce-signing key is %T, want Ed25519", signer)
	}
	return k, nil
}

func mintFromStorage(ctx context.Context, c *cli.Context, log logr.Logger, now time.Time) (string, error) {
	if c.Duration("expiry") <= 0 {
		return "", fmt.Errorf("--expiry must be positive, got %s", c.Duration("expiry"))
	}
	kind := nonce.Kind(c.String("role"))
	if kind != nonce.KindOperator && kind != nonce.KindAdmin {
		return "", fmt.Errorf("--role must be operator or admin, got %q", c.String("role"))
	}
	objs, keys, err := store(ctx, c)
	if err != nil {
		return "", err
	}
	src := secrets.Source{Provider: c.String("key-provider"), Env: c.String("key-env"), File: c.String("key-file")}
	log.V(1).Info("reading the nonce-signing key", "key", keys.NonceSigningKey(), "key-provider", src.Provider)
	key, err := LoadNonceKey(ctx, objs, keys, src)
	if err != nil {
		return "", err
	}
	return nonce.Mint(key, nonce.Claims{
		Kind: kind, ClusterID: c.String("cluster-id"), Tenant: c.String("tenant"),
		RegisteredClaims: jwt.RegisteredClaims{Subject: c.String("operator-id")},
	}, c.Duration("expiry"), now)
}

func registerCommand() *cli.Command {
	flags := append(identityFlags(), storageFlags()...)
	flags = append(flags, keyFlags()...)
	flags = append(flags,
		&cli.StringFlag{Name: "registration-addr", Usage: "host:port of a shard's Registration service", Required: true},
		&cli.StringFlag{Name: "nonce-file", Usage: "use this nonce instead of minting one (then no encryption key is needed)"},
		&cli.DurationFlag{Name: "expiry", Value: 10 * time.Minute, Usage: "lifetime of the nonce minted when --nonce-file is not given"},
		&cli.StringFlag{Name: "ca-file", Usage: "cluster CA certificate; read from storage (cluster/ca.crt) when empty"},
		&cli.StringFlag{Name: "out-dir", Value: ".", Usage: "directory for ca.crt, operator.key and operator.crt"},
		&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "registration timeout"},
		outputFlag(),
	)
	flags = append(flags, cmdutil.LogFlags()...)
	return &cli.Command{
		Name:  "register-operator",
		Usage: "register an operator identity and write its CA, key and certificate",
		Flags: flags,
		Action: func(c *cli.Context) error {
			p, err := printer(c, c.App.Writer)
			if err != nil {
				return err
			}
			log, flush, err := cmdutil.Logger(c)
			if err != nil {
				return err
			}
			defer flush()
			ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
			defer cancel()
			res, err := register(ctx, c, log)
			if err != nil {
				return err
			}
			if p.Machine() {
				return p.Document(res)
			}
			_, err = fmt.Fprintf(p.W, "registered %s (expires %s); wrote %s, %s, %s\n"+
				"use them with: nstance-admin context set NAME --servers SHARD=HOST:PORT --ca-cert %s --cert %s --key %s\n",
				res.Identity, res.ExpiresAt, res.CACert, res.Key, res.Cert, res.CACert, res.Cert, res.Key)
			return err
		},
	}
}

// registration is the machine form of `cluster register-operator`.
type registration struct {
	Identity  string `json:"identity"`
	ExpiresAt string `json:"expires_at"`
	CACert    string `json:"ca_cert"`
	Key       string `json:"key"`
	Cert      string `json:"cert"`
}

func register(ctx context.Context, c *cli.Context, log logr.Logger) (*registration, error) {
	var caPEM []byte
	if f := c.String("ca-file"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("reading CA: %w", err)
		}
		caPEM = b
	} else {
		objs, keys, err := store(ctx, c)
		if err != nil {
			return nil, err
		}
		// The bundle (both CAs while the cluster CA rotates) when there is one.
		obj, err := objs.Get(ctx, keys.CABundle())
		if errors.Is(err, objstore.ErrNotFound) {
			obj, err = objs.Get(ctx, keys.CACert())
		}
		if err != nil {
			return nil, fmt.Errorf("reading the cluster CA: %w", err)
		}
		caPEM = obj.Body
	}
	caCerts, err := pki.ParseCertificatesPEM(caPEM)
	if err != nil {
		return nil, fmt.Errorf("cluster CA: %w", err)
	}
	var tok string
	if f := c.String("nonce-file"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("reading nonce: %w", err)
		}
		tok = strings.TrimSpace(string(b))
	} else if tok, err = mintFromStorage(ctx, c, log, time.Now()); err != nil {
		return nil, err
	}

	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating operator key: %w", err)
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(priv)
	if err != nil {
		return nil, err
	}
	pubPEM, err := pki.MarshalPublicKeyPEM(pub)
	if err != nil {
		return nil, err
	}
	// Write the new key before registering so a crash after registration
	// does not lose it, but under its own name: an operator.key already in
	// the directory stays until the new certificate is there to pair with.
	dir := c.String("out-dir")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	keyFile, pendingKey := filepath.Join(dir, "operator.key"), filepath.Join(dir, "operator.key.new")
	if err := atomicfile.WritePath(pendingKey, keyPEM, 0o600); err != nil {
		return nil, err
	}

	pool := x509Pool(caCerts...)
	host := c.String("registration-addr")
	conn, err := grpc.NewClient(host, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientTLS(pool, nil, hostOf(host)))), msgsize.DialOption())
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", host, err)
	}
	defer conn.Close()
	resp, err := nstancev1.NewRegistrationServiceClient(conn).RegisterOperator(ctx, &nstancev1.RegisterOperatorRequest{Nonce: tok, PublicKeyPem: string(pubPEM)})
	if err != nil {
		switch status.Code(err) {
		case codes.InvalidArgument, codes.AlreadyExists, codes.PermissionDenied, codes.Unauthenticated, codes.FailedPrecondition:
			// Refused: the new key was never registered.
			_ = os.Remove(pendingKey)
		default:
			log.Info("the registration may have happened; the new key is kept", "file", pendingKey)
		}
		return nil, fmt.Errorf("registering with %s: %w", host, err)
	}
	log.V(1).Info("registered", "identity", resp.GetIdentity().GetUri(), "dir", dir)
	if err := os.Rename(pendingKey, keyFile); err != nil {
		return nil, fmt.Errorf("moving the new key into place (it is in %s): %w", pendingKey, err)
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{"ca.crt", caPEM}, {"operator.crt", []byte(resp.GetCertificatePem())}} {
		if err := atomicfile.WritePath(filepath.Join(dir, f.name), f.data, 0o644); err != nil {
			return nil, err
		}
	}
	return &registration{Identity: resp.GetIdentity().GetUri(), ExpiresAt: resp.GetExpiresAt().AsTime().UTC().Format(time.RFC3339),
		CACert: filepath.Join(dir, "ca.crt"), Key: keyFile, Cert: filepath.Join(dir, "operator.crt")}, nil
}
