package allocator

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// record reads uid's owner record: nil when there is none.
func record(t *testing.T, cli *clientv3.Client, a *Allocator, uid string) *ownerRecord {
	t.Helper()
	resp, err := cli.Get(etcdtest.Context(t), a.ownerKey(uid))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	rec, err := decodeOwnerRecord(resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// checkHolds fails the test unless o holds exactly items, in etcd's item keys and in
// its record.
func checkHolds(t *testing.T, cli *clientv3.Client, a *Allocator, o Owner, items []Item) {
	t.Helper()
	var want []string
	for _, it := range items {
		want = append(want, a.key(it))
	}
	slices.Sort(want)
	got := heldBy(t, cli, a, o.UID)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("%s holds %v in the item keys; want %v", o.UID, got, want)
	}
	var listed []string
	if rec := record(t, cli, a, o.UID); rec != nil {
		for _, it := range rec.itemList() {
			listed = append(listed, a.key(it))
		}
	}
	slices.Sort(listed)
	if !slices.Equal(listed, want) {
		t.Errorf("%s's record lists %v; want %v", o.UID, listed, want)
	}
}

// give allocates items (specific) to o, in one request, and fails the test if it cannot.
func give(t *testing.T, a *Allocator, o Owner, items ...Item) Request {
	t.Helper()
	req := Request{Owner: o, NoClusterIP: true}
	for _, it := range items {
		if it.Kind == KindClusterIP {
			req.NoClusterIP, req.ClusterIPs = false, append(req.ClusterIPs, it.Addr)
		} else {
			req.NodePorts = append(req.NodePorts, it.Port)
		}
	}
	if len(items) > 0 {
		if _, err := a.Allocate(etcdtest.Context(t), req); err != nil {
			t.Fatalf("Allocate(%+v) = %v", req, err)
		}
	}
	return req
}

// TestTransfer: what moves, what is refused (nothing moved), and what the owners hold
// after, in the item keys and in their records; a retry of a transfer that committed
// moves nothing; the index sees nothing freed or taken.
func TestTransfer(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/24"))
	ctx := etcdtest.Context(t)
	ip := func(s string) Item { return IP(netip.MustParseAddr(s)) }
	manyPorts := func(first, n int) []Item {
		var out []Item
		for p := range n {
			out = append(out, Port(first+p))
		}
		return out
	}
	tests := []struct {
		name          string
		from, to, oth []Item // held before by from, to and another owner
		toTombstone   bool   // to allocated and released everything before
		named         []Item // nil: all of from's
		self          bool   // to is from
		moved         []Item
		err           error // errors.Is; nil: no error
	}{
		{name: "all", from: []Item{ip("10.0.0.20"), Port(30020)},
			moved: []Item{ip("10.0.0.20"), Port(30020)}},
		{name: "some", from: []Item{ip("10.0.0.21"), Port(30021), Port(30022)}, named: []Item{Port(30022)},
			moved: []Item{Port(30022)}},
		{name: "to holds one already", from: []Item{Port(30023)}, to: []Item{Port(30024)},
			named: []Item{Port(30023), Port(30024)}, moved: []Item{Port(30023)}},
		{name: "to has a record", from: []Item{Port(30025)}, to: []Item{ip("10.0.0.25")},
			moved: []Item{Port(30025)}},
		{name: "to is a tombstone", from: []Item{Port(30026)}, toTombstone: true,
			moved: []Item{Port(30026)}},
		{name: "from holds nothing", named: nil},
		{name: "third-party holder", from: []Item{Port(30027)}, oth: []Item{Port(30028)},
			named: []Item{Port(30027), Port(30028)}, err: ErrNotOwner},
		{name: "free item", from: []Item{Port(30029)}, named: []Item{Port(30029), Port(30030)},
			err: ErrNotOwner},
		{name: "from is to", from: []Item{Port(30031)}, self: true, err: ErrInvalid},
		{name: "to would hold too many", from: []Item{Port(30032), Port(30033)},
			to: manyPorts(31000, MaxItems-1), err: ErrInvalid},
		{name: "too many named", from: []Item{Port(30034)}, named: manyPorts(31100, MaxItems+1),
			err: ErrInvalid},
		{name: "named twice", from: []Item{Port(30035)}, named: []Item{Port(30035), Port(30035)},
			err: ErrInvalid},
		{name: "out of range", from: []Item{Port(30036)}, named: []Item{ip("10.9.0.1")}, err: ErrNotInRange},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			from, to := owner(fmt.Sprint("from", i)), owner(fmt.Sprint("to", i))
			oth := owner(fmt.Sprint("o", i))
			if tc.self {
				to = from
			}
			give(t, a, from, tc.from...)
			toReq := give(t, a, to, tc.to...)
			give(t, a, oth, tc.oth...)
			if tc.toTombstone {
				give(t, a, to, Port(30099))
				if _, _, err := a.Release(ctx, to, nil, false); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			free := a.Free(a.idx.portRange.name)
			began := time.Now()
			moved, rev, err := a.Transfer(ctx, from, to, tc.named)
			if !errors.Is(err, tc.err) || !slices.Equal(moved, tc.moved) ||
				(rev != 0) != (len(tc.moved) > 0) {
				t.Fatalf("Transfer(%s, %s, %v) = %v, %d, %v; want %v moved, %v", from.UID, to.UID, tc.named,
					moved, rev, err, tc.moved, tc.err)
			}
			wantFrom, wantTo := tc.from, slices.Concat(tc.to, tc.moved)
			if !tc.self {
				wantFrom = slices.DeleteFunc(slices.Clone(tc.from), func(it Item) bool {
					return slices.Contains(tc.moved, it)
				})
				checkHolds(t, e.Client, a, to, wantTo)
			}
			checkHolds(t, e.Client, a, from, wantFrom)
			checkHolds(t, e.Client, a, oth, tc.oth)
			if len(tc.from) > 0 && len(wantFrom) == 0 {
				checkTombstone(t, e.Client, a, from.UID)
			}
			for _, it := range tc.moved {
				al, err := a.Get(ctx, it)
				if err != nil || al.Owner != to || al.ModRevision != rev || al.AllocateTime.Before(began) {
					t.Errorf("Get(%v) = %+v, %v; want held by %v, written at %d, since the transfer", it, al,
						err, to, rev)
				}
			}
			if err != nil {
				return
			}
			// A retry of a transfer that committed moves nothing.
			again, rev, err := a.Transfer(ctx, from, to, tc.named)
			if err != nil || len(again) > 0 || rev != 0 {
				t.Errorf("Transfer again = %v, %d, %v; want nothing moved, revision 0", again, rev, err)
			}
			// to's last Allocate request still replays: the record keeps it.
			if len(tc.to) > 0 {
				if res, err := a.Allocate(ctx, toReq); err != nil || !res.Replayed {
					t.Errorf("Allocate(%+v) again after the transfer = %+v, %v; want its replay", toReq, res,
						err)
				}
			}
			if err := a.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			if got := a.Free(a.idx.portRange.name); got != free {
				t.Errorf("free node ports after the transfer = %d; want %d (nothing freed or taken)", got,
					free)
			}
		})
	}
}

