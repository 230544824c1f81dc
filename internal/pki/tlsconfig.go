package pki

import (
	"crypto/tls"
	"crypto/x509"
)

// ServerTLS returns a TLS 1.3 server configuration presenting cert. When
// requireClient is true every client must present a certificate that chains to
// clientCAs (mTLS); otherwise client certificates are not requested.
func ServerTLS(cert tls.Certificate, clientCAs *x509.CertPool, requireClient bool) *tls.Config {
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2"},
	}
	if requireClient {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = clientCAs
	}
	return cfg
}

// ClientTLS returns a TLS 1.3 client configuration trusting roots and, when
// cert is not nil, presenting it.
func ClientTLS(roots *x509.CertPool, cert *tls.Certificate, serverName string) *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: serverName}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return cfg
}
