package netproxy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// ErrClosed is returned by ResetListener once Close was called.
var ErrClosed = errors.New("netproxy: proxy closed")

// ErrUnspecifiedHost is returned by Listen for an address of every interface (0.0.0.0,
// ::): the proxy listens on loopback or the one host it is given.
var ErrUnspecifiedHost = errors.New("netproxy: unspecified host (every interface)")

const (
	// bufferSize bounds a chunk: what one read takes from a connection and a delay holds.
	bufferSize = 48 * 1024
	// dialTimeout bounds the dial of the target for each accepted connection.
	dialTimeout = 3 * time.Second
	// acceptRetry is the wait after an accept error other than a closed listener
	// (too many open files, say) before the next accept.
	acceptRetry = 10 * time.Millisecond
)

// Proxy forwards each TCP connection accepted on its address to its target, one
// connection to the target per client connection. Its methods may be called from any
// goroutine; Close stops it and waits for every goroutine it started.
type Proxy struct {
	addr   string // host:port listened on, kept across ResetListener
	target string
	tx, rx direction

	wg sync.WaitGroup // the accept loops and the links

	mu     sync.Mutex
	ln     net.Listener // nil after a ResetListener that could not listen again
	links  map[*link]struct{}
	closed bool
}

// Listen starts a proxy listening on addr (host:port; an empty host is 127.0.0.1, port
// 0 picks a free port, which Addr reports) that forwards to target (host:port).
func Listen(addr, target string) (*Proxy, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("netproxy: listen address %q: %w", addr, err)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return nil, fmt.Errorf("netproxy: listen address %q: %w", addr, ErrUnspecifiedHost)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return nil, fmt.Errorf("netproxy: %w", err)
	}
	p := &Proxy{addr: ln.Addr().String(), target: target, ln: ln, links: map[*link]struct{}{}}
	p.tx.init()
	p.rx.init()
	p.wg.Add(1)
	go p.serve(ln)
	return p, nil
}

// Addr returns the host:port the proxy listens on.
func (p *Proxy) Addr() string { return p.addr }

// Close stops listening, drops every connection, and returns once every goroutine of
// the proxy has ended: bytes held by a pause or a delay are dropped. It returns the
// error of closing the listener, if any; calling it again returns nil.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	var err error
	if p.ln != nil {
		err = p.ln.Close()
	}
	p.dropLinks()
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// ResetListener closes the listener and every connection through the proxy (both
// ends: the client and the target see them closed, and bytes held by a pause or a
// delay are dropped), then listens again on the same address. Pauses and delays stay
// set. It returns ErrClosed after Close, or the error of listening again; then the
// proxy accepts nothing more, and a later ResetListener tries again.
func (p *Proxy) ResetListener() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	p.dropLinks()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("netproxy: listen again: %w", err)
	}
	p.ln = ln
	p.wg.Add(1)
	go p.serve(ln)
	return nil
}

// PauseTx holds the bytes from clients toward the target until UnpauseTx: what a
// connection has read and not yet written waits, and nothing more is read from it, so
// the client's writes block once the socket buffers are full. Nothing is dropped.
func (p *Proxy) PauseTx() { p.tx.pause() }

// UnpauseTx lets the bytes held by PauseTx through, in order.
func (p *Proxy) UnpauseTx() { p.tx.unpause() }

// PauseRx holds the bytes from the target back to clients until UnpauseRx, as PauseTx
// does the other way.
func (p *Proxy) PauseRx() { p.rx.pause() }

// UnpauseRx lets the bytes held by PauseRx through, in order.
func (p *Proxy) UnpauseRx() { p.rx.unpause() }

// DelayTx makes each chunk forwarded toward the target (what one read returned, at
// most 48 KiB) wait a latency before it is written, one chunk after the other on a
// connection. The latency is drawn once, here: latency, plus or minus up to rv (at most
// a tenth of latency when rv exceeds it), as etcd's proxy does. A latency of 0 or less
// changes nothing.
func (p *Proxy) DelayTx(latency, rv time.Duration) {
	if latency <= 0 {
		return
	}
	p.tx.setLatency(jitter(latency, rv))
}

