package app

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/metrics"
)

func TestHandshakeFailuresClassified(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, metrics.Process{})
	var logged []string
	log := funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{})
	fail := func(listener string, err error) {
		logHandshakeFailure(log, listener, m.HandshakeFailed(listener, err), err)
	}
	expired := &tls.CertificateVerificationError{Err: x509.CertificateInvalidError{Reason: x509.Expired}}
	fail("agent", fmt.Errorf("tls: %w", expired))
	fail("agent", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}})
	fail("operator", io.EOF)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP nstance_server_tls_handshake_failures_total Failed TLS handshakes on the gRPC listeners, by listener and reason (expired: the client certificate had expired).
# TYPE nstance_server_tls_handshake_failures_total counter
nstance_server_tls_handshake_failures_total{listener="agent",reason="certificate"} 1
nstance_server_tls_handshake_failures_total{listener="agent",reason="expired"} 1
nstance_server_tls_handshake_failures_total{listener="operator",reason="closed"} 1
`), "nstance_server_tls_handshake_failures_total"))
	require.Len(t, logged, 2, "a client that hung up is logged only at V(1)")
	require.True(t, strings.Contains(logged[0], "!!!") && strings.Contains(logged[0], "expired"), logged[0])
}
