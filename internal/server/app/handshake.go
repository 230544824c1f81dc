package app

import (
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/go-logr/logr"
)

// handshakeFailed counts a failed TLS handshake and logs it: loudly when a
// client certificate was refused (an expired agent identity cannot connect
// until it is registered again), quietly otherwise (a client that hung up).
func (m *metrics) handshakeFailed(log logr.Logger, listener string, err error) {
	reason := "other"
	var inv x509.CertificateInvalidError
	var unk x509.UnknownAuthorityError
	switch {
	case errors.As(err, &inv) && inv.Reason == x509.Expired:
		reason = "expired"
	case errors.As(err, &inv), errors.As(err, &unk), strings.Contains(err.Error(), "certificate"):
		reason = "certificate"
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), errors.Is(err, syscall.ECONNRESET):
		reason = "closed"
	}
	m.handshakes.WithLabelValues(listener, reason).Inc()
	switch reason {
	case "expired":
		log.Error(err, "!!! TLS handshake refused: the client certificate has expired (an agent whose identity was not renewed in time cannot connect)", "listener", listener)
	case "certificate":
		log.Error(err, "TLS handshake refused: client certificate not accepted", "listener", listener)
	default:
		log.V(1).Info("TLS handshake failed", "listener", listener, "reason", err.Error())
	}
}
