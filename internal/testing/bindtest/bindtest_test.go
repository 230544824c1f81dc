package bindtest

import (
	"net"
	"os"
	"testing"
)

func TestListeningIPs(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", "0.0.0.0:0"} {
		ln, err := net.Listen("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ips, err := ListeningIPs(os.Getpid(), port)
		ln.Close()
		if err != nil {
			t.Fatal(err)
		}
		want, _, _ := net.SplitHostPort(addr)
		if len(ips) != 1 || !ips[0].Equal(net.ParseIP(want)) {
			t.Fatalf("listening on %s: read %v", addr, ips)
		}
	}
}
