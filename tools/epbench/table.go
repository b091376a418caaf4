package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (r result) heapPerPod() float64 { return (r.heapAfter - r.heapBefore) / float64(r.pods) }

// row is one line of the table: a figure of a run, how to print it, its ceiling.
type row struct {
	name, unit, ceiling string
	value               func(r result) float64
}

var rows = []row{
	{"sync, Endpoints (end of pushes → all on the watch)", "s", "< 5",
		func(r result) float64 { return r.syncEps.Seconds() }},
	{"sync, EndpointSlices", "s", "< 5", func(r result) float64 { return r.syncSlices.Seconds() }},
	{"sync, both", "s", "< 5", func(r result) float64 { return max(r.syncEps, r.syncSlices).Seconds() }},
	{"the three snapshot pushes", "s", "", func(r result) float64 { return r.pushes.Seconds() }},
	{"allocd CPU, pushes and sync", "s", "", func(r result) float64 { return r.cpuSync }},
	{"churn rate", "flips/s", "", func(r result) float64 { return r.rate }},
	{"churn: ack → WatchServiceEndpoints p50", "ms", "",
		func(r result) float64 { return ms(r.epP50) }},
	{"churn: ack → WatchServiceEndpoints p99", "ms", "< 100",
		func(r result) float64 { return ms(r.epP99) }},
	{"churn: ack → WatchEndpointSlices p50", "ms", "",
		func(r result) float64 { return ms(r.slP50) }},
	{"churn: ack → WatchEndpointSlices p99", "ms", "< 100",
		func(r result) float64 { return ms(r.slP99) }},
	{"churn: allocd's event → commit p50, Endpoints", "ms", "",
		func(r result) float64 { return r.epCommitP50 * 1000 }},
	{"churn: allocd's event → commit p99, Endpoints", "ms", "",
		func(r result) float64 { return r.epCommitP99 * 1000 }},
	{"churn: allocd's event → commit p50, slices", "ms", "",
		func(r result) float64 { return r.slCommitP50 * 1000 }},
	{"churn: allocd's event → commit p99, slices", "ms", "",
		func(r result) float64 { return r.slCommitP99 * 1000 }},
	{"churn: Endpoints written", "", "", func(r result) float64 { return float64(r.epWrites) }},
	{"churn: EndpointSlices written", "", "≤ changed",
		func(r result) float64 { return float64(r.sliceWrites) }},
	{"churn: slices (and Endpoints) that changed", "", "",
		func(r result) float64 { return float64(r.applied) }},
	{"churn: allocd CPU per flip", "µs", "",
		func(r result) float64 { return r.cpuChurn / float64(r.flips) * 1e6 }},
	{"heap per Pod (lowest after sync − before)", "B", "< 3072",
		func(r result) float64 { return r.heapPerPod() }},
	{"heap after sync (lowest)", "MiB", "", func(r result) float64 { return r.heapAfter / (1 << 20) }},
	{"RSS at the end", "MiB", "", func(r result) float64 { return r.rssAfter / (1 << 20) }},
}

func median(rs []result, f func(result) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func num(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// printTable prints one row per figure: each run of each binary, the medians, the
// ratio A/B when there are two binaries, and the ceiling.
func printTable(w io.Writer, res [][]result) {
	head := []string{"", "unit"}
	for b, rs := range res {
		for i := range rs {
			head = append(head, fmt.Sprintf("%c run %d", 'A'+b, i+1))
		}
		head = append(head, fmt.Sprintf("%c median", 'A'+b))
	}
	if len(res) == 2 {
		head = append(head, "A/B")
	}
	head = append(head, "ceiling")
	fmt.Fprintln(w, "| "+strings.Join(head, " | ")+" |")
	fmt.Fprintln(w, "|"+strings.Repeat("---|", len(head)))
	for _, rw := range rows {
		cells := []string{rw.name, rw.unit}
		var meds []float64
		for _, rs := range res {
			for _, r := range rs {
				cells = append(cells, num(rw.value(r)))
			}
			m := median(rs, rw.value)
			meds = append(meds, m)
			cells = append(cells, num(m))
		}
		if len(res) == 2 {
			ratio := "-"
			if meds[1] != 0 {
				ratio = fmt.Sprintf("%.2f", meds[0]/meds[1])
			}
			cells = append(cells, ratio)
		}
		cells = append(cells, rw.ceiling)
		fmt.Fprintln(w, "| "+strings.Join(cells, " | ")+" |")
	}
}
