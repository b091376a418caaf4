package allocator

import (
	"encoding/json"
	"net/netip"
	"testing"
	"time"
)

// The codec's benchmarks: the hand-written encoders and the reflection-free decoder of
// item values against encoding/json, on the values one Allocate writes (an item value
// and its owner's record) and List reads (item values).

var (
	benchOwner = Owner{Namespace: "kube-system", Name: "kube-dns",
		UID: "0f6c1b52-9a2e-4c4e-8f59-1f7a0c1c2d3e"}
	benchTime = time.Date(2026, 11, 25, 3, 4, 5, 123456789, time.UTC)
	benchRec  = &ownerRecord{Namespace: benchOwner.Namespace, Name: benchOwner.Name, UID: benchOwner.UID,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, NodePorts: []int{30053},
		Last: &lastRequest{Hash: "0123456789abcdef",
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, NodePorts: []int{30053}}}
)

func BenchmarkCodecEncode(b *testing.B) {
	b.Run("codec", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf = appendItemValue(buf[:0], benchOwner, benchTime)
			buf = appendOwnerRecord(buf, benchRec)
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(itemValue{Namespace: benchOwner.Namespace, Name: benchOwner.Name,
				UID: benchOwner.UID, Time: benchTime}); err != nil {
				b.Fatal(err)
			}
			if _, err := json.Marshal(benchRec); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkCodecDecodeItem(b *testing.B) {
	v := appendItemValue(nil, benchOwner, benchTime)
	b.Run("codec", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := decodeItemValue(v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := decodeItemValueJSON(v); err != nil {
				b.Fatal(err)
			}
		}
	})
}
