package allocator

import (
	"encoding/json"
	"hash/fnv"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestItemValueRoundTrip(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 6789, time.UTC)
	for _, o := range []Owner{
		KubernetesOwner,
		{Namespace: "ns", Name: `we"ird\name`, UID: "uid-\x01<>&\u2028é"},
		{Namespace: "bad\xffutf8", Name: "", UID: "u"},
	} {
		v := appendItemValue(nil, o, now)
		if !json.Valid(v) {
			t.Fatalf("appendItemValue(%q) = %s; not valid JSON", o, v)
		}
		var want itemValue
		if err := json.Unmarshal(v, &want); err != nil {
			t.Fatal(err)
		}
		got, at, err := decodeItemValue(v)
		if err != nil || got.UID != want.UID || got.Name != want.Name || !at.Equal(now) {
			t.Errorf("decodeItemValue(%s) = %v, %v, %v; want %v, %v", v, got, at, err, want, now)
		}
		if _, _, fast := scanItemValue(v); fast != (o == KubernetesOwner) {
			t.Errorf("scanItemValue(%s) = %v; want %v (plain strings only)", v, fast, o == KubernetesOwner)
		}
		std, _ := json.Marshal(o.UID)
		if mine := appendJSONString(nil, o.UID); string(mine) != string(std) {
			t.Errorf("appendJSONString(%q) = %s; want %s (encoding/json)", o.UID, mine, std)
		}
	}
}

