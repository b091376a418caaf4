package fault

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/client"
)

// outcome of one operation.
type outcome int

const (
	ok       outcome = iota
	definite         // a code that guarantees nothing changed
	unknown          // it may or may not have taken effect
)

func (o outcome) String() string { return [...]string{"ok", "definite failure", "unknown"}[o] }

// classify maps an error to an outcome: the codes allocd answers before writing
// anything are definite, and so is an error that says nothing was applied (the call
// never reached allocd, or etcd refused the write before proposing it). The checks
// hold allocd to it: a definite failure that took effect is a violation.
func classify(err error) outcome {
	if err == nil {
		return ok
	}
	if !client.OutcomeUnknown(err) {
		return definite
	}
	return unknown
}

// kind of an operation.
type kind string

const (
	opAllocate kind = "Allocate"
	opRetry    kind = "Allocate retry"
	opRelease  kind = "Release"
	opForce    kind = "Release force"
	opTransfer kind = "Transfer"
	opRenew    kind = "Renew"
)

// op is one recorded operation: times are offsets from the run's start, on the
// monotonic clock of this process (the checks never compare clocks of two processes).
type op struct {
	kind  kind
	owner string // owner uid (Allocate, Release; Transfer: from) or lease IP (Renew)
	to    string // Transfer: the owner the items go to
	// items asked for (specific) or, when ok, got; Release: named items, empty = all;
	// Transfer: named items (empty = all of from's) or, when ok, the items moved
	items      []string
	start, end time.Duration
	outcome    outcome
	err        string
	msg        string // the error of a failed call, in full
	replica    int
	asked      []string // Allocate, Transfer: the specific items asked for
	// holder is the holder's uid allocd named: ALREADY_EXISTS, and a Transfer's NOT_OWNER
	// (free: nobody holds refused)
	holder  string
	refused string // a Transfer's NOT_OWNER: the item from does not hold
	free    bool
}

// covers reports whether the Transfer o may have moved item: one it moved when ok,
// one it named (or any, naming none) when its outcome is unknown.
func (o *op) covers(item string) bool {
	switch o.outcome {
	case ok:
		return slices.Contains(o.items, item)
	case unknown:
		return len(o.asked) == 0 || slices.Contains(o.asked, item)
	}
	return false
}

// history collects operations from many goroutines.
type history struct {
	base time.Time
	mu   sync.Mutex
	ops  []op
}

func (h *history) now() time.Duration { return time.Since(h.base) }

// record runs f and records its result; f returns the items it got.
func (h *history) record(o op, f func() ([]string, error)) op {
	o.asked = o.items
	o.start = h.now()
	items, err := f()
	o.end = h.now()
	o.outcome = classify(err)
	var held *client.AlreadyAllocatedError
	if errors.As(err, &held) {
		o.holder = held.HolderUID
	}
	var e *client.Error
	if o.kind == opTransfer && errors.Is(err, client.ErrNotOwner) && errors.As(err, &e) {
		o.refused, o.holder, o.free = itemName(e.Metadata["item"]), e.Metadata["holder_uid"],
			e.Metadata["free"] == "true"
	}
	if err != nil {
		o.err = status.Code(err).String()
		if errors.Is(err, context.DeadlineExceeded) {
			o.err = "DeadlineExceeded"
		}
		if o.outcome != ok {
			o.msg = err.Error()
		}
	}
	if o.outcome == ok && items != nil {
		o.items = items
	}
	h.mu.Lock()
	h.ops = append(h.ops, o)
	h.mu.Unlock()
	return o
}

// itemName is the history's name of an item as allocd names it: "port/30001" for a
// node port, the address for a ClusterIP.
func itemName(s string) string {
	if _, err := strconv.Atoi(s); err == nil {
		return "port/" + s
	}
	return s
}

// violation is one broken promise, in words.
type violation string

