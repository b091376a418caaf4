package tlsfiles

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/credentials"
)

// handshakes keeps why the last connection of a Client could not start TLS.
type handshakes struct {
	mu  sync.Mutex
	err error
}

func (h *handshakes) set(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.err = err
}

func (h *handshakes) get() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// HandshakeError returns why the last connection the Client made could not start TLS,
// nil when it could: its handshake failed, or allocd's first answer was a TLS alert
// (under TLS 1.3 a server refuses a client certificate so, after the handshake). It is
// crypto/tls's or crypto/x509's own error, for errors.As: tls.RecordHeaderError when
// the server does not speak TLS; *tls.CertificateVerificationError or an x509 error
// when its certificate is not trusted or does not name the host; a *net.OpError whose
// Op is "remote error" for an alert of the server; ErrClosedAfterHandshake when the
// connection ended before allocd's first byte without one. gRPC's own error of the call
// keeps only their text.
func (c *Client) HandshakeError() error { return c.handshakes.get() }

// recording is a Client's credentials, which keep the error of every connection that
// could not start TLS.
type recording struct {
	credentials.TransportCredentials
	h *handshakes
}

// ClientHandshake records a failed handshake, and watches the first read of a
// connection that it started.
func (r recording) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn,
	credentials.AuthInfo, error) {
	conn, info, err := r.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		r.h.set(err)
		return nil, nil, err
	}
	return &firstRead{Conn: conn, h: r.h}, info, nil
}

// Clone clones the credentials, which keep recording into the same Client.
func (r recording) Clone() credentials.TransportCredentials {
	return recording{TransportCredentials: r.TransportCredentials.Clone(), h: r.h}
}

// firstRead records the outcome of a connection's first read: an alert of the server
// instead of its first bytes is why the connection could not start.
type firstRead struct {
	net.Conn
	h    *handshakes
	done atomic.Bool
}

func (f *firstRead) Read(b []byte) (int, error) {
	n, err := f.Conn.Read(b)
	if (n > 0 || err != nil) && f.done.CompareAndSwap(false, true) {
		rec := err
		var op *net.OpError
		switch {
		case n > 0:
			rec = nil
		case errors.As(err, &op) && op.Op == "remote error": // the server's alert: kept as it is
		default:
			// The connection ended before allocd's first byte: under TLS 1.3 a server that
			// refuses the client's certificate closes it so, and the alert it sent is
			// lost when gRPC's first write meets the closed connection first (gRPC then
			// closes it here: "use of closed network connection").
			rec = fmt.Errorf("%w: %w", ErrClosedAfterHandshake, err)
		}
		f.h.set(rec)
	}
	return n, err
}

// ErrClosedAfterHandshake is in HandshakeError when the connection ended after the TLS
// handshake and before allocd's first byte, without the server's alert: most often a
// server refusing the client's certificate.
var ErrClosedAfterHandshake = errors.New("the connection ended right after the TLS handshake")
