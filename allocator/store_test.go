package allocator

import (
	"net/netip"
	"testing"
)

// TestKey checks the item keys against their text form, and that parseKey reads them
// back.
func TestKey(t *testing.T) {
	s := newStore(nil, nil, "/allocd")
	for _, c := range []struct {
		it   Item
		want string
	}{
		{IP(netip.MustParseAddr("10.96.0.10")), "/allocd/clusterips/10.96.0.10"},
		{IP(netip.MustParseAddr("fd00::a")), "/allocd/clusterips/fd00::a"},
		{IP(netip.MustParseAddr("::ffff:10.0.0.1")), "/allocd/clusterips/::ffff:10.0.0.1"},
		{IP(netip.Addr{}), "/allocd/clusterips/invalid IP"},
		{Port(30080), "/allocd/nodeports/30080"},
	} {
		got := s.key(c.it)
		if got != c.want {
			t.Errorf("key(%v) = %q; want %q", c.it, got, c.want)
		}
		if !c.it.Addr.IsValid() && c.it.Kind == KindClusterIP {
			continue
		}
		if back, ok := s.parseKey([]byte(got)); !ok || back != c.it {
			t.Errorf("parseKey(%q) = %v, %v; want %v", got, back, ok, c.it)
		}
	}
	long := newStore(nil, nil, "/"+string(make([]byte, 200)))
	if got, want := long.key(IP(netip.MustParseAddr("10.0.0.1"))), long.ipPrefix+"10.0.0.1"; got != want {
		t.Errorf("key under a 200-byte prefix = %q; want %q", got, want)
	}
}
