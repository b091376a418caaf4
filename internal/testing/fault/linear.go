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
	kind   string // acq, held, mayAcq, rel, mayRel, force, mayForce, read
	owner  string // the requester (acq, held, mayAcq, rel, mayRel) or the holder read
	holder string // held: the holder allocd named, "" when it named none
}

func (o regOp) String() string {
	switch o.kind {
	case "held":
		return fmt.Sprintf("held(%s by %q)", o.owner, o.holder)
	case "force", "mayForce":
		return o.kind
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
		}
		return nil
	},
	DescribeOperation: func(input, _ interface{}) string { return input.(regOp).String() },
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
		if o.kind != opAllocate && o.kind != opRetry {
			continue
		}
		for _, it := range o.asked {
			relate(it, o.owner)
			relate(it, o.holder)
		}
		if o.outcome == ok {
			for _, it := range o.items {
				relate(it, o.owner)
			}
		}
	}
	for it, owner := range final {
		if related[it] != nil {
			relate(it, owner)
		}
	}
	return related
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
		}
	}
	return hist
}
