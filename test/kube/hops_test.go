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
// Pod to the feed (fed) → the push of its batch starts (flush) → allocd took the push
// (push) → the bridge's watch of allocd shows the changed slice (allocd: allocd's
// controller and commit, and its watch) → the bridge's write of it starts (queue) →
// the write answered (write) → the slice seen on the test's watch of the API (watch).
type hops struct {
	n                                                  int // flips
	fed, flush, push, allocd, queue, write, watch, all []time.Duration
}

// hopNames are the hops in order, with what each measures.
var hopNames = []string{"commit→fed", "fed→push (flush)", "push", "pushed→allocd's slice at the bridge",
	"→write starts (queue)", "write", "written→API watch", "commit→API watch"}

func (h *hops) of() [][]time.Duration {
	return [][]time.Duration{h.fed, h.flush, h.push, h.allocd, h.queue, h.write, h.watch, h.all}
}

// line is the hops' p50 / p99 (ms), and how many flips each holds.
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
		commit, ok := rc.when(r.ackRV)
		if !ok {
			continue
		}
		t, ok := flipHops(r, lines)
		if !ok {
			continue
		}
		h.fed = append(h.fed, t[0].Sub(commit))
		for i := 1; i < len(t); i++ {
			d := t[i].Sub(t[i-1])
			switch i {
			case 1:
				h.flush = append(h.flush, d)
			case 2:
				h.push = append(h.push, d)
			case 3:
				h.allocd = append(h.allocd, d)
			case 4:
				h.queue = append(h.queue, d)
			case 5:
				h.write = append(h.write, d)
			}
		}
		if !r.slice.IsZero() {
			h.watch = append(h.watch, r.slice.Sub(t[len(t)-1]))
			h.all = append(h.all, r.slice.Sub(commit))
		}
	}
	return h
}

// flipHops finds r's steps in the bridge's log: fed (the Pod at the flip's
// resourceVersion), the push that carried it (started, taken), the writer's event of
// the slice allocd committed, its sync (started, done). ok is false when a step is
// missing.
func flipHops(r *flipRec, lines []logLine) (t [6]time.Time, ok bool) {
	ackRV, _ := strconv.ParseInt(r.ackRV, 10, 64)
	step := 0
	for _, l := range lines {
		a := l.attrs
		switch {
		case step == 0 && l.msg == "fed" && a["object"] == testNS+"/"+r.pod && a["revision"] == r.ackRV:
			t[0], step = l.at, 1
		case step == 1 && l.msg == "pushed events" && atLeast(a["revision"], ackRV):
			took, _ := time.ParseDuration(a["took"])
			t[1], t[2], step = l.at.Add(-took), l.at, 2
		case step == 2 && l.msg == "allocd changed" && a["kind"] == "endpointslices" &&
			a["key"] == r.allocdSliceKey && a["revision"] == strconv.FormatInt(r.allocdSliceRev, 10):
			t[3], step = l.at, 3
		case step == 3 && l.msg == "synced" && a["kind"] == "endpointslices" && a["key"] == r.allocdSliceKey:
			took, _ := time.ParseDuration(a["took"])
			t[4], t[5] = l.at.Add(-took), l.at
			return t, true
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
