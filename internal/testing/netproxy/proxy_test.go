package netproxy

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"
)

// quiet is how long a test waits to see that nothing arrives.
const quiet = 200 * time.Millisecond

// echo is a target on loopback that echoes what each connection sends and reports each
// chunk it read on got, and each connection that ended on ended.
type echo struct {
	ln    net.Listener
	got   chan string
	ended chan struct{}
}

func newEcho(t *testing.T) *echo {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echo{ln: ln, got: make(chan string, 100), ended: make(chan struct{}, 100)}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { c.Close(); e.ended <- struct{}{} }()
				buf := make([]byte, 1024)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					e.got <- string(buf[:n])
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return e
}

// expectGot waits for the target to read want.
func (e *echo) expectGot(t *testing.T, want string) {
	t.Helper()
	select {
	case got := <-e.got:
		if got != want {
			t.Fatalf("the target read %q; want %q", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the target did not read %q in 10 s", want)
	}
}

// expectNothing fails when the target reads anything within quiet.
func (e *echo) expectNothing(t *testing.T) {
	t.Helper()
	select {
	case got := <-e.got:
		t.Fatalf("the target read %q; want nothing while held", got)
	case <-time.After(quiet):
	}
}

func listen(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Listen("127.0.0.1:0", target)
	if err != nil {
		t.Fatalf("Listen = %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func send(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := c.Write([]byte(s)); err != nil {
		t.Fatalf("write %q: %v", s, err)
	}
}

// receive reads len(want) bytes from c within d.
func receive(t *testing.T, c net.Conn, want string, d time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, len(want))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("read %q: %v", want, err)
	}
	if string(buf) != want {
		t.Fatalf("read %q; want %q", buf, want)
	}
}

// receiveNothing fails when c reads anything within quiet.
func receiveNothing(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(quiet))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, 64)
	if n, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read = %q, %v; want nothing while held", buf[:n], err)
	}
}

// expectClosed fails unless c reads EOF or a reset within 10 s.
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 64)
	for {
		n, err := c.Read(buf)
		if err == nil {
			t.Fatalf("read %q from a connection that should be closed", buf[:n])
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("the connection was not closed in 10 s")
		}
		return
	}
}

func TestListen(t *testing.T) {
	e := newEcho(t)
	for _, tc := range []struct {
		addr string
		err  error
		host string
	}{
		{addr: "127.0.0.1:0", host: "127.0.0.1"},
		{addr: ":0", host: "127.0.0.1"},
		{addr: "127.3.4.5:0", host: "127.3.4.5"},
		{addr: "0.0.0.0:0", err: ErrUnspecifiedHost},
		{addr: "[::]:0", err: ErrUnspecifiedHost},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			p, err := Listen(tc.addr, e.ln.Addr().String())
			if !errors.Is(err, tc.err) {
				t.Fatalf("Listen(%q) = %v; want %v", tc.addr, err, tc.err)
			}
			if err != nil {
				return
			}
			defer p.Close()
			ap, err := netip.ParseAddrPort(p.Addr())
			if err != nil || ap.Addr().String() != tc.host || ap.Port() == 0 {
				t.Fatalf("Listen(%q).Addr() = %q; want %s and a port", tc.addr, p.Addr(), tc.host)
			}
			c := dial(t, p.Addr())
			send(t, c, "ping")
			e.expectGot(t, "ping")
			receive(t, c, "ping", 10*time.Second)
		})
	}
}

