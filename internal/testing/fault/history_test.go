package fault

import (
	"strings"
	"testing"
	"time"
)

// TestAfterFullRelease: the check of a full release finds an owner holding an item at
// the end after its acknowledged full release (a Release naming nothing, or a Transfer
// of everything it holds) unless an Allocate of that owner may have landed after the
// release began (ok or unknown, ending after it began).
func TestAfterFullRelease(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	alloc := func(start, end int, out outcome) op {
		return op{kind: opAllocate, owner: "a", start: ms(start), end: ms(end), outcome: out,
			items: []string{"10.0.0.5"}}
	}
	release := op{kind: opRelease, owner: "a", start: ms(100), end: ms(110), outcome: ok}
	transfer := func(named ...string) op { // of what a held, 10.0.0.6, to b
		return op{kind: opTransfer, owner: "a", to: "b", start: ms(100), end: ms(110), outcome: ok,
			asked: named, items: []string{"10.0.0.6"}}
	}
	moved := map[string]string{"10.0.0.5": "a", "10.0.0.6": "b"}
	for _, tc := range []struct {
		name    string
		ops     []op
		final   map[string]string
		viol    bool
		checked int // owners with an acknowledged full release
	}{
		{"held after the release, the unknown Allocate ended before it",
			[]op{alloc(0, 50, unknown), alloc(60, 70, ok), release},
			map[string]string{"10.0.0.5": "a"}, true, 1},
		{"nothing held after the release", []op{alloc(0, 50, unknown), alloc(60, 70, ok), release},
			map[string]string{}, false, 1},
		{"an Allocate after the release", []op{alloc(60, 70, ok), release, alloc(120, 130, ok)},
			map[string]string{"10.0.0.5": "a"}, false, 1},
		{"an unknown Allocate overlapping the release",
			[]op{alloc(60, 70, ok), release, alloc(90, 105, unknown)},
			map[string]string{"10.0.0.5": "a"}, false, 1},
		{"a definite failure after the release", []op{alloc(60, 70, ok), release, alloc(120, 130, definite)},
			map[string]string{"10.0.0.5": "a"}, true, 1},
		{"the full release failed",
			[]op{alloc(60, 70, ok),
				{kind: opRelease, owner: "a", start: ms(100), end: ms(110), outcome: definite}},
			map[string]string{"10.0.0.5": "a"}, false, 0},
		{"held after a transfer of everything, the unknown Allocate ended before it",
			[]op{alloc(0, 50, unknown), transfer()}, moved, true, 1},
		{"an Allocate after a transfer of everything",
			[]op{transfer(), alloc(120, 130, ok)}, moved, false, 1},
		{"held after a transfer of one item", []op{alloc(0, 50, unknown), transfer("10.0.0.6")}, moved,
			false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &history{base: time.Now(), ops: tc.ops}
			viol, checked := h.checker().afterFullRelease(tc.final)
			if got := len(viol) > 0; got != tc.viol {
				t.Errorf("afterFullRelease = %v; want a violation: %v", viol, tc.viol)
			}
			if len(viol) > 0 && !strings.Contains(string(viol[0]), "10.0.0.5") {
				t.Errorf("violation %q does not name the item", viol[0])
			}
			if checked != tc.checked {
				t.Errorf("checked %d owners' full releases; want %d", checked, tc.checked)
			}
		})
	}
}

// TestTransferChecks: the checks of a history with Transfers find an item held by two
// owners, free in between, or not moved by an acknowledged Transfer, and nothing in a
// history that allocd could have produced.
func TestTransferChecks(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	const x = "10.0.0.5"
	alloc := func(owner string, start, end int, out outcome) op {
		return op{kind: opAllocate, owner: owner, start: ms(start), end: ms(end), outcome: out,
			items: []string{x}, asked: []string{x}}
	}
	move := func(from, to string, named, moved []string, start, end int, out outcome) op {
		o := op{kind: opTransfer, owner: from, to: to, start: ms(start), end: ms(end), outcome: out,
			asked: named, items: named}
		if out == ok {
			o.items = moved
		}
		return o
	}
	refused := func(free bool, holder string) op {
		o := move("a", "b", []string{x}, nil, 20, 30, definite)
		o.refused, o.free, o.holder = x, free, holder
		return o
	}
	released := op{kind: opRelease, owner: "a", start: ms(12), end: ms(15), outcome: ok}
	for _, tc := range []struct {
		name   string
		ops    []op
		holder string // of x at the end
		viol   bool   // some check finds a violation
		linear bool   // x's register is linearizable
	}{
		{"moved", []op{alloc("a", 0, 10, ok), move("a", "b", nil, []string{x}, 20, 30, ok)}, "b", false,
			true},
		{"moved, then the retry moves nothing", []op{alloc("a", 0, 10, ok),
			move("a", "b", []string{x}, []string{x}, 20, 30, ok),
			move("a", "b", []string{x}, []string{}, 40, 50, ok)}, "b", false, true},
		{"moved but held by from at the end", []op{alloc("a", 0, 10, ok),
			move("a", "b", nil, []string{x}, 20, 30, ok)}, "a", true, false},
		{"free during the transfer", []op{alloc("a", 0, 10, ok),
			move("a", "b", nil, []string{x}, 20, 30, ok), alloc("c", 22, 28, ok)}, "b", true, false},
		{"given to another after the transfer", []op{alloc("a", 0, 10, ok),
			move("a", "b", nil, []string{x}, 20, 30, ok), alloc("c", 40, 50, ok)}, "c", true, false},
		{"of unknown outcome, moved", []op{alloc("a", 0, 10, ok),
			move("a", "b", nil, nil, 20, 30, unknown)}, "b", false, true},
		{"of unknown outcome, not moved", []op{alloc("a", 0, 10, ok),
			move("a", "b", nil, nil, 20, 30, unknown)}, "a", false, true},
		{"refused: free", []op{alloc("a", 0, 10, ok), released, refused(true, "")}, "", false, true},
		{"refused: free while from held it", []op{alloc("a", 0, 10, ok), refused(true, "")}, "a", false,
			false},
		{"refused: held by another while from held it", []op{alloc("a", 0, 10, ok), refused(false, "c")},
			"a", false, false},
		{"all of from's, not this one", []op{alloc("a", 0, 10, ok), released,
			move("a", "b", nil, []string{}, 20, 30, ok)}, "", false, true},
		// A Transfer of all of from's is a full release of from: from holding x after it is
		// what afterFullRelease finds.
		{"all of from's, not this one while from held it", []op{alloc("a", 0, 10, ok),
			move("a", "b", nil, []string{}, 20, 30, ok)}, "a", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &history{base: time.Now().Add(-time.Hour), ops: tc.ops}
			final := map[string]string{}
			if tc.holder != "" {
				final[x] = tc.holder
			}
			if viol := h.check(final); (len(viol) > 0) != tc.viol {
				t.Errorf("check(%v) = %v; want a violation: %v", final, viol, tc.viol)
			}
			illegal, undecided, _ := h.linearizable(final, time.Second, time.Minute)
			if undecided > 0 || (len(illegal) == 0) != tc.linear {
				t.Errorf("linearizable(%v) = %v illegal, %d undecided; want linearizable: %v", final, illegal,
					undecided, tc.linear)
			}
		})
	}
}
