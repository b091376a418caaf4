package fault

import (
	"strings"
	"testing"
	"time"
)

// TestAfterFullRelease: the check of a full release finds an owner holding an item at
// the end after its acknowledged full release unless an Allocate of that owner may
// have landed after the release began (ok or unknown, ending after it began).
func TestAfterFullRelease(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	alloc := func(start, end int, out outcome) op {
		return op{kind: opAllocate, owner: "a", start: ms(start), end: ms(end), outcome: out,
			items: []string{"10.0.0.5"}}
	}
	release := op{kind: opRelease, owner: "a", start: ms(100), end: ms(110), outcome: ok}
	for _, tc := range []struct {
		name  string
		ops   []op
		final map[string]string
		viol  bool
	}{
		// checked counts the owners with an acknowledged full release: 1 but in the last case.
		{"held after the release, the unknown Allocate ended before it",
			[]op{alloc(0, 50, unknown), alloc(60, 70, ok), release},
			map[string]string{"10.0.0.5": "a"}, true},
		{"nothing held after the release", []op{alloc(0, 50, unknown), alloc(60, 70, ok), release},
			map[string]string{}, false},
		{"an Allocate after the release", []op{alloc(60, 70, ok), release, alloc(120, 130, ok)},
			map[string]string{"10.0.0.5": "a"}, false},
		{"an unknown Allocate overlapping the release",
			[]op{alloc(60, 70, ok), release, alloc(90, 105, unknown)},
			map[string]string{"10.0.0.5": "a"}, false},
		{"a definite failure after the release", []op{alloc(60, 70, ok), release, alloc(120, 130, definite)},
			map[string]string{"10.0.0.5": "a"}, true},
		{"the full release failed",
			[]op{alloc(60, 70, ok),
				{kind: opRelease, owner: "a", start: ms(100), end: ms(110), outcome: definite}},
			map[string]string{"10.0.0.5": "a"}, false},
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
			want := 1
			if tc.name == "the full release failed" {
				want = 0
			}
			if checked != want {
				t.Errorf("checked %d owners' full releases; want %d", checked, want)
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
		{"all of from's, not this one while from held it", []op{alloc("a", 0, 10, ok),
			move("a", "b", nil, []string{}, 20, 30, ok)}, "a", false, false},
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
