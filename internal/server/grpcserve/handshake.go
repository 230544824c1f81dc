package grpcserve

import (
	"net"

	"google.golang.org/grpc/credentials"
)

// observed wraps server credentials so that every failed handshake is
// reported to cfg.OnHandshakeError with the name of the listener it came
// in on. Every grpc.Creds of a listener must go through it.
func (cfg Config) observed(c credentials.TransportCredentials) credentials.TransportCredentials {
	if cfg.OnHandshakeError == nil {
		return c
	}
	return handshakeObserver{TransportCredentials: c, names: cfg.listenerNames, onError: cfg.OnHandshakeError}
}

// listenerNames maps the port of each listener to its name.
func listenerNames(ls Listeners) map[string]string {
	out := map[string]string{}
	for name, ln := range map[string]net.Listener{"registration": ls.Registration, "operator": ls.Operator, "agent": ls.Agent} {
		if ln == nil {
			continue
		}
		if _, port, err := net.SplitHostPort(ln.Addr().String()); err == nil {
			out[port] = name
		}
	}
	return out
}

// handshakeObserver reports failed server handshakes of its credentials.
type handshakeObserver struct {
	credentials.TransportCredentials
	names   map[string]string
	onError func(listener string, err error)
}

// ServerHandshake implements credentials.TransportCredentials.
func (h handshakeObserver) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := h.TransportCredentials.ServerHandshake(c)
	if err != nil {
		name := "unknown"
		if _, port, perr := net.SplitHostPort(c.LocalAddr().String()); perr == nil && h.names[port] != "" {
			name = h.names[port]
		}
		h.onError(name, err)
	}
	return conn, info, err
}

// Clone implements credentials.TransportCredentials.
func (h handshakeObserver) Clone() credentials.TransportCredentials {
	return handshakeObserver{TransportCredentials: h.TransportCredentials.Clone(), names: h.names, onError: h.onError}
}