// TestTransferHolders: repair's holders follow a transfer (through the watch): a claim
// of the new holder is skipped, one of the old holder read.
func TestTransferHolders(t *testing.T) {
	_, a, items, uids := held(t, 4)
	ctx := etcdtest.Context(t)
	checkListExcept(t, a, uids) // seeds the holders
	if _, _, err := a.Transfer(ctx, owner(uids[items[0]]), owner("t0"), nil); err != nil {
		t.Fatal(err)
	}
	old := map[Item]string{items[0]: uids[items[0]]}
	uids[items[0]] = "t0"
	if n := checkListExcept(t, a, uids); n != 1 {
		t.Errorf("ListExcept after the transfer read %d; want only the unclaimed kubernetes address", n)
	}
	if n := checkListExcept(t, a, old); n != len(items)+1 {
		t.Errorf("ListExcept with the old holder's claim read %d; want all %d", n, len(items)+1)
	}
}

// TestTransferRaces: a Transfer and a Release of the same item, or two Transfers of it
// to different owners, each on its own replica (two Allocators on one etcd), at once:
// exactly one wins, the other is refused (*NotOwnerError), and the item is held by the
// winner's owner (or free after the release) in its key and in the records alone.
func TestTransferRaces(t *testing.T) {
	e := etcdtest.New(t)
	cfg := testConfig("10.0.0.0/24")
	a1, a2 := start(t, e.Client, cfg), start(t, e.NewClient(), cfg)
	ctx := etcdtest.Context(t)
	for round := range 24 {
		it := Port(30100 + round)
		from, to, other := owner(fmt.Sprint("f", round)), owner(fmt.Sprint("t", round)),
			owner(fmt.Sprint("u", round))
		give(t, a1, from, it, Port(30200+round))
		release := round%2 == 0
		var wg sync.WaitGroup
		var moved []Item
		var errT, errO error
		var won string // other's win: "released" or other's UID
		wg.Go(func() { moved, _, errT = a1.Transfer(ctx, from, to, []Item{it}) })
		wg.Go(func() {
			if release {
				var freed []Item
				freed, _, errO = a2.Release(ctx, from, []Item{it}, false)
				if len(freed) == 1 {
					won = "released"
				}
				return
			}
			var got []Item
			got, _, errO = a2.Transfer(ctx, from, other, []Item{it})
			if len(got) == 1 {
				won = other.UID
			}
		})
		wg.Wait()
		var ne *NotOwnerError
		switch {
		case errT == nil && len(moved) == 1 && errors.As(errO, &ne) && won == "":
			checkHolds(t, e.Client, a1, to, []Item{it})
		case errO == nil && won != "" && errors.As(errT, &ne) && len(moved) == 0:
			if won == other.UID {
				checkHolds(t, e.Client, a1, other, []Item{it})
			} else if _, err := a1.Get(ctx, it); !errors.Is(err, ErrNotFound) {
				t.Errorf("round %d: %v after its release = %v; want free", round, it, err)
			}
			checkHolds(t, e.Client, a1, to, nil)
		default:
			t.Fatalf("round %d (release: %v): Transfer = %v, %v; the other = %v (%q); want exactly one "+
				"winner, the other refused", round, release, moved, errT, errO, won)
		}
		checkHolds(t, e.Client, a1, from, []Item{Port(30200 + round)})
	}
}

