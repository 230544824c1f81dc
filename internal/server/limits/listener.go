package limits

import (
	"net"
	"sync"
)

// SourceListener caps open connections per source IP address: a connection
// beyond the cap is closed as soon as it is accepted, before any TLS work.
type SourceListener struct {
	net.Listener
	counter *Counter
	// OnRefused, when set, is called with the source of every refused connection.
	OnRefused func(source string)
}

// LimitSources wraps ln so each source IP has at most max open connections.
func LimitSources(ln net.Listener, max int) *SourceListener {
	return &SourceListener{Listener: ln, counter: NewCounter(max)}
}

// Accept returns the next connection within its source's cap.
func (l *SourceListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := SourceIP(c.RemoteAddr())
		release, ok := l.counter.Acquire(src)
		if !ok {
			_ = c.Close()
			if l.OnRefused != nil {
				l.OnRefused(src)
			}
			continue
		}
		return &countedConn{Conn: c, release: release}, nil
	}
}

// Open is how many connections source has open now.
func (l *SourceListener) Open(source string) int { return l.counter.Count(source) }

type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// SourceIP is the IP address of addr without its port (the whole string when
// it has none).
func SourceIP(addr net.Addr) string {
	if addr == nil {
		return ""
	}
	if ta, ok := addr.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return host
}
