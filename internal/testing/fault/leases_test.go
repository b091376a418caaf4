package fault

import (
	"strings"
	"testing"
	"time"
)

// TestLeaseChecks: a renewed lease's key deleted while it was renewed in time must be
// written again within TTL/3, and default/kubernetes must not lack its address for
// longer; a list must have it; a delete after renewals that came late is reported, not
// a violation.
func TestLeaseChecks(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	renew := func(start int) op {
		return op{kind: opRenew, owner: "192.0.2.1", start: ms(start), end: ms(start + 10), outcome: ok}
	}
	del := func(at int, rev int64) keyEvent {
		return keyEvent{at: ms(at), rev: rev, ip: "192.0.2.1", del: true}
	}
	put := func(at int, rev int64) keyEvent { return keyEvent{at: ms(at), rev: rev, ip: "192.0.2.1"} }
	both := []string{"192.0.2.1", "192.0.2.2"}
	for _, tc := range []struct {
		name   string
		renews []op
		keys   []keyEvent
		eps    []epsState
		lists  []leaseList
		want   []string // a substring of each violation, in order
	}{
		{"restored at once", []op{renew(0), renew(1000)}, []keyEvent{del(1300, 5), put(1310, 6)},
			[]epsState{{at: ms(500), rev: 1, ips: both}}, nil, nil},
		{"restored by the next renewal only", []op{renew(0), renew(1000), renew(2500)},
			[]keyEvent{del(1300, 5), put(2510, 6)}, nil, nil,
			[]string{"etcd deleted the key of master lease 192.0.2.1 at 1.3s"}},
		{"deleted after late renewals", []op{renew(0), renew(3500)}, []keyEvent{del(3000, 5), put(3510, 6)},
			nil, nil, nil},
		{"endpoints without it for 1.5 s", []op{renew(0), renew(1000), renew(2000)}, nil,
			[]epsState{{at: ms(500), rev: 1, ips: both}, {at: ms(1300), rev: 2, ips: both[1:]},
				{at: ms(2800), rev: 3, ips: both}}, nil,
			[]string{"default/kubernetes's Endpoints without 192.0.2.1 at 1.3s"}},
		{"endpoints without it for 0.2 s", []op{renew(0), renew(1000), renew(2000)}, nil,
			[]epsState{{at: ms(500), rev: 1, ips: both}, {at: ms(1300), rev: 2, ips: both[1:]},
				{at: ms(1500), rev: 3, ips: both}}, nil, nil},
		{"missing from a list", []op{renew(0), renew(1000)}, nil, nil,
			[]leaseList{{start: ms(1200), end: ms(1250), ips: both[1:]}},
			[]string{"master lease 192.0.2.1 missing from a list at 1.2s-1.25s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &leases{renewed: []string{"192.0.2.1"}, abandoned: "192.0.2.9", renews: tc.renews,
				lists: tc.lists, keys: map[keyRev]keyEvent{}, eps: map[int64]epsState{}}
			for _, k := range tc.keys {
				l.keys[keyRev{leasePrefix + k.ip, k.rev}] = k
			}
			for _, e := range tc.eps {
				l.eps[e.rev] = e
			}
			viol, report := l.check(nil)
			if len(viol) != len(tc.want) {
				t.Fatalf("check() = %q; want %d violations (%q); report %q", viol, len(tc.want), tc.want,
					report)
			}
			for i, w := range tc.want {
				if !strings.Contains(string(viol[i]), w) {
					t.Errorf("violation %d = %q; want it to say %q", i, viol[i], w)
				}
			}
		})
	}
}
