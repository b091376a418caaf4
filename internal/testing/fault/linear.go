package fault

import (
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The allocation register of one item (an address or a port): its state is the uid
// of its holder, "" when free. Every operation of the history that touches the item,
// or may have, becomes an operation on its register; porcupine decides whether some
// order of them, each at an instant inside its call, explains every answer.

// regOp is an operation on one item's register.
type regOp struct {
	// kind: acq, held, mayAcq, rel, mayRel, force, mayForce, read; of a Transfer: move,
	// mayMove, notHeld (from did not hold it), notMine (refused: neither from nor to holds
	// it)
	kind string
	// owner is the requester (acq, held, mayAcq, rel, mayRel; a Transfer's from) or the
	// holder read
	owner string
	to    string // a Transfer's to
	// holder is the holder allocd named (held, notMine), "" when it named none; free:
	// notMine said nobody holds it
	holder string
	free   bool
}

func (o regOp) String() string {
	switch o.kind {
	case "held":
		return fmt.Sprintf("held(%s by %q)", o.owner, o.holder)
	case "force", "mayForce":
		return o.kind
	case "move", "mayMove":
		return fmt.Sprintf("%s(%s to %s)", o.kind, o.owner, o.to)
	case "notMine":
		return fmt.Sprintf("notMine(%s, %s; held by %q, free %v)", o.owner, o.to, o.holder, o.free)
	}
	return fmt.Sprintf("%s(%s)", o.kind, o.owner)
}

// registerModel is the sequential specification. An Allocate acknowledged without the
// item says nothing of it: an owner may hold items of earlier requests (Allocate adds to
// what an owner holds; a retry after a forced release of part of its answer allocates
// anew and keeps the rest). Operations whose outcome is unknown
// may or may not take effect: the model is nondeterministic.
var registerModel = porcupine.NondeterministicModel{
	Init: func() []interface{} { return []interface{}{""} },
	Step: func(state, input, _ interface{}) []interface{} {
		s, o := state.(string), input.(regOp)
		switch o.kind {
		case "acq": // an Allocate acknowledged with the item
			if s == "" || s == o.owner {
				return []interface{}{o.owner}
			}
		case "held": // ALREADY_EXISTS for the item
			if s != "" && s != o.owner && (o.holder == "" || s == o.holder) {
				return []interface{}{s}
			}
		case "mayAcq":
			if s == "" || s == o.owner {
				return []interface{}{s, o.owner}
			}
			return []interface{}{s}
		case "rel": // the owner released everything it holds
			if s == o.owner {
				return []interface{}{""}
			}
			return []interface{}{s}
		case "mayRel":
			if s == o.owner {
				return []interface{}{s, ""}
			}
			return []interface{}{s}
		case "force":
			return []interface{}{""}
		case "mayForce":
			return []interface{}{s, ""}
		case "read":
			if s == o.owner {
				return []interface{}{s}
			}
		default:
			return transferStep(s, o)
		}
		return nil
	},
	DescribeOperation: func(input, _ interface{}) string { return input.(regOp).String() },
}

// transferStep is registerModel's step of a Transfer's operations: an item moves from
// from to to in one step, never through free; a retry that finds it with to moves
// nothing (a read of to).
func transferStep(s string, o regOp) []interface{} {
	switch o.kind {
	case "move": // acknowledged, the item among those moved
		if s == o.owner {
			return []interface{}{o.to}
		}
	case "mayMove":
		if s == o.owner {
			return []interface{}{s, o.to}
		}
		return []interface{}{s}
	case "notHeld": // acknowledged, of everything from held: not this item
		if s != o.owner {
			return []interface{}{s}
		}
	case "notMine": // refused (NOT_OWNER) for this item: nothing moved
		named := o.free && s == "" || !o.free && s != "" && (o.holder == "" || s == o.holder)
		if s != o.owner && s != o.to && named {
			return []interface{}{s}
		}
	}
	return nil
}

var debugLinear = os.Getenv("ALLOCD_FAULT_DEBUG") != ""

// linearizable checks every item's register and returns the items whose history no
// order explains, and how many items the checker could not decide within the time
// given to each (or at all, once total has passed).
func (h *history) linearizable(final map[string]string, perItem,
	total time.Duration) (illegal []string, undecided, checked int) {
	began := time.Now()
	h.mu.Lock()
	ops := slices.Clone(h.ops)
	h.mu.Unlock()
	related := relatedOwners(ops, final)
	items := make([]string, 0, len(related))
	for it := range related {
		items = append(items, it)
	}
	sort.Strings(items)
	model := registerModel.ToModel()
	for _, it := range items {
		hist := registerHistory(ops, it, related[it])
		last := int64(h.now())
		hist = append(hist, porcupine.Operation{ClientId: 0, Input: regOp{kind: "read", owner: final[it]},
			Call: last, Return: last})
		checked++
		if time.Since(began) > total {
			undecided++
			continue
		}
		switch porcupine.CheckOperationsTimeout(model, hist, perItem) {
		case porcupine.Illegal:
			illegal = append(illegal, it)
			if debugLinear && len(illegal) == 1 {
				sort.Slice(hist, func(i, j int) bool { return hist[i].Call < hist[j].Call })
				for _, o := range hist {
					fmt.Printf("%s %v %v-%v\n", it, o.Input, time.Duration(o.Call),
						time.Duration(min(o.Return, int64(time.Hour))))
				}
			}
		case porcupine.Unknown:
			undecided++
		}
	}
	return illegal, undecided, checked
}

// relatedOwners returns, by item, the owners an item's register concerns: those
// acknowledged it, asked for it, named as its holder, or holding it at the end.
func relatedOwners(ops []op, final map[string]string) map[string]map[string]bool {
	related := map[string]map[string]bool{}
	relate := func(it, owner string) {
		if owner == "" {
			return
		}
		if related[it] == nil {
			related[it] = map[string]bool{}
		}
		related[it][owner] = true
	}
	for _, o := range ops {
		switch o.kind {
		case opAllocate, opRetry:
			for _, it := range o.asked {
				relate(it, o.owner)
				relate(it, o.holder)
			}
			if o.outcome == ok {
				for _, it := range o.items {
					relate(it, o.owner)
				}
			}
		case opTransfer:
			for _, it := range append(slices.Clone(o.asked), o.items...) {
				relate(it, o.owner)
				relate(it, o.to)
			}
			if o.refused != "" {
				relate(o.refused, o.owner)
				relate(o.refused, o.to)
				relate(o.refused, o.holder)
			}
		}
	}
	relateTransfersOfAll(ops, related)
	for it, owner := range final {
		if related[it] != nil {
			relate(it, owner)
		}
	}
	return related
}

// relateTransfersOfAll adds, to the register of every item related to the from of a
// Transfer of everything from holds that may have taken effect, its to: again until
// nothing changes (transfers chain).
func relateTransfersOfAll(ops []op, related map[string]map[string]bool) {
	for changed := true; changed; {
		changed = false
		for _, o := range ops {
			if o.kind != opTransfer || len(o.asked) > 0 || o.outcome == definite {
				continue
			}
			for _, owners := range related {
				if owners[o.owner] && !owners[o.to] {
					owners[o.to], changed = true, true
				}
			}
		}
	}
}

// registerHistory is the porcupine history of item's register: the operations of
// owners that touch it, an unknown outcome open until the end of time (it may take
// effect at any time after its call).
func registerHistory(ops []op, it string, owners map[string]bool) []porcupine.Operation {
	var hist []porcupine.Operation
	add := func(o op, r regOp, unknownEnd bool) {
		ret := int64(o.end)
		if unknownEnd {
			ret = int64(math.MaxInt64)
		}
		hist = append(hist,
			porcupine.Operation{ClientId: o.replica, Input: r, Call: int64(o.start), Return: ret})
	}
	for _, o := range ops {
		switch o.kind {
		case opAllocate, opRetry:
			if !owners[o.owner] {
				continue
			}
			switch {
			case o.outcome == ok && slices.Contains(o.items, it):
				add(o, regOp{kind: "acq", owner: o.owner}, false)
			case o.outcome == unknown:
				add(o, regOp{kind: "mayAcq", owner: o.owner}, true)
			case o.err == "AlreadyExists" && slices.Contains(o.asked, it):
				add(o, regOp{kind: "held", owner: o.owner, holder: o.holder}, false)
			}
		case opRelease:
			if !owners[o.owner] || len(o.items) > 0 && !slices.Contains(o.items, it) {
				continue
			}
			switch o.outcome {
			case ok:
				add(o, regOp{kind: "rel", owner: o.owner}, false)
			case unknown:
				add(o, regOp{kind: "mayRel", owner: o.owner}, true)
			}
		case opForce:
			if !slices.Contains(o.items, it) {
				continue
			}
			switch o.outcome {
			case ok:
				add(o, regOp{kind: "force"}, false)
			case unknown:
				add(o, regOp{kind: "mayForce"}, true)
			}
		case opTransfer:
			if r, ok := transferRegOp(o, it, owners); ok {
				add(o, r, o.outcome == unknown)
			}
		}
	}
	return hist
}

// transferRegOp is the operation of the Transfer o on item's register (whose owners
// are owners), if it has one: a move of an item it moved, a read of to for an item it
// named and did not move (to held it), from not holding an item it did not move of all
// from held, a possible move when its outcome is unknown, and for the item a refusal
// (NOT_OWNER) named, who held it.
func transferRegOp(o op, it string, owners map[string]bool) (regOp, bool) {
	if !owners[o.owner] && !owners[o.to] {
		return regOp{}, false
	}
	switch {
	case o.outcome == ok && slices.Contains(o.items, it):
		return regOp{kind: "move", owner: o.owner, to: o.to}, true
	case o.outcome == ok && slices.Contains(o.asked, it):
		return regOp{kind: "read", owner: o.to}, true
	case o.outcome == ok && len(o.asked) == 0 && owners[o.owner]:
		return regOp{kind: "notHeld", owner: o.owner}, true
	case o.outcome == unknown && o.covers(it):
		return regOp{kind: "mayMove", owner: o.owner, to: o.to}, true
	case o.outcome == definite && o.refused == it:
		return regOp{kind: "notMine", owner: o.owner, to: o.to, holder: o.holder, free: o.free}, true
	}
	return regOp{}, false
}
