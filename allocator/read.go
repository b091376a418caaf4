package allocator

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/badrequest"
)

// Get returns who holds it: ErrNotFound when nobody does, ErrNoRange or a
// *NotInRangeError when it cannot be allocated at all.
func (a *Allocator) Get(ctx context.Context, it Item) (Allocation, error) {
	if _, _, err := a.locate(it); err != nil {
		return Allocation{}, err
	}
	resp, err := a.cli.Get(ctx, a.key(it))
	if err != nil {
		return Allocation{}, fmt.Errorf("get %s: %w", it, err)
	}
	if len(resp.Kvs) == 0 {
		return Allocation{}, ErrNotFound
	}
	al, ok := a.allocation(resp.Kvs[0])
	if !ok {
		return Allocation{}, fmt.Errorf("get %s: undecodable allocation", it)
	}
	return al, nil
}

// allocation decodes an item key-value; false for keys that are not allocations of
// the configured ranges.
func (a *Allocator) allocation(kv *mvccpb.KeyValue) (Allocation, bool) {
	it, ok := a.parseKey(kv.Key)
	if !ok {
		return Allocation{}, false
	}
	r, _, err := a.locate(it)
	if err != nil {
		return Allocation{}, false
	}
	o, t, err := decodeItemValue(kv.Value)
	if err != nil {
		a.log.Warn("undecodable allocation", "key", string(kv.Key), "err", err)
	}
	return Allocation{Item: it, Range: r.name, Owner: o, AllocateTime: t,
		CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision}, true
}

// List reads every allocation at one revision and returns that revision. Each
// prefix is streamed (etcd's RangeStream: chunks of one revision, the server walking
// the range once); against a server without RangeStream (etcd before 3.7, the
// in-process client) it reads pages of listPageSize keys, at the first page's
// revision.
func (a *Allocator) List(ctx context.Context) (int64, []Allocation, error) {
	var n uint64
	for _, r := range a.tab.Load().all {
		used, _ := r.Counts()
		n += used
	}
	all := make([]Allocation, 0, n+n/64+64) // the index's count, and some room
	rev, err := a.listing(ctx, func() { all = all[:0] },
		func(kvs []*mvccpb.KeyValue, d *listDecoder) { all = a.decodeAll(all, kvs, d) })
	if err != nil {
		return 0, nil, err
	}
	return rev, all, nil
}

// listTries bounds List's reads again from a new revision after a compaction.
const listTries = 3

// listing reads every item key at one revision, a chunk at a time to each (with one
// decoder for the whole listing), and returns that revision. When the revision is
// compacted before the last chunk, it reads again at a new one (begin runs before each
// try): the caller wants one consistent view, not that revision.
func (a *Allocator) listing(ctx context.Context, begin func(),
	each func(kvs []*mvccpb.KeyValue, d *listDecoder)) (int64, error) {
	var err error
	for range listTries {
		begin()
		var rev int64
		if rev, err = a.listAt(ctx, each); !errors.Is(err, rpctypes.ErrCompacted) {
			return rev, err
		}
	}
	return 0, err
}

// listAt is one try of listing.
func (a *Allocator) listAt(ctx context.Context, each func(kvs []*mvccpb.KeyValue, d *listDecoder)) (
	int64, error) {
	var d listDecoder
	var rev int64
	for _, prefix := range []string{a.ipPrefix, a.portPrefix} {
		r, err := a.scan(ctx, prefix, rev, func(kvs []*mvccpb.KeyValue) { each(kvs, &d) })
		if a.afterPageRead != nil {
			a.afterPageRead()
		}
		if err != nil {
			// RangeStream's errors come as gRPC statuses: as the etcd client's, so that
			// listing sees a compaction.
			return 0, fmt.Errorf("list allocations: %w", rpctypes.Error(err))
		}
		if rev == 0 {
			rev = r
		}
	}
	return rev, nil
}

// listDecoder decodes the item key-values of List a chunk at a time: the keys of a
// chunk are parsed from one string, and the owner strings of a chunk share one
// allocation.
type listDecoder struct {
	keys, strs []byte
	items      []listItem
}

type listItem struct {
	kind              Kind
	key               [2]int32 // offsets in keys
	owner             [4]int32 // namespace, name and uid end at owner[1:] in strs
	at                time.Time
	createRev, modRev int64
}

