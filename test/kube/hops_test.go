package kube

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// logLine is one line of the bridge's log (slog's text format): its time, message and
// attributes.
type logLine struct {
	at    time.Time
	msg   string
	attrs map[string]string
}

// parseLogLine parses `time=... level=... msg=... key=value ...`, values quoted or not;
// ok is false for a line that is not one.
func parseLogLine(s string) (l logLine, ok bool) {
	l.attrs = map[string]string{}
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			return l, false
		}
		key, rest := s[:eq], s[eq+1:]
		var val string
		if strings.HasPrefix(rest, `"`) {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				return l, false
			}
			val, _ = strconv.Unquote(q)
			rest = rest[len(q):]
		} else if sp := strings.IndexByte(rest, ' '); sp >= 0 {
			val, rest = rest[:sp], rest[sp:]
		} else {
			val, rest = rest, ""
		}
		l.attrs[key] = val
		s = strings.TrimLeft(rest, " ")
	}
	t, err := time.Parse(time.RFC3339Nano, l.attrs["time"])
	if err != nil {
		return l, false
	}
	l.at, l.msg = t, l.attrs["msg"]
	return l, true
}

// readLog returns the lines of the log at path timed from since on.
func readLog(path string, since time.Time) ([]logLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []logLine
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if l, ok := parseLogLine(sc.Text()); ok && !l.at.Before(since) {
			out = append(out, l)
		}
	}
	return out, sc.Err()
}

// hops is one run's flips on allocd's side, hop by hop, from the bridge's debug log:
// the flip's commit in the API (the revision clock) → the bridge's informer hands the
// Pod to the feed (fed) → the push of its batch starts (flush) → the bridge's watch of
// allocd shows the changed slice (allocd: the push, allocd's controller and commit,
// and its watch; push is the push's own call, which allocd may answer after its
// commit) → the bridge's write of it starts (queue) → the slice is committed in the
// API's etcd (the revision clock: request) → the write answered (answer) → the slice
// seen on the test's watch of the API (watch).
type hops struct {
	n                                                            int // flips
	fed, flush, allocd, push, queue, request, answer, watch, all []time.Duration
}

// hopNames are the hops in order.
var hopNames = []string{"commit→fed", "fed→push (flush)", "push→allocd's slice at the bridge",
	"(push call)", "→write starts (queue)", "write→etcd (request)", "etcd→answer", "answer→API watch",
	"commit→API watch"}

func (h *hops) of() [][]time.Duration {
	return [][]time.Duration{h.fed, h.flush, h.allocd, h.push, h.queue, h.request, h.answer, h.watch, h.all}
}

// line is the hops' p50 / p99, and how many flips each holds.
func (h *hops) line() string {
	var b strings.Builder
	b.WriteString("allocd's side hop by hop (bridge log), p50 / p99:")
	for i, d := range h.of() {
		fmt.Fprintf(&b, " %s %s / %s (%d);", hopNames[i], fmtQ(d, len(d), .5), fmtQ(d, len(d), .99), len(d))
	}
	return strings.TrimSuffix(b.String(), ";")
}

// bridgeHops times recs' hops from the bridge's log lines (read since the run began)
// and the revision clock rc.
func bridgeHops(recs []*flipRec, lines []logLine, rc *revClock) *hops {
	h := &hops{n: len(recs)}
	for _, r := range recs {
		if r.err != nil || r.allocdSliceKey == "" {
			continue
		}
		commit, ok1 := rc.when(r.ackRV)
		written, ok2 := rc.when(r.sliceRV)
		t, ok3 := flipHops(r, lines)
		if !ok1 || !ok2 || !ok3 {
			continue
		}
		h.fed = append(h.fed, t.fed.Sub(commit))
		h.flush = append(h.flush, t.pushStart.Sub(t.fed))
		h.allocd = append(h.allocd, t.changed.Sub(t.pushStart))
		h.push = append(h.push, t.pushed.Sub(t.pushStart))
		h.queue = append(h.queue, t.writeStart.Sub(t.changed))
		h.request = append(h.request, written.Sub(t.writeStart))
		h.answer = append(h.answer, t.written.Sub(written))
		if !r.slice.IsZero() {
			h.watch = append(h.watch, r.slice.Sub(t.written))
			h.all = append(h.all, r.slice.Sub(commit))
		}
	}
	return h
}

// flipTimes are the steps of one flip in the bridge's log.
type flipTimes struct {
	fed, pushStart, pushed, changed, writeStart, written time.Time
}

// flipHops finds r's steps in the bridge's log: fed (the Pod at the flip's
// resourceVersion), the push that carried it (started, taken), the writer's event of
// the slice allocd committed, its sync (started, done). ok is false when a step is
// missing.
func flipHops(r *flipRec, lines []logLine) (t flipTimes, ok bool) {
	ackRV, _ := strconv.ParseInt(r.ackRV, 10, 64)
	allocdRev := strconv.FormatInt(r.allocdSliceRev, 10)
	for _, l := range lines {
		a := l.attrs
		switch {
		case t.fed.IsZero():
			if l.msg == "fed" && a["object"] == testNS+"/"+r.pod && a["revision"] == r.ackRV {
				t.fed = l.at
			}
		case t.pushed.IsZero() && l.msg == "pushed events" && atLeast(a["revision"], ackRV):
			took, _ := time.ParseDuration(a["took"])
			t.pushStart, t.pushed = l.at.Add(-took), l.at
		case t.changed.IsZero() && l.msg == "allocd changed" && a["kind"] == "endpointslices" &&
			a["key"] == r.allocdSliceKey && a["revision"] == allocdRev:
			t.changed = l.at
		case !t.changed.IsZero() && l.msg == "synced" && a["kind"] == "endpointslices" &&
			a["key"] == r.allocdSliceKey:
			took, _ := time.ParseDuration(a["took"])
			t.writeStart, t.written = l.at.Add(-took), l.at
			return t, !t.pushed.IsZero()
		}
	}
	return t, false
}

func atLeast(rev string, min int64) bool {
	n, err := strconv.ParseInt(rev, 10, 64)
	return err == nil && n >= min
}

// hopsSummary is, per hop, the median [min, max] over runs of each run's p50 and p99;
// "" when no run has hops.
func hopsSummary(runs []flipResult) string {
	var b strings.Builder
	for i, name := range hopNames {
		var q50, q99 []time.Duration
		for _, r := range runs {
			if r.hops == nil {
				continue
			}
			d := r.hops.of()[i]
			if v, ok := quantile(d, len(d), .5); ok {
				q50 = append(q50, v)
			}
			if v, ok := quantile(d, len(d), .99); ok {
				q99 = append(q99, v)
			}
		}
		if len(q50) > 0 {
			fmt.Fprintf(&b, " %s p50 %s, p99 %s;", name, spread(q50), spread(q99))
		}
	}
	return strings.TrimSuffix(b.String(), ";")
}
