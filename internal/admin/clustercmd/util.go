package clustercmd

import (
	"crypto/x509"
	"net"
)

func x509Pool(cas ...*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, ca := range cas {
		p.AddCert(ca)
	}
	return p
}

// hostOf returns the host part of host:port for TLS server-name checks.
func hostOf(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return h
}
