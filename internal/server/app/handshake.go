package app

import (
	"github.com/go-logr/logr"
)

// logHandshakeFailure logs a failed TLS handshake (counted by the
// metrics with reason): loudly when a client certificate was refused (an
// expired agent identity cannot connect until it is registered again),
// quietly otherwise (a client that hung up).
func logHandshakeFailure(log logr.Logger, listener, reason string, err error) {
	switch reason {
	case "expired":
		log.Error(err, "!!! TLS handshake refused: the client certificate has expired (an agent whose identity was not renewed in time cannot connect)", "listener", listener)
	case "certificate":
		log.Error(err, "TLS handshake refused: client certificate not accepted", "listener", listener)
	default:
		log.V(1).Info("TLS handshake failed", "listener", listener, "reason", err.Error())
	}
}
