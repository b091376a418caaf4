package kube

import (
	"bufio"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// parseMetrics reads a Prometheus text exposition into series → value.
func parseMetrics(text string) map[string]float64 {
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// quantiles are the p50 and p99 of a histogram's observations between two scrapes,
// and the bucket bounds the p99 fell between.
type quantiles struct {
	n            int
	p50, p99     float64 // seconds
	p99lo, p99hi float64 // the bucket of the p99
}

// String is "p50 / p99 ms (the p99's bucket; n observations)", or "none".
func (q quantiles) String() string {
	if q.n == 0 {
		return "none"
	}
	ms := func(s float64) string { return fmt.Sprintf("%.1f", s*1000) }
	hi := "+Inf"
	if !math.IsInf(q.p99hi, 1) {
		hi = ms(q.p99hi)
	}
	return fmt.Sprintf("%s / %s ms (p99 in %s–%s ms; %d)", ms(q.p50), ms(q.p99), ms(q.p99lo), hi, q.n)
}

// histQuantiles is the p50 and p99 of histogram name's observations between before and
// after, over the series whose labels contain every one of filters, interpolated
// linearly within a bucket as Prometheus' histogram_quantile does (a quantile in the
// +Inf bucket is the highest finite bound).
func histQuantiles(before, after map[string]float64, name string, filters ...string) quantiles {
	counts := map[float64]float64{}
	for k, v := range after {
		labels, ok := strings.CutPrefix(k, name+"_bucket{")
		if !ok {
			continue
		}
		match := true
		for _, f := range filters {
			match = match && strings.Contains(labels, f)
		}
		_, le, ok := strings.Cut(labels, `le="`)
		if !match || !ok {
			continue
		}
		le, _, _ = strings.Cut(le, `"`)
		bound, err := strconv.ParseFloat(le, 64)
		if err != nil {
			continue
		}
		counts[bound] += v - before[k]
	}
	var bounds []float64
	for b := range counts {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	if len(bounds) == 0 || counts[bounds[len(bounds)-1]] <= 0 {
		return quantiles{}
	}
	total := counts[bounds[len(bounds)-1]]
	q := quantiles{n: int(total)}
	q.p50, _, _ = bucketQuantile(bounds, counts, total, .5)
	q.p99, q.p99lo, q.p99hi = bucketQuantile(bounds, counts, total, .99)
	return q
}

// bucketQuantile interpolates quantile q of cumulative bucket counts, and returns the
// bucket's bounds.
func bucketQuantile(bounds []float64, cum map[float64]float64, total, q float64) (v, lo, hi float64) {
	rank := q * total
	prevBound, prevCum := 0.0, 0.0
	for _, b := range bounds {
		c := cum[b]
		if c >= rank {
			if math.IsInf(b, 1) {
				return prevBound, prevBound, b
			}
			if c == prevCum {
				return b, prevBound, b
			}
			return prevBound + (b-prevBound)*(rank-prevCum)/(c-prevCum), prevBound, b
		}
		prevBound, prevCum = b, c
	}
	return prevBound, prevBound, math.Inf(1)
}

// TestHistQuantiles checks the interpolation on a histogram of known observations: 100
// between 0 and 5 ms, 100 between 5 and 25 ms, 100 over 25 ms, between two scrapes of
// which the first saw 10 of them, and a series of another name that must not count.
func TestHistQuantiles(t *testing.T) {
	before := parseMetrics(`h_bucket{name="w",le="0.005"} 10
h_bucket{name="w",le="0.025"} 10
h_bucket{name="w",le="+Inf"} 10
`)
	after := parseMetrics(`# TYPE h histogram
h_bucket{name="w",le="0.005"} 110
h_bucket{name="w",le="0.025"} 210
h_bucket{name="w",le="+Inf"} 310
h_bucket{name="other",le="0.005"} 1000
h_bucket{name="other",le="+Inf"} 1000
`)
	q := histQuantiles(before, after, "h", `name="w"`)
	// p50: rank 150 of 300, half way through the 5–25 ms bucket; p99: rank 297, in +Inf.
	if q.n != 300 || math.Abs(q.p50-0.015) > 1e-9 || q.p99 != 0.025 || !math.IsInf(q.p99hi, 1) {
		t.Errorf("histQuantiles = %+v; want n 300, p50 15 ms, p99 25 ms (the highest finite bound)", q)
	}
	if q := histQuantiles(before, before, "h", `name="w"`); q.n != 0 || q.String() != "none" {
		t.Errorf("histQuantiles of no observation = %+v (%s); want none", q, q)
	}
}
