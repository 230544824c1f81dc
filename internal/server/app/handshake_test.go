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
)

func TestHandshakeFailuresClassified(t *testing.T) {
	m := &metrics{handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "h"}, []string{"listener", "reason"})}
	var logged []string
	log := funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{})
	expired := &tls.CertificateVerificationError{Err: x509.CertificateInvalidError{Reason: x509.Expired}}
	m.handshakeFailed(log, "agent", fmt.Errorf("tls: %w", expired))
	m.handshakeFailed(log, "agent", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}})
	m.handshakeFailed(log, "operator", io.EOF)
	require.Equal(t, 1.0, testutil.ToFloat64(m.handshakes.WithLabelValues("agent", "expired")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.handshakes.WithLabelValues("agent", "certificate")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.handshakes.WithLabelValues("operator", "closed")))
	require.Len(t, logged, 2, "a client that hung up is logged only at V(1)")
	require.True(t, strings.Contains(logged[0], "!!!") && strings.Contains(logged[0], "expired"), logged[0])
}