// notOwnForm is the line of an item key not in its own form (ownForm).
const notOwnForm = "allocation under a key not in its own form; ignored"

// decodeAll appends the allocations of kvs to all.
func (a *Allocator) decodeAll(all []Allocation, kvs []*mvccpb.KeyValue, d *listDecoder) []Allocation {
	d.keys, d.strs, d.items = d.keys[:0], d.strs[:0], d.items[:0]
	for _, kv := range kvs {
		li := listItem{createRev: kv.CreateRevision, modRev: kv.ModRevision}
		k := kv.Key
		switch {
		case len(k) > len(a.ipPrefix) && string(k[:len(a.ipPrefix)]) == a.ipPrefix:
			li.kind, k = KindClusterIP, k[len(a.ipPrefix):]
		case len(k) > len(a.portPrefix) && string(k[:len(a.portPrefix)]) == a.portPrefix:
			li.kind, k = KindNodePort, k[len(a.portPrefix):]
		default:
			a.log.Warn("allocation outside the configured ranges", "key", string(kv.Key))
			continue
		}
		li.key[0] = int32(len(d.keys))
		d.keys = append(d.keys, k...)
		li.key[1] = int32(len(d.keys))
		li.owner[0] = int32(len(d.strs))
		if f, t, ok := scanItemValue(kv.Value); ok {
			d.strs = append(d.strs, kv.Value[f[0]:f[1]]...)
			li.owner[1] = int32(len(d.strs))
			d.strs = append(d.strs, kv.Value[f[2]:f[3]]...)
			li.owner[2] = int32(len(d.strs))
			d.strs = append(d.strs, kv.Value[f[4]:f[5]]...)
			li.owner[3] = int32(len(d.strs))
			li.at = t
		} else {
			o, t, err := decodeItemValueJSON(kv.Value)
			if err != nil {
				a.log.Warn("undecodable allocation", "key", string(kv.Key), "err", err)
			}
			d.strs = append(d.strs, o.Namespace...)
			li.owner[1] = int32(len(d.strs))
			d.strs = append(d.strs, o.Name...)
			li.owner[2] = int32(len(d.strs))
			d.strs = append(d.strs, o.UID...)
			li.owner[3] = int32(len(d.strs))
			li.at = t
		}
		d.items = append(d.items, li)
	}
	keys, strs := string(d.keys), string(d.strs)
	for _, li := range d.items {
		k := keys[li.key[0]:li.key[1]]
		var it Item
		if li.kind == KindClusterIP {
			addr, err := netip.ParseAddr(k)
			if err != nil {
				a.log.Warn("allocation outside the configured ranges", "key", a.ipPrefix+k)
				continue
			}
			if it = IP(addr); !ownForm(it, k) {
				a.log.Warn(notOwnForm, "key", a.ipPrefix+k)
				continue
			}
		} else {
			p, err := strconv.Atoi(k)
			if err != nil {
				a.log.Warn("allocation outside the configured ranges", "key", a.portPrefix+k)
				continue
			}
			if it = Port(p); !ownForm(it, k) {
				a.log.Warn(notOwnForm, "key", a.portPrefix+k)
				continue
			}
		}
		r, _, err := a.locate(it)
		if err != nil {
			a.log.Warn("allocation outside the configured ranges", "key", a.key(it))
			continue
		}
		all = append(all, Allocation{Item: it, Range: r.name,
			Owner: Owner{Namespace: strs[li.owner[0]:li.owner[1]], Name: strs[li.owner[1]:li.owner[2]],
				UID: strs[li.owner[2]:li.owner[3]]},
			AllocateTime: li.at, CreateRevision: li.createRev, ModRevision: li.modRev})
	}
	return all
}

// ListOptions filters and pages ListPage.
type ListOptions struct {
	// Range keeps the allocations of the range of that name only.
	Range string
	// OwnerUID keeps the allocations of that owner only (one page, at most MaxItems).
	OwnerUID string
	// OwnerUIDPrefix keeps the allocations of the owners whose UID starts with it, read
	// from their records (not with OwnerUID; "" lists every owner's).
	OwnerUIDPrefix string
	// PageSize is the most allocations returned; 0 means 500, at most 5000.
	PageSize int
	// PageToken continues from the NextPageToken of the previous page.
	PageToken string
}

