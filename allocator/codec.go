package allocator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

// The values are JSON (etcdctl shows them as they are), encoded without reflection and
// item values decoded without it: BenchmarkCodecEncode (an item value and an owner
// record, what one Allocate writes) takes 300 ns and no allocation here against
// encoding/json's 1,240 ns and 6 allocations (528 B); BenchmarkCodecDecodeItem (what
// List does per allocation) 157 ns and one allocation against 1,250 ns and 8. Anything
// not in the exact form written is decoded by encoding/json, so both ways agree.

// itemValue is the JSON value of <prefix>/clusterips/<ip> and <prefix>/nodeports/<port>.
type itemValue struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	UID       string    `json:"uid"`
	Time      time.Time `json:"time"`
}

// appendItemValue encodes an item value without reflection: it is on the hot path.
func appendItemValue(b []byte, o Owner, t time.Time) []byte {
	b = append(b, `{"namespace":`...)
	b = appendJSONString(b, o.Namespace)
	b = append(b, `,"name":`...)
	b = appendJSONString(b, o.Name)
	b = append(b, `,"uid":`...)
	b = appendJSONString(b, o.UID)
	b = append(b, `,"time":"`...)
	b = t.UTC().AppendFormat(b, time.RFC3339Nano)
	return append(b, `"}`...)
}

// decodeItemValue decodes an item value: the form appendItemValue writes without
// reflection, anything else through encoding/json.
func decodeItemValue(v []byte) (Owner, time.Time, error) {
	if f, t, ok := scanItemValue(v); ok {
		s := string(v[f[0]:f[5]]) // one allocation for the three strings
		o := Owner{Namespace: s[:f[1]-f[0]], Name: s[f[2]-f[0] : f[3]-f[0]], UID: s[f[4]-f[0]:]}
		return o, t, nil
	}
	return decodeItemValueJSON(v)
}

func decodeItemValueJSON(v []byte) (Owner, time.Time, error) {
	var iv itemValue
	if err := json.Unmarshal(v, &iv); err != nil {
		return Owner{}, time.Time{}, fmt.Errorf("decode allocation: %w", err)
	}
	return Owner{Namespace: iv.Namespace, Name: iv.Name, UID: iv.UID}, iv.Time, nil
}

// scanItemValue finds the fields of an item value in the exact form appendItemValue
// writes for strings that need no escapes: f holds the start and end offsets in v of
// the namespace, the name and the uid, in that order. It reports false for any other
// form (escapes, invalid UTF-8, other spacing or order), which encoding/json decodes,
// so that both ways give the same result.
func scanItemValue(v []byte) (f [6]int, t time.Time, ok bool) {
	i := 0
	for n, sep := range [...]string{`{"namespace":"`, `","name":"`, `","uid":"`} {
		if !bytes.HasPrefix(v[i:], []byte(sep)) {
			return f, t, false
		}
		i += len(sep)
		end, ok := scanPlainString(v, i)
		if !ok {
			return f, t, false
		}
		f[2*n], f[2*n+1] = i, end
		i = end
	}
	const sep = `","time":"`
	if !bytes.HasPrefix(v[i:], []byte(sep)) {
		return f, t, false
	}
	i += len(sep)
	end := bytes.IndexByte(v[i:], '"')
	if end < 0 || string(v[i+end:]) != `"}` {
		return f, t, false
	}
	// time.Time's UnmarshalJSON parses the quoted text the same way.
	if t.UnmarshalText(v[i:i+end]) != nil {
		return f, t, false
	}
	return f, t, true
}

