package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Bundle is a CA and a serving certificate signed by it.
type Bundle struct {
	CAPEM   []byte
	CertPEM []byte
	KeyPEM  []byte
}

// TLSConfig returns a server TLS configuration using the serving certificate.
func (b *Bundle) TLSConfig() (*tls.Config, error) {
	pair, err := tls.X509KeyPair(b.CertPEM, b.KeyPEM)
	if err != nil {
		return nil, fmt.Errorf("load serving certificate: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}, nil
}

// LoadOrCreate reads the bundle from dir, creating it (valid for localhost,
// 127.0.0.1, ::1 and the given extra hosts) when missing, unreadable, or
// when the stored certificate does not cover every host.
func LoadOrCreate(dir string, hosts []string) (*Bundle, error) {
	paths := []string{filepath.Join(dir, "ca.crt"), filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")}
	var b Bundle
	ptrs := []*[]byte{&b.CAPEM, &b.CertPEM, &b.KeyPEM}
	missing := false
	for i, p := range paths {
		data, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			missing = true
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		*ptrs[i] = data
	}
	if !missing {
		if _, err := b.TLSConfig(); err == nil && b.covers(hosts) {
			return &b, nil
		}
	}
	nb, err := Generate(hosts)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	for i, p := range paths {
		if err := os.WriteFile(p, *[]*[]byte{&nb.CAPEM, &nb.CertPEM, &nb.KeyPEM}[i], 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", p, err)
		}
	}
	return nb, nil
}

// covers reports whether the serving certificate is valid for every host.
func (b *Bundle) covers(hosts []string) bool {
	block, _ := pem.Decode(b.CertPEM)
	if block == nil {
		return false
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return false
	}
	for _, h := range hosts {
		if h != "" && cert.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

// Generate creates a fresh CA and serving certificate.
func Generate(hosts []string) (*Bundle, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "dev-k8s-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate serving key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "dev-k8s"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(10, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("create serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode serving key: %w", err)
	}
	return &Bundle{
		CAPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// WriteKubeconfig writes a kubeconfig (mode 0600) for server (an https://
// or http:// URL) whose user authenticates with token; caPEM is nil for
// plain HTTP. Cluster, user and context are all named dev-k8s.
func WriteKubeconfig(path, server string, caPEM []byte, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["dev-k8s"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["dev-k8s"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["dev-k8s"] = &clientcmdapi.Context{Cluster: "dev-k8s", AuthInfo: "dev-k8s", Namespace: "default"}
	cfg.CurrentContext = "dev-k8s"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("encode kubeconfig: %w", err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create kubeconfig directory: %w", err)
	}
	// Through a temp file and a rename, so a client never reads half of it.
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write kubeconfig %s: %w", path, werr)
	}
	return nil
}