// Page is one page of allocations, read at Revision.
type Page struct {
	Allocations   []Allocation
	NextPageToken string
	Revision      int64
}

// ListPage lists allocations a page at a time; every page of one listing is read at
// the first page's revision. A token whose revision was compacted away, or that does
// not parse, is an *InvalidError. With OwnerUIDPrefix, the owners are listed in the
// order of their UIDs, each with its allocations in the order of its record.
func (a *Allocator) ListPage(ctx context.Context, lo ListOptions) (Page, error) {
	size := lo.PageSize
	switch {
	case size < 0:
		return Page{}, badrequest.New("page_size", "must not be negative")
	case size == 0:
		size = 500
	case size > 5000:
		size = 5000
	}
	var r *rng
	if lo.Range != "" {
		for _, x := range a.tab.Load().all {
			if x.name == lo.Range {
				r = x
			}
		}
		if r == nil {
			return Page{}, badrequest.New("range",
				fmt.Sprintf("no range %q; ranges are %s", lo.Range, strings.Join(a.rangeNames(), ", ")))
		}
	}
	// An address in overlapping ranges is listed under each of them.
	keep := func(al Allocation) bool {
		if r == nil {
			return true
		}
		_, ok := r.offset(al.Item)
		return ok
	}
	if lo.OwnerUIDPrefix != "" {
		if err := checkUIDPrefix(lo); err != nil {
			return Page{}, err
		}
		return a.listPaged(lo.PageToken, func() (Page, error) {
			return a.listOwners(ctx, lo.OwnerUIDPrefix, size, lo.PageToken, keep)
		})
	}
	if lo.OwnerUID != "" {
		return a.listOwner(ctx, lo.OwnerUID, keep)
	}
	rev, after, err := a.parseToken(lo.PageToken, a.ipPrefix, a.portPrefix)
	if err != nil {
		return Page{}, err
	}
	prefixes := []string{a.ipPrefix, a.portPrefix}
	if r != nil && r.kind == KindClusterIP {
		prefixes = prefixes[:1]
	} else if r != nil {
		prefixes = prefixes[1:]
	}
	return a.listPaged(lo.PageToken, func() (Page, error) {
		return a.fillPage(ctx, pageList{a: a, size: size, rev: rev, keep: keep}, prefixes, after)
	})
}

// listPaged returns the page fill reads. A first page (no token) whose revision was
// compacted while it was read is read again at a new one; a token's that was is an
// *InvalidError.
func (a *Allocator) listPaged(token string, fill func() (Page, error)) (Page, error) {
	for try := 1; ; try++ {
		page, err := fill()
		switch {
		case !errors.Is(err, rpctypes.ErrCompacted):
			return page, err
		case token != "":
			return Page{}, badrequest.New("page_token",
				"expired: its revision was compacted; list again from the start")
		case try == listTries:
			return Page{}, fmt.Errorf("list allocations: %w", err)
		}
	}
}

// checkUIDPrefix refuses an OwnerUIDPrefix that no owner's UID can start with (blank,
// or with a character CheckUID refuses), or that comes with OwnerUID.
func checkUIDPrefix(lo ListOptions) error {
	p := lo.OwnerUIDPrefix
	if lo.OwnerUID != "" {
		return badrequest.New("owner_uid_prefix", "not with owner_uid: give one of the two")
	}
	if strings.TrimSpace(p) == "" {
		return badrequest.New("owner_uid_prefix", "blank; give at least one character of the uids")
	}
	if !utf8.ValidString(p) {
		return badrequest.New("owner_uid_prefix", "not valid UTF-8")
	}
	for _, c := range p {
		if !unicode.IsPrint(c) || unicode.IsSpace(c) {
			return badrequest.New("owner_uid_prefix", fmt.Sprintf("contains %q, which no owner uid has", c))
		}
	}
	return nil
}

// fillPage fills pl's page from prefixes, after the key after.
func (a *Allocator) fillPage(ctx context.Context, pl pageList, prefixes []string,
	after string) (Page, error) {
	for i, prefix := range prefixes {
		full, err := pl.prefix(ctx, prefix, after, i == len(prefixes)-1)
		if err != nil {
			return Page{}, err
		}
		if full {
			return pl.page, nil
		}
	}
	pl.page.Revision = pl.rev
	return pl.page, nil
}

