package endpoints

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/allocd/allocd/endpoints/kube"
)

// subsetsFrom builds subsets from fuzz bytes, four bytes an entry: which subset, the
// address (IP and target uid from small sets, so that they collide), ready or not, and
// the port (a small set, some without a name).
func subsetsFrom(data []byte) []kube.Subset {
	var subs []kube.Subset
	for len(data) >= 4 {
		si, ab, flags, pb := int(data[0]%4), data[1], data[2], data[3]
		data = data[4:]
		for len(subs) <= si {
			subs = append(subs, kube.Subset{})
		}
		a := kube.Address{IP: netip.AddrFrom4([4]byte{10, 0, 0, ab % 8}).String()}
		if ab&0x80 != 0 {
			a.IP = netip.AddrFrom16([16]byte{0xfd, 15: ab % 8}).String()
		}
		if uid := (ab >> 3) % 3; uid > 0 {
			a.TargetRef = &kube.ObjectRef{Kind: "Pod", Namespace: "ns", Name: "p",
				UID: string(rune('a' + uid))}
		}
		if flags&1 == 0 {
			subs[si].Addresses = append(subs[si].Addresses, a)
		} else {
			subs[si].NotReadyAddresses = append(subs[si].NotReadyAddresses, a)
		}
		if flags&2 != 0 {
			p := kube.Port{Port: 8080 + int32(pb%3), Protocol: kube.ProtocolTCP}
			if pb&4 != 0 {
				p.Name = "named"
			}
			if pb&8 != 0 {
				p.Port = 0 // not listed by RepackSubsets
			}
			subs[si].Ports = append(subs[si].Ports, p)
		}
	}
	return subs
}

// upstreamRepack is RepackSubsets of kubernetes pkg/api/v1/endpoints/util.go written
// out literally (maps of sets, the -1 sentinel, "port.Port > 0"), without its final
// hash order: the oracle Repack is fuzzed against.
func upstreamRepack(subsets []kube.Subset) []kube.Subset {
	allAddrs := map[addrKey]*kube.Address{}
	portToAddrReadyMap := map[portKey]map[*kube.Address]bool{}
	portOf := map[portKey]kube.Port{}
	mapAddressByPort := func(addr *kube.Address, port portKey, ready bool) {
		key := keyOf(addr)
		existing := allAddrs[key]
		if existing == nil {
			cp := *addr
			existing = &cp
			allAddrs[key] = existing
		}
		if _, found := portToAddrReadyMap[port]; !found {
			portToAddrReadyMap[port] = map[*kube.Address]bool{}
		}
		if wasReady, found := portToAddrReadyMap[port][existing]; !found || wasReady {
			portToAddrReadyMap[port][existing] = ready
		}
	}
	mapAddressesByPort := func(s *kube.Subset, port portKey) {
		for k := range s.Addresses {
			mapAddressByPort(&s.Addresses[k], port, true)
		}
		for k := range s.NotReadyAddresses {
			mapAddressByPort(&s.NotReadyAddresses[k], port, false)
		}
	}
	for i := range subsets {
		if len(subsets[i].Ports) == 0 {
			mapAddressesByPort(&subsets[i], noPort)
		} else {
			for _, p := range subsets[i].Ports {
				portOf[keyOfPort(p)] = p
				mapAddressesByPort(&subsets[i], keyOfPort(p))
			}
		}
	}
	hash := func(set map[*kube.Address]bool) string {
		var keys []string
		for a, ready := range set {
			k := keyOf(a)
			keys = append(keys, fmt.Sprintf("%q/%q/%v", k.ip, k.uid, ready))
		}
		slices.Sort(keys)
		return strings.Join(keys, ",")
	}
	keyToAddrReadyMap := map[string]map[*kube.Address]bool{}
	addrReadyMapKeyToPorts := map[string][]kube.Port{}
	for port, addrs := range portToAddrReadyMap {
		key := hash(addrs)
		keyToAddrReadyMap[key] = addrs
		if port.port > 0 {
			addrReadyMapKeyToPorts[key] = append(addrReadyMapKeyToPorts[key], portOf[port])
		} else if _, found := addrReadyMapKeyToPorts[key]; !found {
			addrReadyMapKeyToPorts[key] = nil
		}
	}
	var final []kube.Subset
	for key, ports := range addrReadyMapKeyToPorts {
		var s kube.Subset
		for a, ready := range keyToAddrReadyMap[key] {
			if ready {
				s.Addresses = append(s.Addresses, *a)
			} else {
				s.NotReadyAddresses = append(s.NotReadyAddresses, *a)
			}
		}
		s.Ports = ports
		sortSubset(&s)
		final = append(final, s)
	}
	slices.SortFunc(final, compareSubsets)
	return final
}

// FuzzRepack: Repack gives what upstream's RepackSubsets gives (in allocd's order), is
// idempotent, and does not depend on the order of its input.
func FuzzRepack(f *testing.F) {
	f.Add([]byte{0, 1, 2, 0, 0, 1, 3, 1, 1, 2, 0, 0})
	f.Add([]byte{0, 0x81, 0, 0, 1, 0x81, 1, 0, 2, 9, 2, 4, 3, 17, 3, 5})
	f.Fuzz(func(t *testing.T, data []byte) {
		in := subsetsFrom(data)
		out := Repack(in)
		if want := upstreamRepack(subsetsFrom(data)); !subsetsEqual(out, want) {
			t.Fatalf("Repack differs from RepackSubsets:\nin       %s\nRepack   %s\nupstream %s", show(in),
				show(out), show(want))
		}
		// Idempotent, except where upstream is not: a port 0 is grouped on its own
		// but not listed, so its addresses come out as a second port-less subset.
		if again := Repack(out); !hasPortZero(in) && !subsetsEqual(again, out) {
			t.Fatalf("Repack is not idempotent:\n%s\n%s", show(out), show(again))
		}
		// Shuffle the entries: the same canonical result (the copies of one address
		// are identical here, so which copy comes first does not matter).
		r := rand.New(rand.NewPCG(uint64(len(data)), 1))
		shuffled := make([]kube.Subset, 0, len(in))
		for _, s := range subsetsFrom(data) {
			for _, list := range [][]kube.Address{s.Addresses, s.NotReadyAddresses} {
				r.Shuffle(len(list), func(i, j int) { list[i], list[j] = list[j], list[i] })
			}
			r.Shuffle(len(s.Ports), func(i, j int) { s.Ports[i], s.Ports[j] = s.Ports[j], s.Ports[i] })
			shuffled = append(shuffled, s)
		}
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if other := Repack(shuffled); !subsetsEqual(other, out) {
			t.Fatalf("Repack depends on input order:\n%s\n%s", show(out), show(other))
		}
	})
}

func hasPortZero(subs []kube.Subset) bool {
	for _, s := range subs {
		for _, p := range s.Ports {
			if p.Port <= 0 {
				return true
			}
		}
	}
	return false
}
