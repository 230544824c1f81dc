package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
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
// cert is not nil, presenting it. The server must present a certificate that
// chains to roots and carries a server identity of the roots' cluster
// (VerifyServerConnection).
func ClientTLS(roots *x509.CertPool, cert *tls.Certificate, serverName string) *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: serverName, VerifyConnection: VerifyServerConnection}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return cfg
}

// VerifyServerConnection is a tls.Config.VerifyConnection for clients of an
// nstance-server. It runs after the standard chain and host name checks and
// additionally requires the leaf to carry a server identity
// (spiffe://<cluster>/shard/<shard>/server/<id>) in the trust domain of the
// cluster CA it chains to. A certificate of the right CA that is no server
// certificate (an agent's or operator's identity, anything a template asked
// for) is refused, whatever names it carries.
func VerifyServerConnection(cs tls.ConnectionState) error {
	if len(cs.VerifiedChains) == 0 {
		return errors.New("nstance server: certificate was not verified against the cluster CA")
	}
	leaf := cs.VerifiedChains[0][0]
	var lastErr error
	for _, chain := range cs.VerifiedChains {
		root := chain[len(chain)-1]
		td := trustDomainOf(root)
		if td == "" {
			lastErr = fmt.Errorf("nstance server: CA %q names no cluster trust domain", root.Subject.CommonName)
			continue
		}
		if _, err := ServerIdentityFromCert(leaf, td); err != nil {
			lastErr = fmt.Errorf("nstance server: %w", err)
			continue
		}
		return nil
	}
	return lastErr
}

// VerifyServerOfShard is VerifyServerConnection plus a check that the server
// identity names shard: a client that talks to one shard refuses a server of
// another shard of the same cluster (a mixed-up address, or a server moved
// to another shard), which would otherwise be handed its requests.
func VerifyServerOfShard(shard string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if err := VerifyServerConnection(cs); err != nil {
			return err
		}
		id, err := ServerIdentityFromCert(cs.VerifiedChains[0][0], "")
		if err != nil {
			return fmt.Errorf("nstance server: %w", err)
		}
		if id.Shard != shard {
			return fmt.Errorf("nstance server: %s serves shard %q, not %q", id.URI(), id.Shard, shard)
		}
		return nil
	}
}

// ClientTLSForShard is ClientTLS for a client of one shard: the server must
// also carry a server identity of that shard (VerifyServerOfShard).
func ClientTLSForShard(roots *x509.CertPool, cert *tls.Certificate, serverName, shard string) *tls.Config {
	cfg := ClientTLS(roots, cert, serverName)
	cfg.VerifyConnection = VerifyServerOfShard(shard)
	return cfg
}
