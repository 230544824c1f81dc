package grpcserve

import (
	"net"

	"google.golang.org/grpc/credentials"
)

// handshakeObserver reports failed server handshakes of its credentials.
type handshakeObserver struct {
	credentials.TransportCredentials
	name    string
	onError func(listener string, err error)
}

// ServerHandshake implements credentials.TransportCredentials.
func (h handshakeObserver) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := h.TransportCredentials.ServerHandshake(c)
	if err != nil {
		h.onError(h.name, err)
	}
	return conn, info, err
}

// Clone implements credentials.TransportCredentials.
func (h handshakeObserver) Clone() credentials.TransportCredentials {
	return handshakeObserver{TransportCredentials: h.TransportCredentials.Clone(), name: h.name, onError: h.onError}
}
