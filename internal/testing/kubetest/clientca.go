package kubetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// bundleAuthn authenticates envtest's users with client certificates, like
// envtest's own default, but points kube-apiserver's --client-ca-file at a
// bundle: its own CA (which signs the admin and every AddUser certificate)
// followed by extra CAs the test trusts too (e.g. a node CA). envtest sets
// --client-ca-file from its authenticator after the caller's flags, so a
// client-ca-file in Options.APIServerArgs would be overwritten; this is the
// way to add a CA.
type bundleAuthn struct {
	extra  []byte
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPEM  []byte
	path   string
}

var _ envtest.Authn = (*bundleAuthn)(nil)

func newBundleAuthn(extra []byte) (*bundleAuthn, error) {
	remaining := extra
	n := 0
	for {
		var b *pem.Block
		b, remaining = pem.Decode(remaining)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("client CAs: PEM block %d is %q, want CERTIFICATE", n+1, b.Type)
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return nil, fmt.Errorf("client CAs: certificate %d: %w", n+1, err)
		}
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("client CAs: no PEM certificate found")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate envtest client CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubetest-client-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create envtest client CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse envtest client CA: %w", err)
	}
	return &bundleAuthn{
		extra:  extra,
		caCert: cert,
		caKey:  key,
		caPEM:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	}, nil
}

func (a *bundleAuthn) Configure(workDir string, args *envtest.Arguments) error {
	a.path = filepath.Join(workDir, "client-ca-bundle.crt")
	args.Set("client-ca-file", a.path)
	return nil
}

func (a *bundleAuthn) Start() error {
	if a.path == "" {
		return fmt.Errorf("client CA bundle: Start called before Configure")
	}
	bundle := append(append([]byte{}, a.caPEM...), a.extra...)
	if err := os.WriteFile(a.path, bundle, 0o600); err != nil {
		return fmt.Errorf("write client CA bundle: %w", err)
	}
	return nil
}

func (a *bundleAuthn) AddUser(user envtest.User, base *rest.Config) (*rest.Config, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key of user %s: %w", user.Name, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, fmt.Errorf("serial of user %s: %w", user.Name, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: user.Name, Organization: user.Groups},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     a.caCert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.caCert, &key.PublicKey, a.caKey)
	if err != nil {
		return nil, fmt.Errorf("sign certificate of user %s: %w", user.Name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key of user %s: %w", user.Name, err)
	}
	cfg := rest.CopyConfig(base)
	cfg.CertData = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	cfg.KeyData = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	return cfg, nil
}

func (a *bundleAuthn) Stop() error { return nil }
