package pki

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
)

// A server certificate with a two-second life is renewed at two thirds of
// it and swapped in live: handshakes long after the first one expired
// still succeed, and each sees a current certificate.
func TestRenewingCertOutlivesItsCertificates(t *testing.T) {
	ca, err := GenerateCA("c1", time.Hour, time.Now())
	require.NoError(t, err)
	id := ServerIdentity{ClusterID: "c1", Shard: "s1", ServerID: "a"}
	var fail atomic.Bool
	issue := func(now time.Time) (tls.Certificate, error) {
		if fail.Load() {
			return tls.Certificate{}, errors.New("CA unavailable")
		}
		return ca.ServerKeyPair(id, []string{"127.0.0.1"}, 2*time.Second, now)
	}
	r, err := NewRenewingCert(issue, 2.0/3, nil, logr.Discard())
	require.NoError(t, err)
	first := r.Current().Leaf
	require.WithinDuration(t, first.NotAfter.Add(-(2*time.Second)/3), r.RenewAt(), time.Second,
		"renewed with a third of the validity left, however far NotBefore is backdated (x509 keeps whole seconds)")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg := ServerTLS(tls.Certificate{}, nil, false)
	cfg.Certificates, cfg.GetCertificate = nil, r.GetCertificate
	tln := tls.NewListener(ln, cfg)
	t.Cleanup(func() { _ = tln.Close() })
	go func() {
		for {
			c, err := tln.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake(); _ = c.Close() }()
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go r.Run(ctx)

	handshake := func() (*tls.ConnectionState, error) {
		c, err := tls.Dial("tcp", ln.Addr().String(), ClientTLS(ca.Pool(), nil, "127.0.0.1"))
		if err != nil {
			return nil, err
		}
		defer c.Close()
		st := c.ConnectionState()
		return &st, nil
	}
	// Handshake until well past the first certificate's expiry.
	deadline := first.NotAfter.Add(3 * time.Second)
	n := 0
	for time.Now().Before(deadline) {
		st, err := handshake()
		require.NoError(t, err, "handshake %d at %s (first certificate expires %s)", n, time.Now(), first.NotAfter)
		require.True(t, time.Now().Before(st.PeerCertificates[0].NotAfter))
		n++
		time.Sleep(50 * time.Millisecond)
	}
	require.GreaterOrEqual(t, r.Renewals(), int64(2))
	require.LessOrEqual(t, r.Renewals(), int64(10), "renewed on schedule, not in a loop")
	require.NotEqual(t, first.SerialNumber, r.Current().Leaf.SerialNumber)
	t.Logf("%d handshakes over %s, %d renewals", n, 5*time.Second, r.Renewals())

	// While issuing fails the current certificate stays in use.
	fail.Store(true)
	before := r.Renewals()
	cur := r.Current()
	time.Sleep(time.Until(r.RenewAt()) + 200*time.Millisecond)
	require.Equal(t, before, r.Renewals())
	require.Same(t, cur, r.Current())
	fail.Store(false)
	require.Eventually(t, func() bool { return r.Renewals() > before }, 10*time.Second, 20*time.Millisecond, "retried after the failure")
}
