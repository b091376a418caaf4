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
	keep := func(it Item) bool {
		if r == nil {
			return true
		}
		_, ok := r.offset(it)
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
	keep func(Item) bool
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
			if al, ok := pl.a.allocation(kv); ok && pl.keep(al.Item) {
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

func (a *Allocator) listOwner(ctx context.Context, uid string, keep func(Item) bool) (Page, error) {
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
			if al, ok := a.allocation(kv); ok && al.Owner.UID == uid && keep(al.Item) {
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

// ownerChunk is how many owner records one read of listOwners takes: a fixed number,
// whatever the page lacks, so that owners that add nothing to it (tombstones, owners
// with nothing in the range asked for) cost a read per chunk, not one each.
const ownerChunk = 128

// listOwners is ListPage of the owners whose UID starts with prefix: their records in
// key order from the token's place, read ownerChunk at a time, and the allocations each
// record lists (those keep keeps), read at the same revision as the page needs them: a
// batch of the next ones the page lacks (and one more, to know whether a page follows),
// again until the page is full or the records end, so that a page reads about as many
// item keys as it lists. An item listed whose key is another owner's (or free) is left
// out: it is listed under its holder. A token names the owner and the position, in
// its record's list of items (whatever the filter), of the next allocation to list
// ("<owner key>\x00<n>"): a listing that changes its range between pages goes on from
// the same place.
func (a *Allocator) listOwners(ctx context.Context, prefix string, size int, tok string,
	keep func(Item) bool) (Page, error) {
	under := a.ownerKey(prefix)
	rev, after, err := a.parseToken(tok, under)
	if err != nil {
		return Page{}, err
	}
	c := &ownerCursor{a: a, prefix: prefix, key: under, end: clientv3.GetPrefixRangeEnd(under), rev: rev,
		more: true, keep: keep}
	if after != "" {
		last, n, ok := strings.Cut(after, "\x00")
		if c.skip, err = strconv.Atoi(n); !ok || err != nil || c.skip < 0 {
			return Page{}, badrequest.New("page_token", "not a token of this listing")
		}
		c.key, c.skipKey = last, last
	}
	var page Page
	for {
		batch, err := c.take(ctx, size-len(page.Allocations)+1)
		if err != nil {
			return Page{}, err
		}
		if len(batch) == 0 {
			page.Revision = c.rev
			return page, nil
		}
		held, err := a.heldAt(ctx, batch, c.rev)
		if err != nil {
			return Page{}, err
		}
		for i, oi := range batch {
			if held[i] == nil {
				continue
			}
			if len(page.Allocations) == size {
				page.NextPageToken = makeToken(c.rev, oi.owner+"\x00"+strconv.Itoa(oi.pos))
				page.Revision = c.rev
				return page, nil
			}
			page.Allocations = append(page.Allocations, *held[i])
		}
	}
}

// ownerItem is an item an owner record lists: the record's key, the item's position in
// the record's list.
type ownerItem struct {
	owner string
	pos   int
	it    Item
}

// ownerCursor walks, at one revision, the items that the owner records under a prefix
// list (those keep keeps), in the records' key order and each record's order, reading
// the records ownerChunk at a time.
type ownerCursor struct {
	a        *Allocator
	prefix   string // the UID prefix, for errors
	key, end string // the range of records still to read
	rev      int64  // 0 until the first read
	more     bool   // records may follow the chunk
	keep     func(Item) bool
	// skipKey's record is listed from position skip on (a token's place).
	skipKey string
	skip    int
	chunk   []*mvccpb.KeyValue
	items   []Item // chunk[0]'s, from pos on
	pos     int
	loaded  bool // items are chunk[0]'s
}

// take returns the next n items (fewer at the end of the records).
func (c *ownerCursor) take(ctx context.Context, n int) ([]ownerItem, error) {
	var out []ownerItem
	for len(out) < n {
		if len(c.chunk) == 0 {
			if !c.more {
				return out, nil
			}
			if err := c.read(ctx); err != nil {
				return nil, err
			}
			continue
		}
		if !c.loaded {
			c.load()
		}
		if c.pos == len(c.items) {
			c.chunk, c.loaded = c.chunk[1:], false
			continue
		}
		it := c.items[c.pos]
		if c.keep(it) {
			out = append(out, ownerItem{owner: string(c.chunk[0].Key), pos: c.pos, it: it})
		}
		c.pos++
	}
	return out, nil
}

// load makes the first record of the chunk the current one.
func (c *ownerCursor) load() {
	kv := c.chunk[0]
	c.items, c.pos, c.loaded = nil, 0, true
	rec, err := decodeOwnerRecord(kv.Value)
	if err != nil {
		c.a.log.Warn("undecodable owner record", "key", string(kv.Key), "err", err)
		return
	}
	c.items = rec.itemList()
	if string(kv.Key) == c.skipKey {
		c.pos = min(c.skip, len(c.items))
	}
}

// read reads the next chunk of records.
func (c *ownerCursor) read(ctx context.Context) error {
	opts := []clientv3.OpOption{clientv3.WithRange(c.end), clientv3.WithLimit(ownerChunk)}
	if c.rev != 0 {
		opts = append(opts, clientv3.WithRev(c.rev))
	}
	resp, err := c.a.cli.Get(ctx, c.key, opts...)
	if c.a.afterPageRead != nil {
		c.a.afterPageRead()
	}
	if err != nil {
		return fmt.Errorf("list owners under %q: %w", c.prefix, err)
	}
	if c.rev == 0 {
		c.rev = resp.Header.Revision
	}
	c.chunk, c.loaded, c.more = resp.Kvs, false, resp.More && len(resp.Kvs) > 0
	if len(resp.Kvs) > 0 {
		c.key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return nil
}

// heldAt reads, at rev, the allocations of the items of batch: for each, its
// allocation when the owner whose record lists it holds it, else nil.
func (a *Allocator) heldAt(ctx context.Context, batch []ownerItem, rev int64) ([]*Allocation, error) {
	items := make([]Item, len(batch))
	for i, oi := range batch {
		items[i] = oi.it
	}
	_, all, err := a.readItemsAt(ctx, items, rev)
	if err != nil {
		return nil, err
	}
	byItem := make(map[ItemKey]*Allocation, len(all))
	for i := range all {
		byItem[all[i].Item.Key()] = &all[i]
	}
	out := make([]*Allocation, len(batch))
	for i, oi := range batch {
		if al := byItem[oi.it.Key()]; al != nil && a.ownerKey(al.Owner.UID) == oi.owner {
			out[i] = al
		}
	}
	return out, nil
}

// HeldAt returns who held items at etcd revision rev: their allocations then, in the
// order of items, leaving out the free ones and those outside every range. It reads
// maxTxnOps keys a transaction, every one at the same revision, which it returns: rev,
// or, when etcd has compacted rev away, the oldest revision etcd still keeps (what
// changed between the two is unknown to the caller, who must say so).
func (a *Allocator) HeldAt(ctx context.Context, items []Item, rev int64) (int64, []Allocation, error) {
	if rev <= 0 {
		return 0, nil, fmt.Errorf("held at revision %d: not a revision", rev)
	}
	for try := 1; ; try++ {
		_, all, err := a.readItemsAt(ctx, items, rev)
		if !errors.Is(err, rpctypes.ErrCompacted) || try == listTries {
			return rev, all, err
		}
		if rev, err = a.oldestRevision(ctx, rev); err != nil {
			return 0, nil, err
		}
	}
}

// oldestRevision returns the oldest revision etcd keeps, rev having been compacted
// away: the compact revision that a watch from rev is refused with (after its created
// notice, or events, which are skipped).
func (a *Allocator) oldestRevision(ctx context.Context, rev int64) (int64, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range a.cli.Watch(wctx, a.configKey, clientv3.WithRev(rev)) {
		switch {
		case wr.CompactRevision != 0:
			return wr.CompactRevision, nil
		case wr.Err() != nil:
			return 0, fmt.Errorf("oldest revision etcd keeps: %w", wr.Err())
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("oldest revision etcd keeps: %w", err)
	}
	return 0, errors.New("oldest revision etcd keeps: watch closed")
}