// TestListPageOwnerPrefix: the allocations of the owners whose UID starts with a
// prefix, a page at a time at one revision (an allocation made between pages is not
// seen), in the order of the owners' UIDs and of their records; tombstones and other
// owners are left out; with a range, that range's only. Bad prefixes and tokens of
// another listing are refused.
func TestListPageOwnerPrefix(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/24"))
	ctx := etcdtest.Context(t)
	var want []Item // in the listing's order
	for i, n := range []int{3, 1, 0, 2, 4} {
		o := Owner{Namespace: "ns", Name: "web", UID: fmt.Sprint("admission/", i)}
		var its []Item
		for j := range n {
			its = append(its, Port(30100+10*i+j))
		}
		if i == 4 {
			its[0] = IP(netip.MustParseAddr("10.0.0.40"))
		}
		give(t, a, o, its...)
		if n == 0 { // a tombstone
			give(t, a, o, Port(30199))
			if _, _, err := a.Release(ctx, o, nil, false); err != nil {
				t.Fatal(err)
			}
		}
		want = append(want, its...)
	}
	give(t, a, owner("admission-x"), Port(30300)) // not under "admission/"
	give(t, a, owner("other"), Port(30301))
	list := func(lo ListOptions, between func()) []Item {
		t.Helper()
		var got []Item
		var rev int64
		for pages := 0; ; pages++ {
			page, err := a.ListPage(ctx, lo)
			if err != nil || len(page.Allocations) > lo.PageSize || pages > 20 {
				t.Fatalf("ListPage(%+v) = %+v, %v", lo, page, err)
			}
			if rev != 0 && page.Revision != rev {
				t.Errorf("ListPage(%+v) at revision %d; want %d like the first page", lo, page.Revision, rev)
			}
			rev = page.Revision
			for _, al := range page.Allocations {
				got = append(got, al.Item)
			}
			if lo.PageToken = page.NextPageToken; lo.PageToken == "" {
				return got
			}
			if between != nil {
				between()
				between = nil
			}
		}
	}
	for _, size := range []int{1, 2, 3, 500} {
		got := list(ListOptions{OwnerUIDPrefix: "admission/", PageSize: size}, func() {
			give(t, a, owner("admission/9"), Port(30400+size))
		})
		if !slices.Equal(got, want) {
			t.Errorf("ListPage(prefix admission/, pages of %d) = %v; want %v", size, got, want)
		}
		if _, _, err := a.Release(ctx, owner("admission/9"), nil, false); err != nil {
			t.Fatal(err)
		}
	}
	if got := list(ListOptions{OwnerUIDPrefix: "admission/4", Range: "10.0.0.0/24", PageSize: 5},
		nil); !slices.Equal(got, want[6:7]) {
		t.Errorf("ListPage(prefix admission/4, range 10.0.0.0/24) = %v; want %v", got, want[6:7])
	}
	if got := list(ListOptions{OwnerUIDPrefix: "nobody", PageSize: 5}, nil); len(got) != 0 {
		t.Errorf("ListPage(prefix nobody) = %v; want nothing", got)
	}
	other, err := a.ListPage(ctx, ListOptions{PageSize: 1})
	if err != nil || other.NextPageToken == "" {
		t.Fatalf("ListPage(pages of 1) = %+v, %v", other, err)
	}
	mine, err := a.ListPage(ctx, ListOptions{OwnerUIDPrefix: "admission/", PageSize: 1})
	if err != nil || mine.NextPageToken == "" {
		t.Fatalf("ListPage(prefix admission/, pages of 1) = %+v, %v", mine, err)
	}
	for _, lo := range []ListOptions{
		{OwnerUIDPrefix: "admission/", OwnerUID: "admission/0"},
		{OwnerUIDPrefix: " \t"},
		{OwnerUIDPrefix: "admission/ x"},
		{OwnerUIDPrefix: "admission/", PageToken: other.NextPageToken},
		{OwnerUIDPrefix: "admission/1", PageToken: mine.NextPageToken},
		{PageToken: mine.NextPageToken},
	} {
		if _, err := a.ListPage(ctx, lo); !errors.Is(err, ErrInvalid) {
			t.Errorf("ListPage(%+v) = %v; want ErrInvalid", lo, err)
		}
	}
	// A token whose revision was compacted: list again from the start.
	put, err := e.Client.Put(ctx, "/unrelated", "x")
	if err == nil {
		_, err = e.Client.Compact(ctx, put.Header.Revision)
	}
	if err != nil {
		t.Fatal(err)
	}
	lo := ListOptions{OwnerUIDPrefix: "admission/", PageSize: 1, PageToken: mine.NextPageToken}
	if _, err := a.ListPage(ctx, lo); !errors.Is(err, ErrInvalid) {
		t.Errorf("ListPage(%+v) after a compaction = %v; want ErrInvalid (expired)", lo, err)
	}
}
