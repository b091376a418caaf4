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