// check runs every check over the history and the final state (item → owner uid) and
// returns the violations found.
func (h *history) check(final map[string]string) []violation {
	c := h.checker()
	var out []violation
	for owner, os := range c.byOwner {
		out = append(out, c.owner(owner, os, final)...)
	}
	out = append(out, c.definite(final)...)
	out = append(out, c.twoHolders()...)
	out = append(out, c.transferred(final)...)
	v, _ := c.afterFullRelease(final)
	out = append(out, v...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// checker returns a checker of the operations recorded so far.
func (h *history) checker() *checker {
	h.mu.Lock()
	c := &checker{ops: slices.Clone(h.ops), byOwner: map[string][]op{}, forced: map[string][]op{}}
	h.mu.Unlock()
	for _, o := range c.ops {
		if o.kind != opRenew {
			c.byOwner[o.owner] = append(c.byOwner[o.owner], o)
		}
		if o.kind == opTransfer {
			c.byOwner[o.to] = append(c.byOwner[o.to], o)
		}
		if o.kind == opForce {
			for _, it := range o.items {
				c.forced[it] = append(c.forced[it], o)
			}
		}
	}
	return c
}

// checker holds a history's operations for the checks, by owner too (a Transfer under
// both of its owners), and the forced releases by item (released looks at those alone:
// over every operation, twoHolders took longer than the suite's 30 minutes on a history
// of 5 minutes).
type checker struct {
	ops     []op
	byOwner map[string][]op
	forced  map[string][]op
}

// forever is a time after every operation.
const forever = time.Duration(1 << 62)

// released reports whether a release that may have taken effect covers item of owner
// and may have taken effect in (from, to): it started before to, and ended after from
// or has an unknown outcome (its transaction may commit after the caller gave up:
// etcd commits a proposal a paused leader made once it resumes). A Transfer of the item
// away from owner is a release of it for owner.
func (c *checker) released(owner, item string, from, to time.Duration) bool {
	may := func(o *op) bool {
		return !(o.outcome == definite || o.start >= to || o.outcome == ok && o.end <= from)
	}
	for i := range c.byOwner[owner] {
		o := &c.byOwner[owner][i]
		switch {
		case o.kind == opRelease && may(o) && (len(o.items) == 0 || slices.Contains(o.items, item)):
			return true
		case o.kind == opTransfer && o.owner == owner && may(o) && o.covers(item):
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

func (c *checker) releasedAny(owner string, items []string, from, to time.Duration) bool {
	for _, it := range items {
		if c.released(owner, it, from, to) {
			return true
		}
	}
	return false
}

// owner checks one owner's acknowledgements: a retry answers what was acknowledged
// last, unless a release of it may have taken effect in between (the owner then
// allocates anew); the last acknowledged allocation is held at the end unless a
// release may have taken effect.
func (c *checker) owner(owner string, os []op, final map[string]string) []violation {
	var out []violation
	var acks []op
	for _, o := range os {
		if (o.kind == opAllocate || o.kind == opRetry) && o.outcome == ok {
			acks = append(acks, o)
		}
	}
	sort.Slice(acks, func(i, j int) bool { return acks[i].end < acks[j].end })
	var cur *op
	for i := range acks {
		o := &acks[i]
		switch {
		case cur == nil, slices.Equal(o.items, cur.items), c.releasedAny(owner, cur.items, cur.start, o.end):
			cur = o
		default:
			out = append(out, violation(fmt.Sprintf(
				"owner %s: an Allocate (%v-%v) got %v; %v was acknowledged at %v and never released",
				owner, o.start, o.end, o.items, cur.items, cur.end)))
		}
	}
	if cur != nil {
		for _, it := range cur.items {
			if final[it] != owner && !c.released(owner, it, cur.start, forever) {
				out = append(out, violation(fmt.Sprintf("owner %s: %s acknowledged at %v, held by %q at "+
					"the end, never released", owner, it, cur.end, final[it])))
			}
		}
	}
	return out
}

// gives reports whether o may give items to owner: an Allocate of owner, a Transfer to
// it.
func (o *op) gives(owner string) bool {
	switch o.kind {
	case opAllocate, opRetry:
		return o.owner == owner
	case opTransfer:
		return o.to == owner
	}
	return false
}

// definite finds items held at the end by an owner whose every request that could give
// it items (Allocate, a Transfer to it) failed definitely.
func (c *checker) definite(final map[string]string) []violation {
	var out []violation
	for it, owner := range final {
		os, known := c.byOwner[owner]
		if !known {
			continue // the kubernetes Service's reservation, or an owner of no test
		}
		possible := false
		for _, o := range os {
			if o.gives(owner) && o.outcome != definite {
				possible = true
			}
		}
		if !possible {
			out = append(out, violation(fmt.Sprintf(
				"%s held by %s, whose every Allocate and Transfer to it failed definitely", it, owner)))
		}
	}
	return out
}

// afterFullRelease finds items held at the end by an owner after its last acknowledged
// full release (a Release naming nothing) when no Allocate of that owner, nor Transfer
// to it, may have taken effect after the release began: none ended after it began with
// an outcome other than a definite failure. An Allocate or Transfer whose outcome was
// unknown and that ended before the release began must not land after it (allocd's owner
// tombstones and the epoch). It also returns how many owners' full releases it checked.
func (c *checker) afterFullRelease(final map[string]string) ([]violation, int) {
	held := map[string][]string{}
	for it, owner := range final {
		held[owner] = append(held[owner], it)
	}
	var out []violation
	checked := 0
	for owner, os := range c.byOwner {
		var last *op
		for i := range os {
			o := &os[i]
			if o.kind == opRelease && len(o.items) == 0 && o.outcome == ok &&
				(last == nil || o.end > last.end) {
				last = o
			}
		}
		if last == nil {
			continue
		}
		checked++
		if len(held[owner]) == 0 {
			continue
		}
		later := false
		for _, o := range os {
			if o.gives(owner) && o.outcome != definite && o.end > last.start {
				later = true
			}
		}
		if !later {
			slices.Sort(held[owner])
			out = append(out, violation(fmt.Sprintf("owner %s: holds %v at the end, after its full release "+
				"acknowledged at %v-%v, with no Allocate or Transfer to it after it began",
				owner, held[owner], last.start, last.end)))
		}
	}
	return out, checked
}

// twoHolders finds two owners at once: B's Allocate of an item (or a Transfer of it to
// B) started after A's was acknowledged, and no release of A's item (nor Transfer of it
// away from A) may have taken effect before B's ended.
func (c *checker) twoHolders() []violation {
	type ack struct {
		owner      string
		start, end time.Duration
	}
	holders := map[string][]ack{}
	for _, o := range c.ops {
		switch {
		case (o.kind == opAllocate || o.kind == opRetry) && o.outcome == ok:
			for _, it := range o.items {
				holders[it] = append(holders[it], ack{o.owner, o.start, o.end})
			}
		case o.kind == opTransfer && o.outcome == ok:
			for _, it := range o.items {
				holders[it] = append(holders[it], ack{o.to, o.start, o.end})
			}
		}
	}
	var out []violation
	for it, acks := range holders {
		for _, a := range acks {
			for _, b := range acks {
				if a.owner == b.owner || b.start <= a.end || c.released(a.owner, it, a.start, b.end) {
					continue
				}
				if debugLinear && len(out) == 0 {
					c.dump(a.owner, b.owner, it)
				}
				out = append(out, violation(fmt.Sprintf(
					"%s: held by %s (acknowledged at %v) and given to %s (%v-%v) with no release in between",
					it, a.owner, a.end, b.owner, b.start, b.end)))
			}
		}
	}
	return out
}

// transferred finds items an acknowledged Transfer moved that its to owner does not hold
// at the end, when no release of the item by to (nor Transfer of it away) may have
// taken effect since the Transfer began.
func (c *checker) transferred(final map[string]string) []violation {
	var out []violation
	for _, o := range c.ops {
		if o.kind != opTransfer || o.outcome != ok {
			continue
		}
		for _, it := range o.items {
			if final[it] != o.to && !c.released(o.to, it, o.start, forever) {
				out = append(out, violation(fmt.Sprintf("owner %s: %s transferred to it from %s at %v-%v, "+
					"held by %q at the end, never released", o.to, it, o.owner, o.start, o.end, final[it])))
			}
		}
	}
	return out
}

// dump prints the operations of two owners and the forced releases of item.
func (c *checker) dump(a, b, item string) {
	for _, o := range c.ops {
		if o.owner == a || o.owner == b || o.kind == opForce && slices.Contains(o.items, item) {
			fmt.Printf("DEBUG %s %s %v %v-%v %s %s\n", o.kind, o.owner, o.items, o.start, o.end, o.outcome,
				o.err)
		}
	}
}

// summary prints operations by kind and outcome, and latencies of the ok ones inside
// and outside fault windows.
func (h *history) summary(faults []window) string {
	h.mu.Lock()
	ops := slices.Clone(h.ops)
	h.mu.Unlock()
	counts := map[string]int{}
	var in, outside []time.Duration
	for _, o := range ops {
		counts[fmt.Sprintf("%-14s %s", o.kind, o.outcome)]++
		if o.outcome != ok {
			continue
		}
		lat := o.end - o.start
		if during(faults, o.start, o.end) {
			in = append(in, lat)
		} else {
			outside = append(outside, lat)
		}
	}
	var b strings.Builder
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprintf(&b, "operations: %d\n", len(ops))
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-32s %6d\n", k, counts[k])
	}
	fmt.Fprintf(&b, "ok latency without faults: %s\n", pcts(outside))
	fmt.Fprintf(&b, "ok latency during faults:  %s\n", pcts(in))
	b.WriteString(unknownCauses(ops))
	return b.String()
}

// unknownCauses lists the errors of unknown outcome by message (digits masked), the
// most frequent first: what to work on to cut them.
func unknownCauses(ops []op) string {
	digits := regexp.MustCompile(`[0-9]+`)
	counts := map[string]int{}
	for _, o := range ops {
		if o.outcome == unknown {
			msg := digits.ReplaceAllString(o.msg, "N")
			counts[msg[:min(len(msg), 160)]]++
		}
	}
	msgs := slices.Collect(maps.Keys(counts))
	slices.SortFunc(msgs, func(x, y string) int { return counts[y] - counts[x] })
	var b strings.Builder
	b.WriteString("errors of unknown outcome, most frequent first:\n")
	for _, m := range msgs[:min(len(msgs), 12)] {
		fmt.Fprintf(&b, "  %6d  %s\n", counts[m], m)
	}
	return b.String()
}

func pcts(d []time.Duration) string {
	if len(d) == 0 {
		return "no operations"
	}
	slices.Sort(d)
	p := func(q float64) time.Duration {
		return d[min(len(d)-1, int(q*float64(len(d))))].Round(100 * time.Microsecond)
	}
	return fmt.Sprintf("p50 %v, p99 %v (%d operations)", p(0.5), p(0.99), len(d))
}

// window is a fault's span.
type window struct {
	name       string
	start, end time.Duration
	// etcdLeader: the fault may have changed etcd's leader (a member killed or paused).
	etcdLeader bool
}

func during(ws []window, s, e time.Duration) bool {
	for _, w := range ws {
		if s < w.end && e > w.start {
			return true
		}
	}
	return false
}

// kindOf is a fault's kind: its name without the member or replica it hit.
func kindOf(name string) string {
	f := strings.Fields(name)
	for i, w := range f {
		if strings.HasPrefix(w, "allocd-") || (len(w) == 2 && w[0] == 'm') {
			f[i] = "*"
		}
	}
	return strings.Join(f, " ")
}

// stalls reports, per kind of fault, how long after each fault began an Allocate
// succeeded again: on some replica (first), and on every replica (all; the replica a
// fault hit, killed or cut off from etcd, is left out), over the faults of that kind:
// p50 and max.
func (h *history) stalls(ws []window, replicas int) string {
	h.mu.Lock()
	ops := slices.Clone(h.ops)
	h.mu.Unlock()
	type agg struct {
		first, all []time.Duration
		unknown    int // calls with an unknown outcome that overlap a fault of the kind
		calls      int
	}
	by := map[string]*agg{}
	var kinds []string
	for _, w := range ws {
		// Per replica, the end of its first ok Allocate begun after w.start.
		firstOK := make([]time.Duration, replicas)
		for i := range firstOK {
			firstOK[i] = -1
		}
		for _, o := range ops {
			if (o.kind != opAllocate && o.kind != opRetry) || o.outcome != ok || o.start < w.start ||
				o.replica < 0 || o.replica >= replicas {
				continue
			}
			if d := o.end - w.start; firstOK[o.replica] < 0 || d < firstOK[o.replica] {
				firstOK[o.replica] = d
			}
		}
		first, all, complete := time.Duration(-1), time.Duration(0), true
		for i, d := range firstOK {
			if strings.Contains(w.name, fmt.Sprintf("allocd-%d ", i)) ||
				strings.HasSuffix(w.name, fmt.Sprintf("allocd-%d", i)) {
				continue // the replica the fault hit: killed, or cut off from etcd by design
			}
			if d < 0 {
				complete = false
				continue
			}
			if first < 0 || d < first {
				first = d
			}
			all = max(all, d)
		}
		if os.Getenv("ALLOCD_FAULT_VERBOSE") != "" {
			h.explain(ops, w, firstOK)
		}
		k := kindOf(w.name)
		a := by[k]
		if a == nil {
			a = &agg{}
			by[k] = a
			kinds = append(kinds, k)
		}
		if first >= 0 {
			a.first = append(a.first, first)
		}
		for _, o := range ops {
			if o.kind != opRenew && o.start < w.end && o.end > w.start {
				a.calls++
				if o.outcome == unknown {
					a.unknown++
				}
			}
		}
		if complete {
			a.all = append(a.all, all)
		}
	}
	sort.Strings(kinds)
	var b strings.Builder
	b.WriteString("time from each fault's start to an ok Allocate begun after it (p50 / max over the " +
		"faults of a kind):\n")
	for _, k := range kinds {
		a := by[k]
		fmt.Fprintf(&b, "  %-34s %3d faults  any replica %s  every replica %s  unknown outcomes %d of %d "+
			"calls during them (%.1f %%)\n",
			k, max(len(a.first), len(a.all)), pmax(a.first), pmax(a.all), a.unknown, a.calls,
			100*float64(a.unknown)/float64(max(a.calls, 1)))
	}
	return b.String()
}

func pmax(d []time.Duration) string {
	if len(d) == 0 {
		return "-"
	}
	slices.Sort(d)
	r := func(x time.Duration) time.Duration { return x.Round(10 * time.Millisecond) }
	return fmt.Sprintf("%v / %v", r(d[len(d)/2]), r(d[len(d)-1]))
}

// explain prints, for one fault, each replica's first ok Allocate and the errors of
// the Allocates begun on it before that (ALLOCD_FAULT_VERBOSE).
func (h *history) explain(ops []op, w window, firstOK []time.Duration) {
	for i, d := range firstOK {
		errs := map[string]int{}
		for _, o := range ops {
			if o.replica == i && (o.kind == opAllocate || o.kind == opRetry) && o.outcome != ok &&
				o.start >= w.start && (d < 0 || o.start < w.start+d) {
				e := o.err
				if len(e) > 90 {
					e = e[:90]
				}
				errs[e]++
			}
		}
		fmt.Printf("%-34s replica %d first ok after %v; errors before: %v\n", w.name, i,
			d.Round(10*time.Millisecond), errs)
	}
}
