package allocator

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/allocd/allocd/internal/badrequest"
)

func TestIPSpan(t *testing.T) {
	tests := []struct {
		cidr        string
		size, band  uint64
		first, last string
		outside     []string // not usable: network, broadcast, out of prefix, other family
		staticLast  string   // last address of the static band ("" when none)
	}{
		{"10.0.0.0/24", 254, 16, "10.0.0.1", "10.0.0.254",
			[]string{"10.0.0.0", "10.0.0.255", "10.0.1.1", "::1"}, "10.0.0.16"},
		{"10.0.0.0/29", 6, 0, "10.0.0.1", "10.0.0.6", []string{"10.0.0.0", "10.0.0.7"}, ""},
		{"10.0.0.0/28", 14, 0, "10.0.0.1", "10.0.0.14", []string{"10.0.0.15"}, ""},
		{"10.0.0.0/27", 30, 16, "10.0.0.1", "10.0.0.30", []string{"10.0.0.31"}, "10.0.0.16"},
		{"10.96.0.0/12", 1<<20 - 2, 256, "10.96.0.1", "10.111.255.254",
			[]string{"10.96.0.0", "10.111.255.255", "10.112.0.0"}, "10.96.1.0"},
		{"10.0.0.0/8", 1<<24 - 2, 256, "10.0.0.1", "10.255.255.254", []string{"10.255.255.255", "11.0.0.0"},
			"10.0.1.0"},
		{"255.255.255.0/24", 254, 16, "255.255.255.1", "255.255.255.254", []string{"255.255.255.255"},
			"255.255.255.16"},
		{"fd00::/120", 255, 16, "fd00::1", "fd00::ff", []string{"fd00::", "fd00::100", "10.0.0.1"},
			"fd00::10"},
		{"fd00::/125", 7, 0, "fd00::1", "fd00::7", []string{"fd00::", "fd00::8"}, ""},
		{"fd00::/108", 1<<20 - 1, 256, "fd00::1", "fd00::f:ffff", []string{"fd00::10:0"}, "fd00::100"},
		{"fd00::/104", 1<<24 - 1, 256, "fd00::1", "fd00::ff:ffff", []string{"fd00::100:0"}, "fd00::100"},
		{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120", 255, 16, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff01",
			"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", nil, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff10"},
		{"::ff00:0:0:0:0/104", 1<<24 - 1, 256, "::ff00:0:0:0:1", "::ff00:0:0:ff:ffff",
			[]string{"0:0:0:feff:ffff:ffff:ffff:ffff"}, "::ff00:0:0:0:100"},
		{"2001:db8:0:0:ffff:ffff:ff00:0/104", 1<<24 - 1, 256, "2001:db8::ffff:ffff:ff00:1",
			"2001:db8::ffff:ffff:ffff:ffff", []string{"2001:db8:0:1::"}, "2001:db8::ffff:ffff:ff00:100"},
	}
	for _, tc := range tests {
		t.Run(tc.cidr, func(t *testing.T) {
			r := newIPRangeFor(netip.MustParsePrefix(tc.cidr))
			if r.Size() != tc.size || r.Band() != tc.band {
				t.Errorf("newIPRange(%s) size, band = %d, %d; want %d, %d", tc.cidr, r.Size(), r.Band(),
					tc.size, tc.band)
			}
			if got := r.item(0).Addr.String(); got != tc.first {
				t.Errorf("first(%s) = %s; want %s", tc.cidr, got, tc.first)
			}
			if got := r.item(r.Size() - 1).Addr.String(); got != tc.last {
				t.Errorf("last(%s) = %s; want %s", tc.cidr, got, tc.last)
			}
			for _, s := range []string{tc.first, tc.last} {
				if off, ok := r.offset(IP(netip.MustParseAddr(s))); !ok || r.item(off).Addr.String() != s {
					t.Errorf("offset(%s) = %d, %v; want a usable offset that maps back", s, off, ok)
				}
			}
			for _, s := range tc.outside {
				if off, ok := r.offset(IP(netip.MustParseAddr(s))); ok {
					t.Errorf("offset(%s) in %s = %d, true; want not usable", s, tc.cidr, off)
				}
			}
			a := &Allocator{idx: &rangeIndex{}}
			a.idx.tab.Store(&table{all: []*rng{r}})
			ri := a.Ranges()[0]
			var got string
			if ri.Static.Size > 0 {
				got = ri.Static.Last.String()
			}
			if got != tc.staticLast {
				t.Errorf("static band of %s ends at %q; want %q", tc.cidr, got, tc.staticLast)
			}
			if ri.Static.Size+ri.Dynamic.Size != tc.size {
				t.Errorf("bands of %s = %d + %d; want %d in all", tc.cidr, ri.Static.Size, ri.Dynamic.Size,
					tc.size)
			}
		})
	}
}

func TestBands(t *testing.T) {
	tests := []struct {
		size     uint64
		ip, port uint64
	}{
		{8, 0, 0}, {16, 0, 0}, {17, 16, 16}, {32, 16, 16}, {256, 16, 16}, {512, 32, 16},
		{1024, 64, 32}, {2768, 173, 86}, {4096, 256, 128}, {1 << 20, 256, 128}, {1 << 24, 256, 128},
	}
	for _, tc := range tests {
		if got := ipBand(tc.size); got != tc.ip {
			t.Errorf("ipBand(%d) = %d; want %d", tc.size, got, tc.ip)
		}
		if got := portBand(tc.size); got != tc.port {
			t.Errorf("portBand(%d) = %d; want %d", tc.size, got, tc.port)
		}
	}
	r := newPortRange(DefaultNodePortRange)
	if r.Band() != 86 || r.item(r.Band()-1).Port != 30085 || r.item(r.Size()-1).Port != 32767 {
		t.Errorf("default node port range band = %d ending at %d; want 86 ending at 30085", r.Band(),
			r.item(r.Band()-1).Port)
	}
}

func TestParsePortRange(t *testing.T) {
	tests := []struct {
		in   string
		want PortRange
		ok   bool
	}{
		{"30000-32767", PortRange{30000, 2768}, true},
		{"30000+2767", PortRange{30000, 2768}, true},
		{"8080", PortRange{8080, 1}, true},
		{" 1-65535 ", PortRange{1, 65535}, true},
		{"", PortRange{}, false},
		{"0-100", PortRange{}, false},
		{"100-65536", PortRange{}, false},
		{"200-100", PortRange{}, false},
		{"a-b", PortRange{}, false},
		{"65000+1000", PortRange{}, false},
		{"100+-1", PortRange{}, false},
	}
	for _, tc := range tests {
		got, err := ParsePortRange(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParsePortRange(%q) = %v, %v; want %v, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		if tc.ok && got.String() != "" {
			if again, err := ParsePortRange(got.String()); err != nil || again != got {
				t.Errorf("ParsePortRange(%q) = %v, %v; want %v", got.String(), again, err, got)
			}
		}
	}
}

func TestValidateConfig(t *testing.T) {
	p := netip.MustParsePrefix
	ok := Config{Prefix: "/allocd", ClusterIPRanges: []netip.Prefix{p("10.0.0.0/24")},
		NodePortRange: DefaultNodePortRange}
	tests := []struct {
		name   string
		mutate func(*Config)
		valid  bool
	}{
		{"default", func(*Config) {}, true},
		{"dual stack", func(c *Config) { c.ClusterIPRanges = append(c.ClusterIPRanges, p("fd00::/108")) },
			true},
		{"IPv4 /8", func(c *Config) { c.ClusterIPRanges = []netip.Prefix{p("10.0.0.0/8")} }, true},
		{"IPv6 /104", func(c *Config) { c.ClusterIPRanges = []netip.Prefix{p("fd00::/104")} }, true},
		{"IPv4 /29", func(c *Config) { c.ClusterIPRanges = []netip.Prefix{p("10.0.0.0/29")} }, true},
		{"kubernetes node port", func(c *Config) { c.KubernetesNodePort = 30001 }, true},
		{"IPv4 /7", func(c *Config) { c.ClusterIPRanges = []netip.Prefix{p("10.0.0.0/7")} }, false},
		{"IPv6 /103", func(c *Config) { c.ClusterIPRanges = []netip.Prefix{p("fd00::/103")} }, false},
		{"IPv4 /30", func(c *Config) { c.ClusterIPRanges = []netip.Prefix{p("10.0.0.0/30")} }, false},
		{"IPv4 /31", func(c *Config) { c.ClusterIPRanges = []netip.Prefix{p("10.0.0.0/31")} }, false},
		{"IPv4 /32", func(c *Config) { c.ClusterIPRanges = []netip.Prefix{p("10.0.0.1/32")} }, false},
		{"IPv6 /126", func(c *Config) { c.ClusterIPRanges = []netip.Prefix{p("fd00::/126")} }, false},
		{"IPv6 /127", func(c *Config) { c.ClusterIPRanges = []netip.Prefix{p("fd00::/127")} }, false},
		{"IPv6 /128", func(c *Config) { c.ClusterIPRanges = []netip.Prefix{p("fd00::1/128")} }, false},
		{"host bits", func(c *Config) { c.ClusterIPRanges = []netip.Prefix{p("10.0.0.5/24")} }, false},
		{"two IPv4", func(c *Config) { c.ClusterIPRanges = append(c.ClusterIPRanges, p("10.1.0.0/24")) },
			false},
		{"three", func(c *Config) {
			c.ClusterIPRanges = append(c.ClusterIPRanges, p("fd00::/108"), p("fd01::/108"))
		}, false},
		{"none", func(c *Config) { c.ClusterIPRanges = nil }, false},
		{"4in6", func(c *Config) { c.ClusterIPRanges = []netip.Prefix{p("::ffff:10.0.0.0/120")} }, false},
		{"node port outside", func(c *Config) { c.KubernetesNodePort = 80 }, false},
		{"port range past 65535", func(c *Config) { c.NodePortRange = PortRange{65000, 1000} }, false},
		{"empty port range", func(c *Config) { c.NodePortRange = PortRange{} }, false},
		{"no prefix", func(c *Config) { c.Prefix = "" }, false},
		{"trailing slash", func(c *Config) { c.Prefix = "/allocd/" }, false},
		{"relative prefix", func(c *Config) { c.Prefix = "allocd" }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			c.ClusterIPRanges = append([]netip.Prefix(nil), ok.ClusterIPRanges...)
			tc.mutate(&c)
			err := ValidateConfig(c)
			if (err == nil) != tc.valid {
				t.Errorf("ValidateConfig(%v) = %v; want valid=%v", c.ClusterIPRanges, err, tc.valid)
			}
		})
	}
}

func FuzzOffset(f *testing.F) {
	f.Add("10.0.0.0/24", "10.0.0.17")
	f.Add("10.0.0.0/8", "10.255.255.254")
	f.Add("fd00::/104", "fd00::ff:ffff")
	f.Add("fd00::/120", "fd00::")
	f.Add("255.255.255.248/29", "255.255.255.255")
	f.Add("ffff:ffff:ffff:ffff:ffff:ffff:ff00:0/104", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")
	f.Fuzz(func(t *testing.T, cidr, addr string) {
		p, err := netip.ParsePrefix(cidr)
		if err != nil || validatePrefix(p) != nil {
			return
		}
		a, err := netip.ParseAddr(addr)
		if err != nil {
			return
		}
		s := newIPSpan(p)
		off, ok := s.offset(a)
		// Usable: in the prefix, not the network address, not the IPv4 broadcast.
		want := p.Contains(a) && a != p.Addr()
		if want && a.Is4() {
			bcast := s.addr(s.size - 1).Next()
			want = a != bcast
		}
		if ok != want {
			t.Fatalf("offset(%s in %s) ok = %v; want %v", a, p, ok, want)
		}
		if ok {
			if off >= s.size {
				t.Fatalf("offset(%s in %s) = %d; want < %d", a, p, off, s.size)
			}
			if back := s.addr(off); back != a {
				t.Fatalf("addr(offset(%s)) = %s; want %s", a, back, a)
			}
		}
	})
}

func TestErrors(t *testing.T) {
	tests := []struct {
		err    error
		target error
	}{
		{&NotInRangeError{Item: Port(1), Range: "30000-32767"}, ErrNotInRange},
		{&AllocatedError{Item: Port(30001), Holder: KubernetesOwner}, ErrAllocated},
		{&NotOwnerError{Item: Port(30001)}, ErrNotOwner},
		{badrequest.New("f", ""), ErrInvalid},
		{&RangesMismatchError{}, ErrRangesMismatch},
	}
	for _, tc := range tests {
		if !errors.Is(tc.err, tc.target) {
			t.Errorf("errors.Is(%v, %v) = false; want true", tc.err, tc.target)
		}
	}
}

func TestCheckUID(t *testing.T) {
	for _, tc := range []struct {
		uid string
		ok  bool
	}{
		{"0f6c1b52-9a2e-4c4e-8f59-1f7a0c1c2d3e", true},
		{"default/kubernetes", true},
		{"uid-a", true},
		{"", false},
		{"/a", false},
		{"a/", false},
		{"a//b", false},
		{"a/../b", false},
		{".", false},
		{"a b", false},
		{"a\nb", false},
		{"\xff", false},
	} {
		if why := CheckUID(tc.uid); (why == "") != tc.ok {
			t.Errorf("CheckUID(%q) = %q; want ok=%v", tc.uid, why, tc.ok)
		}
	}
}

// TestRangeSet: the value repair judges with answers as the Allocator does.
func TestRangeSet(t *testing.T) {
	st := newStore(nil, nil, "/t")
	a := &Allocator{store: st, idx: &rangeIndex{store: st}}
	a.idx.portRange = newPortRange(PortRange{Base: 30000, Size: 100})
	// Two ServiceCIDRs, one of them terminating, and a range nested in another.
	tab, _ := a.idx.buildTable([]ServiceCIDR{
		{Name: KubernetesCIDR, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"),
			netip.MustParsePrefix("fd00::/120")}, State: CIDRReady, CreateRevision: 1},
		{Name: "old", CIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/28")}, State: CIDRTerminating,
			CreateRevision: 2},
		{Name: "nested", CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.128/25")}, State: CIDRReady,
			CreateRevision: 3},
	})
	a.idx.tab.Store(tab)
	a.kubeIP, a.kubePort = netip.MustParseAddr("10.0.0.1"), 30005
	s := a.RangeSet()
	if got, want := strings.Join(s.Names(), ","), strings.Join(a.idx.rangeNames(), ","); got != want {
		t.Errorf("Names() = %s; want %s", got, want)
	}
	items := []Item{Port(30000), Port(30099), Port(30100), Port(29999), Port(30005), {Kind: KindClusterIP},
		{Kind: 9}}
	for _, ip := range []string{"10.0.0.0", "10.0.0.1", "10.0.0.128", "10.0.0.200", "10.0.0.254",
		"10.0.0.255", "10.0.1.1", "10.1.0.5", "10.1.0.15", "fd00::", "fd00::1", "fd00::ff", "fd00::100",
		"::ffff:10.0.0.5"} {
		items = append(items, IP(netip.MustParseAddr(ip)))
	}
	for _, it := range items {
		got, gerr := s.Of(it)
		want, werr := a.idx.rangeOf(it)
		if got != want || fmt.Sprint(gerr) != fmt.Sprint(werr) {
			t.Errorf("RangeSet.Of(%v) = %q, %v; Allocator.rangeOf = %q, %v", it, got, gerr, want, werr)
		}
		if s.IsReserved(it) != a.IsReserved(it) {
			t.Errorf("RangeSet.IsReserved(%v) = %v; Allocator.IsReserved = %v", it, s.IsReserved(it),
				a.IsReserved(it))
		}
	}
}
