package loopback

import (
	"net"
	"net/netip"
	"testing"
)

func TestFreeAddr(t *testing.T) {
	seen := map[string]bool{}
	for range 20 {
		a, err := FreeAddr()
		if err != nil {
			t.Fatalf("FreeAddr() = %v", err)
		}
		ap, err := netip.ParseAddrPort(a)
		if err != nil || !ap.Addr().IsLoopback() || ap.Port() == 0 {
			t.Fatalf("FreeAddr() = %q; want a loopback host:port", a)
		}
		if seen[a] {
			t.Fatalf("FreeAddr() returned %q twice", a)
		}
		seen[a] = true
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("listen on FreeAddr()'s %q: %v", a, err)
		}
		l.Close()
	}
}