// pageList is one ListPage in progress: the page so far, at rev (0: not read yet).
type pageList struct {
	a    *Allocator
	size int
	rev  int64
	keep func(Allocation) bool
	page Page
}

// prefix adds the allocations under prefix after the key after ("" for all) to the
// page, and reports whether the page is full and ends the listing (with a token when
// more may follow: more keys, or a prefix after this, the last one or not).
func (pl *pageList) prefix(ctx context.Context, prefix, after string, last bool) (bool, error) {
	end := clientv3.GetPrefixRangeEnd(prefix)
	key := prefix
	if after != "" {
		if after >= end {
			return false, nil
		}
		if after >= prefix {
			key = after + "\x00"
		}
	}
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end),
			clientv3.WithLimit(int64(pl.size - len(pl.page.Allocations)))}
		if pl.rev != 0 {
			opts = append(opts, clientv3.WithRev(pl.rev))
		}
		resp, err := pl.a.cli.Get(ctx, key, opts...)
		if pl.a.afterPageRead != nil {
			pl.a.afterPageRead()
		}
		if errors.Is(err, rpctypes.ErrCompacted) {
			return true, err // ListPage tells whose revision it was
		}
		if err != nil {
			return true, fmt.Errorf("list allocations: %w", err)
		}
		if pl.rev == 0 {
			pl.rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			if al, ok := pl.a.allocation(kv); ok && pl.keep(al) {
				pl.page.Allocations = append(pl.page.Allocations, al)
			}
		}
		if len(resp.Kvs) > 0 {
			key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
		if len(pl.page.Allocations) >= pl.size && (resp.More || !last) {
			pl.page.NextPageToken = makeToken(pl.rev, key[:len(key)-1])
			pl.page.Revision = pl.rev
			return true, nil
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return false, nil
		}
	}
}

func (a *Allocator) listOwner(ctx context.Context, uid string, keep func(Allocation) bool) (Page, error) {
	recs, err := a.readRecords(ctx, []string{uid}, 0)
	if err != nil {
		return Page{}, err
	}
	st := recs[uid]
	if st.rec == nil {
		rev := a.progress.Rev()
		return Page{Revision: rev}, nil
	}
	var gets []clientv3.Op
	for _, ip := range st.rec.ClusterIPs {
		gets = append(gets, clientv3.OpGet(a.key(IP(ip))))
	}
	for _, p := range st.rec.NodePorts {
		gets = append(gets, clientv3.OpGet(a.key(Port(p))))
	}
	resp, err := a.cli.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return Page{}, fmt.Errorf("list allocations of %s: %w", uid, err)
	}
	page := Page{Revision: resp.Header.Revision}
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			if al, ok := a.allocation(kv); ok && al.Owner.UID == uid && keep(al) {
				page.Allocations = append(page.Allocations, al)
			}
		}
	}
	return page, nil
}

// Band is the static (lower) or dynamic (upper) part of a range.
type Band struct {
	// First and Last are the band's first and last items (zero Items when Size is 0).
	First, Last Item
	Size, Used  uint64
}

// RangeInfo describes a configured range and its use, as the index sees it.
type RangeInfo struct {
	Name string
	Kind Kind
	// Prefix is the CIDR of a ClusterIP range.
	Prefix netip.Prefix
	// Ports is the NodePort range.
	Ports PortRange
	// Primary is the range of the kubernetes Service's address.
	Primary bool
	// State is a ClusterIP range's: ready when a ready ServiceCIDR lists it.
	State CIDRState
	// ServiceCIDRs are the names of the ServiceCIDRs that list a ClusterIP range.
	ServiceCIDRs []string
	// Size is the number of allocatable items.
	Size, Used      uint64
	Static, Dynamic Band
}

