package grpcserve_test

import (
	"bytes"
	"crypto/tls"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// rawH2 is an HTTP/2 client connection driven frame by frame, as a hostile
// gRPC client would (no flow control or stream quota of its own).
type rawH2 struct {
	fr *http2.Framer
	mu sync.Mutex // serialises frame writes
}

// dialRawH2 opens a TLS connection offering h2 and sends the client
// preface and an empty SETTINGS frame. The connection closes when t ends.
func dialRawH2(t *testing.T, addr string, tcfg *tls.Config) *rawH2 {
	t.Helper()
	tcfg = tcfg.Clone()
	tcfg.NextProtos = []string{"h2"}
	conn, err := tls.Dial("tcp", addr, tcfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	_, err = conn.Write([]byte(http2.ClientPreface))
	require.NoError(t, err)
	c := &rawH2{fr: http2.NewFramer(conn, conn)}
	require.NoError(t, c.write(func(fr *http2.Framer) error { return fr.WriteSettings() }))
	return c
}

// write runs fn with the framer, one writer at a time.
func (c *rawH2) write(fn func(fr *http2.Framer) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fn(c.fr)
}

// control acknowledges the server's SETTINGS and PING frames, as every
// client must; the reader calls it for each frame it reads.
func (c *rawH2) control(frame http2.Frame) {
	switch fm := frame.(type) {
	case *http2.SettingsFrame:
		if !fm.IsAck() {
			_ = c.write(func(fr *http2.Framer) error { return fr.WriteSettingsAck() })
		}
	case *http2.PingFrame:
		if !fm.IsAck() {
			data := fm.Data
			_ = c.write(func(fr *http2.Framer) error { return fr.WritePing(true, data) })
		}
	}
}

// grpcHeaders is the HPACK block of a gRPC request for method (a full
// method name) encoded with enc.
func grpcHeaders(t *testing.T, enc *hpack.Encoder, buf *bytes.Buffer, method string) []byte {
	t.Helper()
	buf.Reset()
	for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":path", method},
		{":authority", "127.0.0.1"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		require.NoError(t, enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]}))
	}
	return buf.Bytes()
}