// scanPlainString returns the offset of the quote that ends the JSON string starting
// at v[i], if the string has no escapes, no control characters and valid UTF-8: its
// bytes are then its value.
func scanPlainString(v []byte, i int) (int, bool) {
	ascii := true
	for j := i; j < len(v); j++ {
		switch c := v[j]; {
		case c == '"':
			return j, ascii || utf8.Valid(v[i:j])
		case c == '\\' || c < 0x20:
			return 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return 0, false
}

// ownerRecord is the JSON value of <prefix>/owners/<uid>: every item the owner holds,
// and its last Allocate request (hash and result) for idempotent retries.
type ownerRecord struct {
	Namespace  string       `json:"namespace"`
	Name       string       `json:"name"`
	UID        string       `json:"uid"`
	ClusterIPs []netip.Addr `json:"clusterIPs,omitempty"`
	NodePorts  []int        `json:"nodePorts,omitempty"`
	Last       *lastRequest `json:"last,omitempty"`
}

// lastRequest is an owner's last Allocate request and its result.
type lastRequest struct {
	Hash       string       `json:"hash"`
	ClusterIPs []netip.Addr `json:"clusterIPs,omitempty"`
	NodePorts  []int        `json:"nodePorts,omitempty"`
}

// itemList returns the items the record lists, ClusterIPs first.
func (r *ownerRecord) itemList() []Item {
	items := make([]Item, 0, r.items())
	for _, ip := range r.ClusterIPs {
		items = append(items, IP(ip))
	}
	for _, p := range r.NodePorts {
		items = append(items, Port(p))
	}
	return items
}

func (r *ownerRecord) items() int { return len(r.ClusterIPs) + len(r.NodePorts) }

func (r *ownerRecord) holds(it Item) bool {
	if it.Kind == KindClusterIP {
		return slices.Contains(r.ClusterIPs, it.Addr)
	}
	return slices.Contains(r.NodePorts, it.Port)
}

func (r *ownerRecord) add(it Item) {
	if r.holds(it) {
		return
	}
	if it.Kind == KindClusterIP {
		r.ClusterIPs = append(r.ClusterIPs, it.Addr)
	} else {
		r.NodePorts = append(r.NodePorts, it.Port)
	}
}

func (r *ownerRecord) remove(it Item) {
	if it.Kind == KindClusterIP {
		r.ClusterIPs = slices.DeleteFunc(r.ClusterIPs, func(a netip.Addr) bool { return a == it.Addr })
	} else {
		r.NodePorts = slices.DeleteFunc(r.NodePorts, func(p int) bool { return p == it.Port })
	}
}

// holdsLast reports whether the record still holds everything its last request got,
// so that replaying that result is truthful.
func (r *ownerRecord) holdsLast() bool {
	if r.Last == nil {
		return false
	}
	for _, a := range r.Last.ClusterIPs {
		if !slices.Contains(r.ClusterIPs, a) {
			return false
		}
	}
	for _, p := range r.Last.NodePorts {
		if !slices.Contains(r.NodePorts, p) {
			return false
		}
	}
	return true
}

func (r *ownerRecord) clone() *ownerRecord {
	c := *r
	c.ClusterIPs = slices.Clone(r.ClusterIPs)
	c.NodePorts = slices.Clone(r.NodePorts)
	if r.Last != nil {
		l := *r.Last
		c.Last = &l
	}
	return &c
}

// appendOwnerRecord encodes r like encoding/json would, without reflection.
func appendOwnerRecord(b []byte, r *ownerRecord) []byte {
	b = append(b, `{"namespace":`...)
	b = appendJSONString(b, r.Namespace)
	b = append(b, `,"name":`...)
	b = appendJSONString(b, r.Name)
	b = append(b, `,"uid":`...)
	b = appendJSONString(b, r.UID)
	b = appendItems(b, r.ClusterIPs, r.NodePorts)
	if r.Last != nil {
		b = append(b, `,"last":{"hash":`...)
		b = appendJSONString(b, r.Last.Hash)
		b = appendItems(b, r.Last.ClusterIPs, r.Last.NodePorts)
		b = append(b, '}')
	}
	return append(b, '}')
}

func appendItems(b []byte, ips []netip.Addr, ports []int) []byte {
	if len(ips) > 0 {
		b = append(b, `,"clusterIPs":[`...)
		for i, a := range ips {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '"')
			b = a.AppendTo(b)
			b = append(b, '"')
		}
		b = append(b, ']')
	}
	if len(ports) > 0 {
		b = append(b, `,"nodePorts":[`...)
		for i, p := range ports {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(p), 10)
		}
		b = append(b, ']')
	}
	return b
}

func decodeOwnerRecord(v []byte) (*ownerRecord, error) {
	r := &ownerRecord{}
	if err := json.Unmarshal(v, r); err != nil {
		return nil, fmt.Errorf("decode owner record: %w", err)
	}
	return r, nil
}

// appendJSONString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD, as
// encoding/json does.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// Family is an IP family.
type Family int

const (
	// IPv4 is the IPv4 family.
	IPv4 Family = 4
	// IPv6 is the IPv6 family.
	IPv6 Family = 6
)

// String returns "IPv4" or "IPv6".
func (f Family) String() string { return "IPv" + strconv.Itoa(int(f)) }

// Policy is a Service's IP family policy.
type Policy int

const (
	// SingleStack allocates one address, of the first requested family or of the
	// primary range.
	SingleStack Policy = iota
	// PreferDualStack allocates one address per configured family.
	PreferDualStack
	// RequireDualStack allocates one IPv4 and one IPv6 address, or nothing.
	RequireDualStack
)

// Request is one Allocate call: for Owner, ClusterIPs (the specific ClusterIPs, or
// one per family as Families and Policy say, or none with NoClusterIP) and NodePorts
// (the specific NodePorts, plus NodePortCount dynamic ones).
type Request struct {
	Owner         Owner
	Families      []Family
	Policy        Policy
	ClusterIPs    []netip.Addr
	NodePorts     []int
	NodePortCount int
	NoClusterIP   bool
	// DryRun validates and checks availability without writing.
	DryRun bool
}

// hash identifies the request for idempotency (DryRun aside): the FNV-1a hash of a
// text form of it. Owner records store it, so the form must never change (a retry
// across an upgrade would otherwise allocate again): TestHashStable pins it.
func (q *Request) hash() string {
	var buf [256]byte // the text form, on the stack for all but long names
	b := strconv.AppendQuote(buf[:0], q.Owner.Namespace)
	b = append(b, ';')
	b = strconv.AppendQuote(b, q.Owner.Name)
	b = append(b, ';')
	for _, f := range q.Families {
		b = strconv.AppendInt(b, int64(f), 10)
		b = append(b, ',')
	}
	b = append(b, ";p"...)
	b = strconv.AppendInt(b, int64(q.Policy), 10)
	b = append(b, ';')
	for _, a := range q.ClusterIPs {
		if a.IsValid() {
			b = a.AppendTo(b)
		} else {
			b = append(b, a.String()...) // "invalid IP", as AppendTo does not write
		}
		b = append(b, ',')
	}
	b = append(b, ';')
	for _, p := range q.NodePorts {
		b = strconv.AppendInt(b, int64(p), 10)
		b = append(b, ',')
	}
	b = append(b, ";n"...)
	b = strconv.AppendInt(b, int64(q.NodePortCount), 10)
	if q.NoClusterIP {
		b = append(b, ";none"...)
	}
	// FNV-1a, 64 bits, as hash/fnv's New64a, without its allocation.
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return strconv.FormatUint(h, 16)
}