// UndelayTx removes the latency set by DelayTx; a chunk already waiting waits its time.
func (p *Proxy) UndelayTx() { p.tx.setLatency(0) }

// jitter returns latency moved by a random amount of less than rv either way, rv
// capped at a tenth of latency when it exceeds latency (etcd's computeLatency).
func jitter(latency, rv time.Duration) time.Duration {
	rv = max(rv, -rv)
	if rv > latency {
		rv = latency / 10
	}
	if rv == 0 {
		return latency
	}
	return latency - rv + rand.N(2*rv)
}

// dropLinks closes every link; p.mu is held.
func (p *Proxy) dropLinks() {
	for l := range p.links {
		l.drop()
		delete(p.links, l)
	}
}

// serve accepts on ln until it is closed.
func (p *Proxy) serve(ln net.Listener) {
	defer p.wg.Done()
	for {
		in, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			time.Sleep(acceptRetry)
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		l := &link{in: in, ctx: ctx, cancel: cancel}
		p.mu.Lock()
		if p.closed || p.ln != ln { // accepted just before a Close or ResetListener
			p.mu.Unlock()
			l.drop()
			return
		}
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.forward(l)
	}
}

// forward dials the target for l and copies both ways until either side ends or l is
// dropped, then closes both connections.
func (p *Proxy) forward(l *link) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
		l.drop()
	}()
	d := net.Dialer{Timeout: dialTimeout}
	out, err := d.DialContext(l.ctx, "tcp", p.target)
	if err != nil {
		return // the client sees its connection closed, as with a target that is down
	}
	defer out.Close()
	var copies sync.WaitGroup
	copies.Add(2)
	go func() { defer copies.Done(); defer l.cancel(); copyChunks(l.ctx, out, l.in, &p.tx) }()
	go func() { defer copies.Done(); defer l.cancel(); copyChunks(l.ctx, l.in, out, &p.rx) }()
	<-l.ctx.Done() // either copy ended, or the link was dropped
	l.in.Close()
	out.Close()
	copies.Wait()
}

// copyChunks copies src to dst one chunk at a time, each chunk waiting for d's pause
// to lift and then d's latency, until src or dst fails or ctx ends.
func copyChunks(ctx context.Context, dst, src net.Conn, d *direction) {
	buf := make([]byte, bufferSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !d.wait(ctx) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// link is one client connection and the forwarding of it.
type link struct {
	in     net.Conn
	ctx    context.Context // ends when the link is dropped or either copy ends
	cancel context.CancelFunc
}

// drop ends the link: the client's connection is closed at once, the target's by
// forward as it returns.
func (l *link) drop() {
	l.cancel()
	l.in.Close()
}

// direction is the state of one direction of every link: paused or not, and its
// latency.
type direction struct {
	mu      sync.Mutex
	resume  chan struct{} // closed while the direction is not paused
	latency time.Duration
}

func (d *direction) init() {
	d.resume = make(chan struct{})
	close(d.resume)
}

func (d *direction) pause() {
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case <-d.resume: // not paused: pause
		d.resume = make(chan struct{})
	default: // paused already: the waiting chunks keep waiting on the same channel
	}
}

func (d *direction) unpause() {
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case <-d.resume:
	default:
		close(d.resume)
	}
}

func (d *direction) setLatency(l time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.latency = l
}

// wait returns once a chunk may be written: the direction is not paused and the
// latency it has then has passed; false when ctx ended first.
func (d *direction) wait(ctx context.Context) bool {
	d.mu.Lock()
	resume := d.resume
	d.mu.Unlock()
	select {
	case <-resume:
	case <-ctx.Done():
		return false
	}
	d.mu.Lock()
	lat := d.latency
	d.mu.Unlock()
	if lat <= 0 {
		return true
	}
	t := time.NewTimer(lat)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
