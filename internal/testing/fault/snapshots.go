package fault

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// snapshot is a listing, taken during the run, of the allocations of the owners whose
// UID starts with prefix, every page at one etcd revision.
type snapshot struct {
	prefix     string
	rev        int64
	start, end time.Duration
	held       map[string]string // item → owner uid
}

// snap records a listing taken during the run.
func (h *history) snap(s snapshot) {
	h.mu.Lock()
	h.snaps = append(h.snaps, s)
	h.mu.Unlock()
}

// atomic finds acknowledged Transfers that a listing taken during the run shows in
// part. A Transfer answered at revision R moved its items in one transaction: a listing
// at a revision S >= R shows each of them held by to, and one at S < R none of them
// (they were from's at R-1), unless an operation that takes the item from to may have
// committed in between: an acknowledged one at a revision in (R, S] (or (S, R)), or one
// of unknown outcome begun before the later of the two calls ended. It also returns how
// many (Transfer, listing) pairs it checked.
func (c *checker) atomic() ([]violation, int) {
	byPrefix := map[string][]*snapshot{}
	for i := range c.snaps {
		s := &c.snaps[i]
		byPrefix[s.prefix] = append(byPrefix[s.prefix], s)
	}
	var out []violation
	checked := 0
	for i := range c.ops {
		o := &c.ops[i]
		if o.kind != opTransfer || o.outcome != ok || o.rev == 0 || len(o.items) == 0 {
			continue
		}
		for p, ss := range byPrefix {
			if !strings.HasPrefix(o.owner, p) || !strings.HasPrefix(o.to, p) {
				continue
			}
			for _, s := range ss {
				checked++
				if v, bad := c.partly(o, s); bad {
					out = append(out, v)
				}
			}
		}
	}
	return out, checked
}

// transfersAt is how many acknowledged Transfers moved items at a revision: those the
// atomicity check holds the listings against.
func (c *checker) transfersAt() int {
	n := 0
	for _, o := range c.ops {
		if o.kind == opTransfer && o.outcome == ok && o.rev != 0 && len(o.items) > 0 {
			n++
		}
	}
	return n
}

// partly reports whether the listing s shows the Transfer o in part, and says how.
func (c *checker) partly(o *op, s *snapshot) (violation, bool) {
	var moved, not []string
	for _, it := range o.items {
		at := s.held[it] == o.to
		switch {
		case s.rev >= o.rev && !at && !c.mayLose(o.to, it, o.rev, s.rev, s.end):
			not = append(not, it)
		case s.rev < o.rev && at && !c.mayLose(o.to, it, s.rev, o.rev-1, o.end):
			moved = append(moved, it)
		default:
			continue
		}
	}
	switch {
	case len(not) > 0:
		return violation(fmt.Sprintf("transfer %s→%s of %v at revision %d (%v-%v): the listing of %q at "+
			"revision %d shows %v not held by %s, and nothing took them from it since", o.owner, o.to,
			o.items, o.rev, o.start, o.end, s.prefix, s.rev, not, o.to)), true
	case len(moved) > 0:
		return violation(fmt.Sprintf("transfer %s→%s of %v at revision %d (%v-%v): the listing of %q at "+
			"revision %d, before it, shows %v held by %s already, and nothing took them from it before the "+
			"transfer", o.owner, o.to, o.items, o.rev, o.start, o.end, s.prefix, s.rev, moved, o.to)), true
	}
	return "", false
}

// mayLose reports whether an operation that takes item from owner (its Release of the
// item or of everything, its Transfer of the item away, a forced release of the item)
// may have committed at a revision in (lo, hi]: acknowledged at such a revision, or of
// unknown outcome and begun before by.
func (c *checker) mayLose(owner, item string, lo, hi int64, by time.Duration) bool {
	may := func(o *op) bool {
		switch o.outcome {
		case ok:
			return o.rev > lo && o.rev <= hi
		case unknown:
			return o.start < by
		}
		return false
	}
	for i := range c.byOwner[owner] {
		o := &c.byOwner[owner][i]
		switch {
		case o.kind == opRelease && o.owner == owner && (len(o.items) == 0 || slices.Contains(o.items, item)):
		case o.kind == opTransfer && o.owner == owner && (o.outcome == unknown && len(o.asked) == 0 ||
			slices.Contains(o.asked, item) || slices.Contains(o.items, item)):
		default:
			continue
		}
		if may(o) {
			return true
		}
	}
	for i := range c.forced[item] {
		if may(&c.forced[item][i]) {
			return true
		}
	}
	return false
}

// ownerState is what etcd holds at one revision: the items each owner record lists
// (tombstones list none) and the owner each item key names.
type ownerState struct {
	rev     int64
	records map[string][]string // owner uid → items
	keys    map[string]string   // item → owner uid
}

// readOwnerState reads the owner records and the item keys under allocd's etcd prefix
// at one revision.
func readOwnerState(ctx context.Context, cli *clientv3.Client, prefix string) (ownerState, error) {
	st := ownerState{records: map[string][]string{}, keys: map[string]string{}}
	resp, err := cli.Get(ctx, prefix+"/owners/", clientv3.WithPrefix())
	if err != nil {
		return st, fmt.Errorf("read the owner records: %w", err)
	}
	st.rev = resp.Header.Revision
	for _, kv := range resp.Kvs {
		var rec struct {
			UID        string   `json:"uid"`
			ClusterIPs []string `json:"clusterIPs"`
			NodePorts  []int    `json:"nodePorts"`
		}
		if err := json.Unmarshal(kv.Value, &rec); err != nil {
			return st, fmt.Errorf("owner record %s: %w", kv.Key, err)
		}
		items := slices.Clone(rec.ClusterIPs)
		for _, p := range rec.NodePorts {
			items = append(items, "port/"+strconv.Itoa(p))
		}
		st.records[strings.TrimPrefix(string(kv.Key), prefix+"/owners/")] = items
	}
	for _, kind := range []string{"/clusterips/", "/nodeports/"} {
		resp, err := cli.Get(ctx, prefix+kind, clientv3.WithPrefix(), clientv3.WithRev(st.rev))
		if err != nil {
			return st, fmt.Errorf("read the item keys: %w", err)
		}
		for _, kv := range resp.Kvs {
			var v struct {
				UID string `json:"uid"`
			}
			if err := json.Unmarshal(kv.Value, &v); err != nil {
				return st, fmt.Errorf("item key %s: %w", kv.Key, err)
			}
			it := strings.TrimPrefix(string(kv.Key), prefix+kind)
			if kind == "/nodeports/" {
				it = "port/" + it
			}
			st.keys[it] = v.UID
		}
	}
	return st, nil
}

// mismatches finds where the owner records and the item keys disagree: an item a record
// lists whose key names another owner or is absent, an item key whose owner's record
// does not list it. They are written in one transaction, so they never disagree.
func (st ownerState) mismatches() []violation {
	var out []violation
	for uid, items := range st.records {
		for _, it := range items {
			if holder, ok := st.keys[it]; !ok || holder != uid {
				out = append(out, violation(fmt.Sprintf("revision %d: %s's owner record lists %s, whose key "+
					"names %q", st.rev, uid, it, holder)))
			}
		}
	}
	for it, uid := range st.keys {
		if !slices.Contains(st.records[uid], it) {
			out = append(out, violation(fmt.Sprintf("revision %d: the key of %s names %s, whose owner "+
				"record (%v) does not list it", st.rev, it, uid, st.records[uid])))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