// Ranges describes every range: ClusterIP ranges (ready ones in allocation order,
// then terminating ones), then NodePorts.
func (a *Allocator) Ranges() []RangeInfo {
	t := a.tab.Load()
	out := make([]RangeInfo, 0, len(t.all))
	for _, r := range t.all {
		used, su := r.Counts()
		ri := RangeInfo{Name: r.name, Kind: r.kind, Prefix: r.span.prefix, Ports: r.ports,
			Size: r.Size(), Used: used,
			Static:  Band{Size: r.Band(), Used: su},
			Dynamic: Band{Size: r.Size() - r.Band(), Used: used - su}}
		if r.Band() > 0 {
			ri.Static.First, ri.Static.Last = r.item(0), r.item(r.Band()-1)
		}
		if r.Size() > r.Band() {
			ri.Dynamic.First, ri.Dynamic.Last = r.item(r.Band()), r.item(r.Size()-1)
		}
		if r.kind == KindClusterIP {
			home, _ := t.home(a.kubeIP)
			ri.Primary = r == home
			ri.State = CIDRTerminating
			if r.guard != nil {
				ri.State = CIDRReady
			}
			for _, ref := range r.refs {
				ri.ServiceCIDRs = append(ri.ServiceCIDRs, ref.name)
			}
		}
		out = append(out, ri)
	}
	return out
}

// ownerChunk bounds the owner records that one read of listOwners takes.
const ownerChunk = 512

// listOwners is ListPage of the owners whose UID starts with prefix: their records in
// key order from the token's place, read a chunk at a time, then the allocations each
// record lists, read at the same revision (an item listed whose key is another owner's
// is left out: it is listed under that owner). A token names the owner to go on from
// and how many of its allocations the pages before took ("<owner key>\x00<n>").
func (a *Allocator) listOwners(ctx context.Context, prefix string, size int, tok string,
	keep func(Allocation) bool) (Page, error) {
	under := a.ownerKey(prefix)
	rev, after, err := a.parseToken(tok, under)
	if err != nil {
		return Page{}, err
	}
	key, skip := under, 0
	if after != "" {
		last, n, ok := strings.Cut(after, "\x00")
		if skip, err = strconv.Atoi(n); !ok || err != nil || skip < 0 {
			return Page{}, badrequest.New("page_token", "not a token of this listing")
		}
		key = last
	}
	end := clientv3.GetPrefixRangeEnd(under)
	var page Page
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end),
			clientv3.WithLimit(int64(min(ownerChunk, size-len(page.Allocations)+1)))}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := a.cli.Get(ctx, key, opts...)
		if a.afterPageRead != nil {
			a.afterPageRead()
		}
		if err != nil {
			return Page{}, fmt.Errorf("list owners under %q: %w", prefix, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		held, err := a.ownersHold(ctx, resp.Kvs, rev, keep)
		if err != nil {
			return Page{}, err
		}
		for i, kv := range resp.Kvs {
			for n := skip; n < len(held[i]); n++ {
				if len(page.Allocations) == size {
					return Page{Allocations: page.Allocations, Revision: rev,
						NextPageToken: makeToken(rev, string(kv.Key)+"\x00"+strconv.Itoa(n))}, nil
				}
				page.Allocations = append(page.Allocations, held[i][n])
			}
			skip = 0
		}
		if !resp.More || len(resp.Kvs) == 0 {
			page.Revision = rev
			return page, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// ownersHold reads, at rev, the allocations that the owner records kvs list: for each
// record, those that its owner holds and keep keeps, in the record's order.
func (a *Allocator) ownersHold(ctx context.Context, kvs []*mvccpb.KeyValue, rev int64,
	keep func(Allocation) bool) ([][]Allocation, error) {
	recs := make([]*ownerRecord, len(kvs))
	var items []Item
	for i, kv := range kvs {
		rec, err := decodeOwnerRecord(kv.Value)
		if err != nil {
			a.log.Warn("undecodable owner record", "key", string(kv.Key), "err", err)
			continue
		}
		recs[i] = rec
		items = append(items, rec.itemList()...)
	}
	if len(items) == 0 {
		return make([][]Allocation, len(kvs)), nil
	}
	_, all, err := a.readItemsAt(ctx, items, rev)
	if err != nil {
		return nil, err
	}
	byItem := make(map[ItemKey]Allocation, len(all))
	for _, al := range all {
		byItem[al.Item.Key()] = al
	}
	out := make([][]Allocation, len(kvs))
	for i, kv := range kvs {
		if recs[i] == nil {
			continue
		}
		uid := strings.TrimPrefix(string(kv.Key), a.ownerPrefix)
		for _, it := range recs[i].itemList() {
			if al, ok := byItem[it.Key()]; ok && al.Owner.UID == uid && keep(al) {
				out[i] = append(out[i], al)
			}
		}
	}
	return out, nil
}
