package allocator

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/badrequest"
)

// The reads of the API: one allocation (Get), pages of them (ListPage: every one, a
// range's, an owner's, or those of the owners of a UID prefix), the ranges' use.

// Get returns who holds it: ErrNotFound when nobody does, ErrNoRange or a
// *NotInRangeError when it cannot be allocated at all.
func (a *Allocator) Get(ctx context.Context, it Item) (Allocation, error) {
	if _, _, err := a.idx.locate(it); err != nil {
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
		for _, x := range a.idx.tab.Load().all {
			if x.name == lo.Range {
				r = x
			}
		}
		if r == nil {
			return Page{}, badrequest.New("range",
				fmt.Sprintf("no range %q; ranges are %s", lo.Range, strings.Join(a.idx.rangeNames(), ", ")))
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
		rev := a.idx.progress.Rev()
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

// Ranges describes every range: ClusterIP ranges (ready ones in allocation order,
// then terminating ones), then NodePorts.
func (a *Allocator) Ranges() []RangeInfo {
	t := a.idx.tab.Load()
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
