package grpcserve_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/pki"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// TestRegistrationMessageLimit: on the Registration listener a request up
// to max_registration_message_bytes reaches the service; a larger one is
// refused with ResourceExhausted and the connection keeps serving.
func TestRegistrationMessageLimit(t *testing.T) {
	reg := &countingRegistration{}
	f := startLimited(t, config.Limits{MaxRegistrationMessageBytes: 20 << 10}, reg)
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientTLS(f.ca.Pool(), nil, "127.0.0.1"))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	c := nstancev1.NewRegistrationServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = c.RegisterAgent(ctx, &nstancev1.RegisterAgentRequest{Nonce: strings.Repeat("n", 19<<10)})
	require.NoError(t, err)
	_, err = c.RegisterAgent(ctx, &nstancev1.RegisterAgentRequest{Nonce: strings.Repeat("n", 21<<10)})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "vs. 20480")
	_, err = c.RegisterAgent(ctx, &nstancev1.RegisterAgentRequest{})
	require.NoError(t, err)
	require.Equal(t, 2, reg.n)
}

// h2Result is what a raw HTTP/2 client saw from the server.
type h2Result struct {
	settings map[http2.SettingID]uint32
	credit   map[uint32]int64  // window granted per stream, beyond the initial window
	status   map[uint32]string // grpc-status of each answered stream
	reset    map[uint32]bool
}

// TestRegistrationPartialMessagesHoldLittle: an anonymous client speaking
// raw HTTP/2 opens streams that each announce a 15 MiB message. The server
// advertises the small registration transport (8 streams, 16 KiB headers,
// the 64 KiB minimum window), answers every stream ResourceExhausted from
// the message header alone and grants no window for the announced body, so
// the connection can make it hold at most its initial windows.
func TestRegistrationPartialMessagesHoldLittle(t *testing.T) {
	f := startLimited(t, config.Limits{}, &countingRegistration{})
	c := dialRawH2(t, f.addr, &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: f.ca.Pool(), ServerName: "127.0.0.1"})
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)

	const streams = 8
	var mu sync.Mutex
	res := h2Result{settings: map[http2.SettingID]uint32{}, credit: map[uint32]int64{}, status: map[uint32]string{}, reset: map[uint32]bool{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			frame, err := c.fr.ReadFrame()
			if err != nil {
				return
			}
			c.control(frame)
			mu.Lock()
			switch fm := frame.(type) {
			case *http2.SettingsFrame:
				if !fm.IsAck() {
					_ = fm.ForeachSetting(func(s http2.Setting) error { res.settings[s.ID] = s.Val; return nil })
				}
			case *http2.WindowUpdateFrame:
				if fm.StreamID != 0 {
					res.credit[fm.StreamID] += int64(fm.Increment)
				}
			case *http2.MetaHeadersFrame:
				if v := fm.PseudoValue("status"); v == "" || fm.StreamEnded() {
					for _, hf := range fm.RegularFields() {
						if hf.Name == "grpc-status" {
							res.status[fm.StreamID] = hf.Value
						}
					}
				}
			case *http2.RSTStreamFrame:
				res.reset[fm.StreamID] = true
			}
			n := len(res.status)
			mu.Unlock()
			if n == streams {
				return
			}
		}
	}()

	var hb bytes.Buffer
	headers := grpcHeaders(t, hpack.NewEncoder(&hb), &hb, nstancev1.RegistrationService_RegisterAgent_FullMethodName)
	msg := make([]byte, 16<<10)
	binary.BigEndian.PutUint32(msg[1:5], 15<<20)
	for i := range streams {
		id := uint32(2*i + 1)
		require.NoError(t, c.write(func(fr *http2.Framer) error {
			if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: headers, EndHeaders: true}); err != nil {
				return err
			}
			return fr.WriteData(id, false, msg)
		}))
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not answer every stream")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, uint32(8), res.settings[http2.SettingMaxConcurrentStreams])
	require.Equal(t, uint32(16<<10), res.settings[http2.SettingMaxHeaderListSize])
	iw, set := res.settings[http2.SettingInitialWindowSize]
	require.True(t, !set || iw == 64<<10, "initial window %d", iw)
	for i := range streams {
		id := uint32(2*i + 1)
		require.Equal(t, "8", res.status[id], "stream %d answered ResourceExhausted", id)
		// At most the 5 header bytes read are given back: never the 15 MiB announced.
		require.LessOrEqual(t, res.credit[id], int64(16<<10), "stream %d window granted", id)
	}
}

// TestRegistrationHandshakeTimeout: a connection that never completes its
// TLS handshake is closed after the registration handshake timeout, not
// grpc-go's default two minutes.
func TestRegistrationHandshakeTimeout(t *testing.T) {
	t.Parallel()
	f := startLimited(t, config.Limits{}, &countingRegistration{})
	conn, err := net.Dial("tcp", f.addr)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	// The read deadline (30 s) lies between the registration handshake
	// timeout (10 s) and grpc-go's default (120 s): only the former closes
	// the connection before it.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	_, err = io.Copy(io.Discard, conn)
	require.NoError(t, err, "closed by the server, not by the read deadline")
}