func FuzzOwnerRecord(f *testing.F) {
	f.Add([]byte(`{"namespace":"default","name":"kubernetes","uid":"default/kubernetes",` +
		`"clusterIPs":["10.0.0.1"],"nodePorts":[30001],"last":{"hash":"1a","clusterIPs":["10.0.0.1"]}}`))
	f.Add([]byte(`{"clusterIPs":["fd00::1","not an ip"]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := decodeOwnerRecord(b)
		if err != nil {
			return
		}
		// What decodes re-encodes to JSON that decodes to the same record.
		enc := appendOwnerRecord(nil, rec)
		again, err := decodeOwnerRecord(enc)
		if err != nil {
			t.Fatalf("decode(encode(%+v)) = %v (%s)", rec, err, enc)
		}
		norm := func(r *ownerRecord) *ownerRecord {
			c := r.clone()
			c.Namespace, c.Name = string([]rune(c.Namespace)), string([]rune(c.Name))
			c.UID = string([]rune(c.UID))
			if len(c.ClusterIPs) == 0 {
				c.ClusterIPs = nil
			}
			if len(c.NodePorts) == 0 {
				c.NodePorts = nil
			}
			if c.Last != nil && len(c.Last.ClusterIPs) == 0 {
				c.Last.ClusterIPs = nil
			}
			if c.Last != nil && len(c.Last.NodePorts) == 0 {
				c.Last.NodePorts = nil
			}
			return c
		}
		if !reflect.DeepEqual(norm(again), norm(rec)) {
			t.Fatalf("decode(encode(%+v)) = %+v", rec, again)
		}
	})
}

func TestRequestHash(t *testing.T) {
	base := Request{Owner: Owner{"ns", "a", "u"}, Families: []Family{IPv4}, NodePortCount: 1}
	same := base
	same.DryRun = true
	other := base
	other.NodePortCount = 2
	ips := base
	ips.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.0.0.5")}
	if base.hash() != same.hash() {
		t.Errorf("hash of a dry run differs: %s != %s", base.hash(), same.hash())
	}
	if base.hash() == other.hash() || base.hash() == ips.hash() {
		t.Errorf("hash(%+v) = hash of a different request", base)
	}
}

func FuzzPageToken(f *testing.F) {
	a := newStore(nil, nil, "/allocd")
	f.Add(makeToken(42, "/allocd/clusterips/10.0.0.5"))
	f.Add(makeToken(7, "/allocd/nodeports/30001"))
	f.Add("")
	f.Add("not base64 !")
	f.Fuzz(func(t *testing.T, tok string) {
		rev, key, err := a.parseToken(tok, a.ipPrefix, a.portPrefix)
		if err != nil || tok == "" {
			return
		}
		if rev <= 0 {
			t.Fatalf("parseToken(%q) = rev %d; want > 0", tok, rev)
		}
		again, k2, err := a.parseToken(makeToken(rev, key), a.ipPrefix, a.portPrefix)
		if err != nil || again != rev || k2 != key {
			t.Fatalf("parseToken(makeToken(%d, %q)) = %d, %q, %v", rev, key, again, k2, err)
		}
	})
}

func FuzzItemValue(f *testing.F) {
	f.Add([]byte(`{"namespace":"default","name":"kubernetes","uid":"default/kubernetes",` +
		`"time":"2026-01-02T03:04:05Z"}`))
	f.Add([]byte(`{"time":"not a time"}`))
	f.Add([]byte(`{"namespace":"ns","name":"a\u0041","uid":"u","time":"2026-01-02T03:04:05.5+01:00"}`))
	f.Add([]byte(`{"namespace":"ns","name":"é\xff","uid":"u","time":"2026-01-02T03:04:05Z"}`))
	f.Add([]byte(`{"namespace":"ns","name":"n","uid":"u","time":"2026-01-02T03:04:05Z"} `))
	f.Add([]byte(`{"namespace":"ns","name":"n","uid":"u","time":"2026-01-02T03:04:05.123456789Z","x":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		o, at, err := decodeItemValue(b)
		// The reflection-free decoding agrees with encoding/json.
		wo, wat, werr := decodeItemValueJSON(b)
		if (err == nil) != (werr == nil) || o != wo || !at.Equal(wat) ||
			at.Location().String() != wat.Location().String() {
			t.Fatalf("decodeItemValue(%q) = %v, %v, %v; want %v, %v, %v (encoding/json)", b, o, at, err, wo,
				wat, werr)
		}
		if err != nil {
			return
		}
		o2, at2, err := decodeItemValue(appendItemValue(nil, o, at))
		if err != nil || o2.UID != string([]rune(o.UID)) || !at2.Equal(at) {
			t.Fatalf("decode(encode(%v, %v)) = %v, %v, %v", o, at, o2, at2, err)
		}
	})
}

// hashV1 is the request hash as first written (strings.Builder, strconv.Quote,
// hash/fnv): owner records in etcd hold its values, so hash must give the same.
func hashV1(q *Request) string {
	var sb strings.Builder
	w := func(s string) { sb.WriteString(strconv.Quote(s)); sb.WriteByte(';') }
	w(q.Owner.Namespace)
	w(q.Owner.Name)
	for _, f := range q.Families {
		sb.WriteString(strconv.Itoa(int(f)))
		sb.WriteByte(',')
	}
	sb.WriteString(";p" + strconv.Itoa(int(q.Policy)) + ";")
	for _, a := range q.ClusterIPs {
		sb.WriteString(a.String())
		sb.WriteByte(',')
	}
	sb.WriteByte(';')
	for _, p := range q.NodePorts {
		sb.WriteString(strconv.Itoa(p))
		sb.WriteByte(',')
	}
	sb.WriteString(";n" + strconv.Itoa(q.NodePortCount))
	if q.NoClusterIP {
		sb.WriteString(";none")
	}
	h := fnv.New64a()
	h.Write([]byte(sb.String()))
	return strconv.FormatUint(h.Sum64(), 16)
}

// TestHashStable: the hash of a request is what owner records already hold.
func TestHashStable(t *testing.T) {
	long := strings.Repeat("long-name-", 40)
	reqs := []Request{
		{},
		{Owner: Owner{Namespace: "default", Name: "web", UID: "u"}},
		{Owner: Owner{Namespace: "ns\"q", Name: "näme\x00\n", UID: "u"}, Families: []Family{IPv6, IPv4},
			Policy: RequireDualStack},
		{Owner: Owner{Namespace: long, Name: long},
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fd00::5")}},
		{Owner: Owner{Namespace: "a", Name: "b"}, ClusterIPs: []netip.Addr{{}},
			NodePorts: []int{30000, 30001}, NodePortCount: 2, NoClusterIP: true},
		{Owner: Owner{Namespace: "a", Name: "b"},
			ClusterIPs: []netip.Addr{netip.MustParseAddr("fe80::1%eth0")}, Policy: PreferDualStack},
	}
	for _, q := range reqs {
		if got, want := q.hash(), hashV1(&q); got != want {
			t.Errorf("hash(%+v) = %s; want %s", q, got, want)
		}
	}
}
