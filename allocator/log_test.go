package allocator

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
)

// BenchmarkLogAllocated is the line a committed Allocate logs, through the daemon's
// text handler at info into io.Discard (as tools/bench has it).
func BenchmarkLogAllocated(b *testing.B) {
	a := &Allocator{}
	a.log = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
	r := &rng{name: "kubernetes"}
	o := &op{owner: benchOwner, putRecord: true,
		picks: []*pick{{r: r, item: IP(netip.MustParseAddr("10.96.0.10"))}}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		a.logWrite(ctx, o, 123456)
	}
}

// TestPickRanges checks the ranges attribute of the allocated line: a name once for
// each run of picks from one range, in the picks' order.
func TestPickRanges(t *testing.T) {
	v4, v6, ports := &rng{name: "10.0.0.0/24"}, &rng{name: "fd00::/120"}, &rng{name: "30000-32767"}
	for _, c := range []struct {
		picks []*rng
		want  string
	}{
		{nil, ""},
		{[]*rng{v4}, "10.0.0.0/24"},
		{[]*rng{ports, ports}, "30000-32767"},
		{[]*rng{v4, v6, ports, ports}, "10.0.0.0/24,fd00::/120,30000-32767"},
		{[]*rng{v4, ports, v4}, "10.0.0.0/24,30000-32767,10.0.0.0/24"},
	} {
		var picks []*pick
		var names []string
		for _, r := range c.picks {
			picks = append(picks, &pick{r: r})
			names = append(names, r.name)
		}
		if got := pickRanges(picks); got != c.want {
			t.Errorf("pickRanges(%v) = %q; want %q", names, got, c.want)
		}
	}
}

// TestAllocatedSource checks that a handler that adds the source finds the allocated
// line's in logAllocated, on the first line and on the next.
func TestAllocatedSource(t *testing.T) {
	var buf bytes.Buffer
	a := &Allocator{}
	a.log = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{AddSource: true}))
	o := &op{owner: benchOwner, putRecord: true,
		picks: []*pick{{r: &rng{name: "kubernetes"}, item: IP(netip.MustParseAddr("10.96.0.10"))}}}
	for i := range 2 {
		buf.Reset()
		a.logWrite(context.Background(), o, 7)
		var line struct {
			Msg    string
			Source struct{ Function, File string }
			UID    string `json:"uid"`
		}
		if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
			t.Fatalf("line %d: %v: %s", i, err, buf.Bytes())
		}
		if line.Msg != "allocated" || line.UID != benchOwner.UID ||
			!strings.HasSuffix(line.Source.Function, "(*Allocator).logAllocated") ||
			!strings.HasSuffix(line.Source.File, "/allocator/log.go") {
			t.Errorf("line %d = %s; want allocated, its source logAllocated in allocator/log.go", i,
				buf.Bytes())
		}
	}
}
