package fault

import (
	"testing"
	"time"
)

// TestAtomicTransfer: a listing at or after an acknowledged Transfer's revision that
// shows one of its items not moved, or one before it that shows one moved already, is
// a violation, unless an operation that takes the item from to may have committed in
// between.
func TestAtomicTransfer(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	x, y := "10.0.0.5", "port/30001"
	transfer := op{kind: opTransfer, owner: "w1-a", to: "w1-b", start: ms(100), end: ms(110), outcome: ok,
		items: []string{x, y}, rev: 10}
	list := func(rev int64, start int, held map[string]string) snapshot {
		return snapshot{prefix: "w1-", rev: rev, start: ms(start), end: ms(start + 5), held: held}
	}
	both := map[string]string{x: "w1-b", y: "w1-b"}
	half := map[string]string{x: "w1-b", y: "w1-a"}
	release := func(out outcome, rev int64, start int) op { // w1-b releases y
		return op{kind: opRelease, owner: "w1-b", items: []string{y}, start: ms(start), end: ms(start + 10),
			outcome: out, rev: rev}
	}
	for _, tc := range []struct {
		name  string
		ops   []op
		snaps []snapshot
		viol  bool
	}{
		{"both moved after", nil, []snapshot{list(10, 120, both), list(12, 130, both)}, false},
		{"none moved before", nil, []snapshot{list(9, 90, map[string]string{x: "w1-a", y: "w1-a"})}, false},
		{"one moved after", nil, []snapshot{list(12, 130, half)}, true},
		{"one moved at its revision", nil, []snapshot{list(10, 130, half)}, true},
		{"one moved before", nil, []snapshot{list(9, 90, half)}, true},
		{"one released by to since", []op{release(ok, 11, 115)}, []snapshot{list(12, 130, half)}, false},
		{"one released by to after the listing", []op{release(ok, 13, 140)}, []snapshot{list(12, 130, half)},
			true},
		{"a release of unknown outcome begun before the listing ended", []op{release(unknown, 0, 132)},
			[]snapshot{list(12, 130, half)}, false},
		{"a release of unknown outcome begun after the listing", []op{release(unknown, 0, 136)},
			[]snapshot{list(12, 130, half)}, true},
		{"another prefix's listing", nil, []snapshot{{prefix: "w2-", rev: 12, held: map[string]string{}}},
			false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &history{base: time.Now(), ops: append([]op{transfer}, tc.ops...), snaps: tc.snaps}
			viol, checked := h.checker().atomic()
			if (len(viol) > 0) != tc.viol {
				t.Errorf("atomic() = %v; want a violation: %v", viol, tc.viol)
			}
			want := len(tc.snaps)
			if tc.snaps[0].prefix != "w1-" {
				want = 0
			}
			if checked != want {
				t.Errorf("atomic() checked %d pairs; want %d", checked, want)
			}
			final := map[string]string{x: "w1-b", y: "w1-b"}
			if got := h.check(final); (len(got) > 0) != tc.viol {
				t.Errorf("check(%v) = %v; want a violation: %v", final, got, tc.viol)
			}
		})
	}
}

// TestOwnerStateMismatches: an owner record that lists an item whose key names another
// owner (or no key), or an item key whose owner's record does not list it, is a
// violation.
func TestOwnerStateMismatches(t *testing.T) {
	for _, tc := range []struct {
		name    string
		records map[string][]string
		keys    map[string]string
		viol    int
	}{
		{"in step", map[string][]string{"a": {"10.0.0.5", "port/30001"}, "b": nil},
			map[string]string{"10.0.0.5": "a", "port/30001": "a"}, 0},
		{"a record lists a free item", map[string][]string{"a": {"10.0.0.5", "port/30001"}},
			map[string]string{"10.0.0.5": "a"}, 1},
		{"a record lists another's item", map[string][]string{"a": {"10.0.0.5"}, "b": {"10.0.0.5"}},
			map[string]string{"10.0.0.5": "b"}, 1},
		{"a key its owner's record does not list", map[string][]string{"a": {"10.0.0.5"}},
			map[string]string{"10.0.0.5": "a", "10.0.0.6": "a"}, 1},
		{"a key of an owner with no record", map[string][]string{},
			map[string]string{"10.0.0.6": "c"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := ownerState{rev: 7, records: tc.records, keys: tc.keys}
			if got := st.mismatches(); len(got) != tc.viol {
				t.Errorf("mismatches() = %q; want %d violations", got, tc.viol)
			}
		})
	}
}
