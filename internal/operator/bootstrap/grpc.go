package bootstrap

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nstance-dev/nstance/internal/msgsize"
	"github.com/nstance-dev/nstance/internal/pki"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// GRPCRegistrar calls RegistrationService.RegisterOperator over TLS without
// a client certificate, verifying the server against the cluster CA.
type GRPCRegistrar struct {
	// Timeout bounds one attempt; zero means 15 seconds.
	Timeout time.Duration
	// Hostname is sent with the request; empty means os.Hostname.
	Hostname string
}

// Register implements Registrar.
func (r GRPCRegistrar) Register(ctx context.Context, addr string, roots *x509.CertPool, nonce string, publicKeyPEM []byte) ([]byte, error) {
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 15 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientTLS(roots, nil, ServerName(addr)))), msgsize.DialOption())
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	defer func() { _ = conn.Close() }()
	host := r.Hostname
	if host == "" {
		host, _ = os.Hostname()
	}
	resp, err := nstancev1.NewRegistrationServiceClient(conn).RegisterOperator(ctx, &nstancev1.RegisterOperatorRequest{
		Nonce: nonce, PublicKeyPem: string(publicKeyPEM), Hostname: host,
	})
	if err != nil {
		return nil, fmt.Errorf("RegisterOperator at %s: %w", addr, err)
	}
	if resp.GetCertificatePem() == "" {
		return nil, errors.New("RegisterOperator returned no certificate")
	}
	return []byte(resp.GetCertificatePem()), nil
}

// ServerName is the TLS server name used for a host:port address: its host.
func ServerName(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return host
}
