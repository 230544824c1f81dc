package attack

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// loot is what an operator with storage access and the encryption key holds
// (and what an attacker who stole them would): the cluster CA bundle and,
// decrypted, the cluster CA key and the nonce key. The suite uses the keys only to mint what a real client never could
// get otherwise (expired certificates, malformed nonces).
type loot struct {
	roots    *x509.CertPool
	ca       *pki.CA
	nonceKey ed25519.PrivateKey
}

func (s *stack) loot(ctx context.Context) (*loot, error) {
	caPEM, err := s.get(ctx, s.keys.CACert())
	if err != nil {
		return nil, fmt.Errorf("reading the cluster CA: %w", err)
	}
	key, err := secrets.ParseKey([]byte(encryptionKey))
	if err != nil {
		return nil, err
	}
	ring, err := secrets.NewKeyring(key)
	if err != nil {
		return nil, err
	}
	sec := &secrets.Store{Objects: s.store, Ring: ring}
	caKey, err := sec.Get(ctx, s.keys.CAKey())
	if err != nil {
		return nil, fmt.Errorf("decrypting the CA key: %w", err)
	}
	ca, err := pki.LoadCA(caPEM, caKey)
	if err != nil {
		return nil, err
	}
	nk, err := sec.Get(ctx, s.keys.NonceSigningKey())
	if err != nil {
		return nil, fmt.Errorf("decrypting the nonce key: %w", err)
	}
	signer, err := pki.ParsePrivateKeyPEM(nk)
	if err != nil {
		return nil, err
	}
	return &loot{roots: ca.Pool(), ca: ca, nonceKey: signer.(ed25519.PrivateKey)}, nil
}

// serverName is what every client of the stack verifies (the host of the
// loopback addresses).
const serverName = "127.0.0.1"

// clientTLS is the TLS configuration of the real clients (agent, operator,
// nstance-admin): TLS 1.3, the cluster CA, server identity verified.
func (l *loot) clientTLS(cert *tls.Certificate) *tls.Config {
	return pki.ClientTLS(l.roots, cert, serverName)
}

// dial opens a gRPC connection; cert may be nil (no client certificate).
func (l *loot) dial(addr string, cert *tls.Certificate) (*grpc.ClientConn, error) {
	return dialTLS(addr, l.clientTLS(cert))
}

func dialTLS(addr string, cfg *tls.Config) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
}

// keyPair turns a signed certificate and its Ed25519 key into a TLS pair.
func keyPair(certPEM []byte, key ed25519.PrivateKey) (tls.Certificate, error) {
	keyPEM, err := pki.MarshalPrivateKeyPEM(key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}

// mintCert issues a client certificate for id from ca, valid from
// now-validity-ish: notAfter = now + validity (negative: already expired).
func mintCert(ca *pki.CA, id pki.Identity, now time.Time, validity time.Duration) (tls.Certificate, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	_, certPEM, err := ca.IssueClient(pki.ClientRequest{Identity: id, PublicKey: pub, Validity: validity}, now)
	if err != nil {
		return tls.Certificate{}, err
	}
	return keyPair(certPEM, priv)
}

// mintNonce signs a well-formed nonce with the cluster nonce key.
func (l *loot) mintNonce(kind nonce.Kind, tenant, subject, shard string, ttl time.Duration) (string, error) {
	return nonce.Mint(l.nonceKey, nonce.Claims{Kind: kind, ClusterID: clusterID, Tenant: tenant, Shard: shard,
		RegisteredClaims: jwt.RegisteredClaims{Subject: subject}}, ttl, time.Now())
}

// registration is a RegisterOperator answer with the new key pair.
type registration struct {
	cert tls.Certificate
	resp *nstancev1.RegisterOperatorResponse
}

// registerOperator registers an operator (kind operator or admin) through
// sv's Registration service with a freshly minted nonce.
func (l *loot) registerOperator(ctx context.Context, sv *server, kind nonce.Kind, tenant, id string) (*registration, error) {
	tok, err := l.mintNonce(kind, tenant, id, "", time.Hour)
	if err != nil {
		return nil, err
	}
	return l.registerOperatorWith(ctx, sv, tok)
}

func (l *loot) registerOperatorWith(ctx context.Context, sv *server, tok string) (*registration, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	pubPEM, err := pki.MarshalPublicKeyPEM(pub)
	if err != nil {
		return nil, err
	}
	conn, err := l.dial(sv.registration, nil)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	resp, err := nstancev1.NewRegistrationServiceClient(conn).RegisterOperator(ctx, &nstancev1.RegisterOperatorRequest{Nonce: tok, PublicKeyPem: string(pubPEM)})
	if err != nil {
		return nil, err
	}
	cert, err := keyPair([]byte(resp.CertificatePem), priv)
	if err != nil {
		return nil, err
	}
	return &registration{cert: cert, resp: resp}, nil
}

// registerAgent presents an agent nonce to sv's Registration service.
func (l *loot) registerAgent(ctx context.Context, sv *server, tok string, ips []string, hostname string) (*nstancev1.RegisterAgentResponse, error) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	pubPEM, err := pki.MarshalPublicKeyPEM(pub)
	if err != nil {
		return nil, err
	}
	conn, err := l.dial(sv.registration, nil)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return nstancev1.NewRegistrationServiceClient(conn).RegisterAgent(ctx, &nstancev1.RegisterAgentRequest{
		Nonce: tok, PublicKeyPem: string(pubPEM), IpAddresses: ips, Hostname: hostname})
}

// refusedAuth reports whether err is an authentication or authorization
// refusal: a failed handshake (Unavailable), Unauthenticated or
// PermissionDenied. A timeout is not a refusal.
func refusedAuth(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.Unauthenticated, codes.PermissionDenied:
		return true
	}
	return false
}

// passedAuth reports whether a call got past authentication: it succeeded,
// or failed for a reason other than identity (bad argument, not found, a
// watch that simply had nothing to say before its deadline).
func passedAuth(err error) bool {
	return err == nil || !refusedAuth(err)
}

// leaksIDs reports whether a refusal message given to an anonymous caller
// names the cluster or a shard.
func leaksIDs(err error) bool {
	msg := status.Convert(err).Message()
	for _, id := range []string{clusterID, "dev-1", "dev-2"} {
		if containsFold(msg, id) {
			return true
		}
	}
	return false
}

func containsFold(s, sub string) bool {
	return sub != "" && strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}

// parsePEMCert parses the first certificate of a PEM file.
func parsePEMCert(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM block")
	}
	return x509.ParseCertificate(blk.Bytes)
}
