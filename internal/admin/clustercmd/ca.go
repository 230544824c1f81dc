package clustercmd

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/admin/output"
	"github.com/nstance-dev/nstance/internal/atomicfile"
	"github.com/nstance-dev/nstance/internal/importedca"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// caCommand is `cluster ca`: the CAs an admin imports (the third trust
// root), e.g. a workload Kubernetes cluster's CA for kubelet certificates.
func caCommand() *cli.Command {
	name := &cli.StringFlag{Name: "name", Usage: "name templates use for the CA (certificate \"ca\")", Required: true}
	return &cli.Command{
		Name:  "ca",
		Usage: "import, list and delete CAs that template certificates may be signed by (e.g. a Kubernetes cluster's CA)",
		Subcommands: []*cli.Command{
			{
				Name:  "import",
				Usage: "store a CA certificate and its key (encrypted with the cluster's key) under a name",
				Description: "The key may be PKCS#8, PKCS#1 (kubeadm's ca.key) or SEC 1 PEM. Nstance's own cluster and workload\n" +
					"CAs are refused. Servers pick the CA up within 10 seconds; templates name it with\n" +
					"keys.<key>.certificate.ca.",
				Flags: sealedFlags(name,
					&cli.StringFlag{Name: "cert", Usage: "CA certificate PEM file", Required: true},
					&cli.StringFlag{Name: "key", Usage: "CA private key PEM file", Required: true},
					&cli.BoolFlag{Name: "replace", Usage: "replace a CA already imported under this name"}),
				Action: func(c *cli.Context) error {
					certPEM, err := os.ReadFile(c.String("cert"))
					if err != nil {
						return fmt.Errorf("reading --cert: %w", err)
					}
					keyPEM, err := os.ReadFile(c.String("key"))
					if err != nil {
						return fmt.Errorf("reading --key: %w", err)
					}
					s, err := caStore(c)
					if err != nil {
						return err
					}
					own, err := ownCAs(c, s)
					if err != nil {
						return err
					}
					ca, err := s.Import(c.Context, c.String("name"), certPEM, keyPEM, own, c.Bool("replace"), time.Now())
					if err != nil {
						return fmt.Errorf("importing CA %q: %w", c.String("name"), err)
					}
					return printCA(c, c.String("name"), ca)
				},
			},
			{
				Name:  "create",
				Usage: "generate a new CA (ECDSA P-256) under a name, for a cluster whose API server has no CA yet (development)",
				Description: "The certificate is written to --cert-out for the API server's --client-ca-file; the key stays\n" +
					"sealed in storage. A CA already stored under the name is kept (and written out) unless --replace.",
				Flags: sealedFlags(name,
					&cli.StringFlag{Name: "cert-out", Usage: "write the CA certificate (PEM) here", Required: true},
					&cli.DurationFlag{Name: "validity", Value: 10 * 365 * 24 * time.Hour, Usage: "CA lifetime"},
					&cli.BoolFlag{Name: "replace", Usage: "replace a CA already stored under this name"}),
				Action: func(c *cli.Context) error {
					s, err := caStore(c)
					if err != nil {
						return err
					}
					ca, err := s.Load(c.Context, c.String("name"))
					switch {
					case err == nil && !c.Bool("replace"):
					case err == nil || errors.Is(err, importedca.ErrNotImported):
						if ca, err = s.Create(c.Context, c.String("name"), c.Duration("validity"), time.Now()); err != nil {
							return fmt.Errorf("creating CA %q: %w", c.String("name"), err)
						}
					default:
						return err
					}
					if err := atomicfile.WritePath(c.String("cert-out"), ca.CertPEM, 0o644); err != nil {
						return fmt.Errorf("writing --cert-out: %w", err)
					}
					return printCA(c, c.String("name"), ca)
				},
			},
			{
				Name:  "list",
				Usage: "list the imported CAs",
				Flags: sealedFlags(),
				Action: func(c *cli.Context) error {
					s, err := caStore(c)
					if err != nil {
						return err
					}
					infos, err := s.List(c.Context)
					if err != nil {
						return err
					}
					p, err := printer(c, c.App.Writer)
					if err != nil {
						return err
					}
					if p.Machine() {
						return p.Document(infos)
					}
					t := output.Rows{Header: []string{"NAME", "SUBJECT", "NOT AFTER", "SHA256"}}
					for _, i := range infos {
						t.Add(i.Name, i.Subject, i.NotAfter.UTC().Format(time.RFC3339), i.SHA256)
					}
					return p.Table(t)
				},
			},
			{
				Name:  "delete",
				Usage: "delete an imported CA (certificates it signed stay valid until they expire)",
				Flags: sealedFlags(name),
				Action: func(c *cli.Context) error {
					s, err := caStore(c)
					if err != nil {
						return err
					}
					return s.Delete(c.Context, c.String("name"))
				},
			},
		},
	}
}

func caStore(c *cli.Context) (*importedca.Store, error) {
	objs, keys, sec, err := secretStore(c.Context, c)
	if err != nil {
		return nil, err
	}
	return &importedca.Store{Objects: objs, Keys: keys, Secrets: sec}, nil
}

// ownCAs reads the cluster CA and every workload CA certificate (each
// tenant's, and the shared one of an older cluster), which may never be
// imported (a missing one is skipped: a cluster not bootstrapped yet).
func ownCAs(c *cli.Context, s *importedca.Store) ([]*pki.CA, error) {
	var out []*pki.CA
	keys := []string{s.Keys.CACert(), s.Keys.WorkloadCACert()}
	infos, err := s.Objects.List(c.Context, s.Keys.TenantWorkloadCAPrefix())
	if err != nil {
		return nil, fmt.Errorf("listing the tenants' workload CAs: %w", err)
	}
	for _, info := range infos {
		if strings.HasSuffix(info.Key, "/workload-ca.crt") {
			keys = append(keys, info.Key)
		}
	}
	for _, key := range keys {
		obj, err := s.Objects.Get(c.Context, key)
		if errors.Is(err, objstore.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", key, err)
		}
		cert, err := pki.ParseCertificatePEM(obj.Body)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		out = append(out, &pki.CA{Cert: cert, CertPEM: obj.Body})
	}
	return out, nil
}

func printCA(c *cli.Context, name string, ca *pki.CA) error {
	p, err := printer(c, c.App.Writer)
	if err != nil {
		return err
	}
	info := importedca.Info{Name: name, Subject: ca.Cert.Subject.String(), NotAfter: ca.Cert.NotAfter, SHA256: pki.Fingerprint(ca.Cert)}
	if p.Machine() {
		return p.Document(info)
	}
	return p.Fields("name", info.Name, "subject", info.Subject, "not after", info.NotAfter.UTC().Format(time.RFC3339), "sha256", info.SHA256)
}