// TestPauseTx: bytes toward the target are held, not dropped, on the connections open
// and on those made while paused, and go through in order once unpaused; the way back
// stays open.
func TestPauseTx(t *testing.T) {
	e := newEcho(t)
	p := listen(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	send(t, c, "a")
	e.expectGot(t, "a")
	receive(t, c, "a", 10*time.Second)

	p.PauseTx()
	p.PauseTx() // twice: one UnpauseTx still lets everything through
	send(t, c, "b")
	e.expectNothing(t)
	c2 := dial(t, p.Addr())
	send(t, c2, "c")
	e.expectNothing(t)
	receiveNothing(t, c)

	p.UnpauseTx()
	got := map[string]bool{}
	for range 2 {
		select {
		case s := <-e.got:
			got[s] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("after UnpauseTx the target read %v; want b and c", got)
		}
	}
	if !got["b"] || !got["c"] {
		t.Fatalf("after UnpauseTx the target read %v; want b and c", got)
	}
	receive(t, c, "b", 10*time.Second)
	receive(t, c2, "c", 10*time.Second)
}

// TestPauseRx: the target receives what the client sends, and its answers are held
// until UnpauseRx.
func TestPauseRx(t *testing.T) {
	e := newEcho(t)
	p := listen(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	p.PauseRx()
	send(t, c, "x")
	e.expectGot(t, "x")
	receiveNothing(t, c)
	p.UnpauseRx()
	receive(t, c, "x", 10*time.Second)
}

// TestDelayTx: each chunk toward the target arrives no sooner than the latency after it
// was sent; UndelayTx removes it.
func TestDelayTx(t *testing.T) {
	e := newEcho(t)
	p := listen(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	const latency = 150 * time.Millisecond
	p.DelayTx(latency, 0)
	for _, s := range []string{"d1", "d2"} {
		start := time.Now()
		send(t, c, s)
		e.expectGot(t, s)
		if took := time.Since(start); took < latency {
			t.Errorf("with DelayTx(%v, 0) %q reached the target after %v; want at least %v",
				latency, s, took, latency)
		}
		receive(t, c, s, 10*time.Second)
	}
	p.UndelayTx()
	start := time.Now()
	for range 5 {
		send(t, c, "u")
		e.expectGot(t, "u")
		receive(t, c, "u", 10*time.Second)
	}
	// Five round trips without the latency; with it they would take 5 x 150 ms.
	if took := time.Since(start); took >= 5*latency {
		t.Errorf("after UndelayTx 5 round trips took %v; want less than %v", took, 5*latency)
	}
}

func TestJitter(t *testing.T) {
	for _, tc := range []struct {
		latency, rv, lo, hi time.Duration
	}{
		{300 * time.Millisecond, 0, 300 * time.Millisecond, 300 * time.Millisecond},
		{300 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond},
		{300 * time.Millisecond, -100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond},
		// rv above latency: a tenth of latency instead
		{100 * time.Millisecond, time.Second, 90 * time.Millisecond, 110 * time.Millisecond},
	} {
		seen := map[time.Duration]bool{}
		for range 200 {
			d := jitter(tc.latency, tc.rv)
			if d < tc.lo || d > tc.hi {
				t.Fatalf("jitter(%v, %v) = %v; want within [%v, %v]", tc.latency, tc.rv, d, tc.lo, tc.hi)
			}
			seen[d] = true
		}
		if tc.rv != 0 && len(seen) < 2 {
			t.Errorf("jitter(%v, %v) drew %d values in 200; want them to vary", tc.latency, tc.rv, len(seen))
		}
	}
}

// TestResetListener: every connection is closed at both ends, bytes held are dropped,
// and the proxy accepts new connections on the same address; pauses stay set.
func TestResetListener(t *testing.T) {
	e := newEcho(t)
	p := listen(t, e.ln.Addr().String())
	addr := p.Addr()
	c := dial(t, addr)
	send(t, c, "r")
	e.expectGot(t, "r")
	receive(t, c, "r", 10*time.Second)
	p.PauseTx()
	send(t, c, "held")

	if err := p.ResetListener(); err != nil {
		t.Fatalf("ResetListener() = %v", err)
	}
	expectClosed(t, c)
	select {
	case <-e.ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the target's connection was not closed in 10 s")
	}
	if p.Addr() != addr {
		t.Fatalf("after ResetListener Addr() = %q; want %q", p.Addr(), addr)
	}

	c2 := dial(t, addr)
	send(t, c2, "new")
	e.expectNothing(t) // still paused, and "held" was dropped with its connection
	p.UnpauseTx()
	e.expectGot(t, "new")
	receive(t, c2, "new", 10*time.Second)
}

// TestClose: Close returns with bytes held, closes the connections, stops listening,
// and later calls change nothing.
func TestClose(t *testing.T) {
	e := newEcho(t)
	p, err := Listen("127.0.0.1:0", e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	p.PauseRx()
	send(t, c, "z")
	e.expectGot(t, "z")
	if err := p.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	expectClosed(t, c)
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		c.Close()
		t.Errorf("dial %s after Close succeeded; want refused", p.Addr())
	}
	if err := p.ResetListener(); !errors.Is(err, ErrClosed) {
		t.Errorf("ResetListener() after Close = %v; want %v", err, ErrClosed)
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close() again = %v; want nil", err)
	}
}

// TestTargetDown: a client's connection is closed when the target cannot be reached.
func TestTargetDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := ln.Addr().String()
	ln.Close()
	p := listen(t, target)
	c := dial(t, p.Addr())
	expectClosed(t, c)
}
