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

// SourceIP is the source a limit counts addr against: its IPv4 address, or
// the /64 network of an IPv6 address (one host usually holds a whole /64, so
// counting single IPv6 addresses would be no limit at all). An address
// without a port is taken whole.
func SourceIP(addr net.Addr) string {
	if addr == nil {
		return ""
	}
	var ip net.IP
	if ta, ok := addr.(*net.TCPAddr); ok {
		ip = ta.IP
	} else {
		host, _, err := net.SplitHostPort(addr.String())
		if err != nil {
			return addr.String()
		}
		if ip = net.ParseIP(host); ip == nil {
			return host
		}
	}
	if v4 := ip.To4(); v4 != nil {
		return v4.String()
	}
	return (&net.IPNet{IP: ip.Mask(net.CIDRMask(64, 128)), Mask: net.CIDRMask(64, 128)}).String()
}
