package clustercmd

import (
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

	"github.com/golang-jwt/jwt/v5"
	"github.com/urfave/cli/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/internal/server/layout"
	"github.com/nstance-dev/nstance/internal/server/storage"
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
		Subcommands: []*cli.Command{nonceCommand(), registerCommand()},
	}
}

func storageFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "storage", Value: "s3", Usage: "object storage kind: s3 or file", EnvVars: []string{"NSTANCE_STORAGE"}},
		&cli.StringFlag{Name: "storage-bucket", Usage: "S3 bucket (endpoint and credentials from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)", EnvVars: []string{"NSTANCE_STORAGE_BUCKET"}},
		&cli.StringFlag{Name: "storage-prefix", Usage: "key prefix inside the bucket", EnvVars: []string{"NSTANCE_STORAGE_PREFIX"}},
		&cli.StringFlag{Name: "storage-dir", Usage: "directory for --storage file", EnvVars: []string{"NSTANCE_STORAGE_DIR"}},
	}
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
		&cli.StringFlag{Name: "operator-id", Value: "nstance-operator", Usage: "operator id (certificate CN)"},
		&cli.StringFlag{Name: "role", Value: "operator", Usage: "operator, or admin (may also RefreshConfig)"},
	}
}

func nonceCommand() *cli.Command {
	flags := append(identityFlags(), storageFlags()...)
	flags = append(flags, keyFlags()...)
	flags = append(flags,
		&cli.DurationFlag{Name: "expiry", Value: DefaultExpiry, Usage: "how long the nonce stays valid"},
		&cli.StringFlag{Name: "output", Value: "-", Usage: "file to write the nonce JWT to, - for stdout"},
	)
	return &cli.Command{
		Name:  "nonce",
		Usage: "mint a single-use operator registration nonce",
		Flags: flags,
		Action: func(c *cli.Context) error {
			tok, err := mintFromStorage(c.Context, c)
			if err != nil {
				return err
			}
			return writeOutput(c.App.Writer, c.String("output"), []byte(tok+"\n"), 0o600)
		},
	}
}

// store opens object storage and the key layout from the flags.
func store(ctx context.Context, c *cli.Context) (objstore.Store, layout.Keys, error) {
	kind := c.String("storage")
	if kind == "s3" && c.String("storage-bucket") == "" {
		return nil, layout.Keys{}, errors.New("--storage-bucket is required for s3 storage")
	}
	return storage.Open(ctx, storage.Options{Kind: kind, Bucket: c.String("storage-bucket"), Dir: c.String("storage-dir"), Prefix: c.String("storage-prefix")})
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

func mintFromStorage(ctx context.Context, c *cli.Context) (string, error) {
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
	key, err := LoadNonceKey(ctx, objs, keys, src)
	if err != nil {
		return "", err
	}
	return nonce.Mint(key, nonce.Claims{
		Kind: kind, ClusterID: c.String("cluster-id"), Tenant: c.String("tenant"),
		RegisteredClaims: jwt.RegisteredClaims{Subject: c.String("operator-id")},
	}, c.Duration("expiry"), time.Now())
}

func writeOutput(stdout io.Writer, path string, data []byte, mode os.FileMode) error {
	if path == "-" || path == "" {
		_, err := stdout.Write(data)
		return err
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
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
	)
	return &cli.Command{
		Name:  "register-operator",
		Usage: "register an operator identity and write its CA, key and certificate",
		Flags: flags,
		Action: func(c *cli.Context) error {
			ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
			defer cancel()
			return register(ctx, c)
		},
	}
}

func register(ctx context.Context, c *cli.Context) error {
	var caPEM []byte
	if f := c.String("ca-file"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("reading CA: %w", err)
		}
		caPEM = b
	} else {
		objs, keys, err := store(ctx, c)
		if err != nil {
			return err
		}
		obj, err := objs.Get(ctx, keys.CACert())
		if err != nil {
			return fmt.Errorf("reading %s: %w", keys.CACert(), err)
		}
		caPEM = obj.Body
	}
	caCert, err := pki.ParseCertificatePEM(caPEM)
	if err != nil {
		return fmt.Errorf("cluster CA: %w", err)
	}
	var tok string
	if f := c.String("nonce-file"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("reading nonce: %w", err)
		}
		tok = strings.TrimSpace(string(b))
	} else if tok, err = mintFromStorage(ctx, c); err != nil {
		return err
	}

	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("generating operator key: %w", err)
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(priv)
	if err != nil {
		return err
	}
	pubPEM, err := pki.MarshalPublicKeyPEM(pub)
	if err != nil {
		return err
	}
	// Write the key before registering so a crash after registration does not lose it.
	dir := c.String("out-dir")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	keyFile := filepath.Join(dir, "operator.key")
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", keyFile, err)
	}

	pool := x509Pool(caCert)
	host := c.String("registration-addr")
	conn, err := grpc.NewClient(host, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientTLS(pool, nil, hostOf(host)))))
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", host, err)
	}
	defer conn.Close()
	resp, err := nstancev1.NewRegistrationServiceClient(conn).RegisterOperator(ctx, &nstancev1.RegisterOperatorRequest{Nonce: tok, PublicKeyPem: string(pubPEM)})
	if err != nil {
		return fmt.Errorf("registering with %s: %w", host, err)
	}
	for name, data := range map[string][]byte{"ca.crt": caPEM, "operator.crt": []byte(resp.GetCertificatePem())} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil { //nolint:gosec // public material
			return fmt.Errorf("writing %s: %w", name, err)
		}
	}
	fmt.Fprintf(c.App.Writer, "registered %s (expires %s); wrote %s\n", resp.GetIdentity().GetUri(),
		resp.GetExpiresAt().AsTime().Format(time.RFC3339), strings.Join([]string{filepath.Join(dir, "ca.crt"), keyFile, filepath.Join(dir, "operator.crt")}, ", "))
	return nil
}
