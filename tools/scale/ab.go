package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// abRun is `scale -ab-full DIR`: Allocate's rate on an empty store and on the store
// a run left in DIR (-dir of an earlier run with -keep), the two alternating
// -ab-rounds times, each on a fresh allocd, so that the machine's drift hits both
// sides of every ratio alike. It prints each pair's ratio and the median, and the
// kill -9 → SERVING of the full store each round.
func abRun(ctx context.Context, o options, full string) error {
	empty, err := os.MkdirTemp("", "allocd-scale-empty-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(empty)
	stacks := map[string]*stack{}
	for _, dir := range []string{empty, full} {
		s, err := newStack(dir, o)
		if err != nil {
			return err
		}
		defer s.stop()
		stacks[dir] = s
	}
	f := newFiller(o.clients)
	defer f.close()
	var ratios, cpuRatios []float64
	for round := range o.abRounds {
		var rates [2]float64
		var cpus [2]time.Duration
		for i, dir := range []string{empty, full} {
			s := stacks[dir]
			took, err := s.startAllocd(ctx, "")
			if err != nil {
				return err
			}
			n := 0
			if dir == full {
				n = -1 // not a point: no profile
			}
			if rates[i], cpus[i], _, err = s.rateRun(ctx, f, n); err != nil {
				return err
			}
			rss := rss(s.allocd.Process.Pid)
			s.killAllocd()
			fmt.Printf("round %d %-5s: start → SERVING %s, %.0f cycles/s, %.1f µs CPU each, RSS %s\n",
				round,
				map[bool]string{true: "empty", false: "full"}[dir == empty], secs(took), rates[i],
				float64(cpus[i])/float64(time.Microsecond), mib(rss))
		}
		ratios = append(ratios, rates[1]/rates[0])
		cpuRatios = append(cpuRatios, float64(cpus[1])/float64(cpus[0]))
	}
	slices.Sort(ratios)
	slices.Sort(cpuRatios)
	fmt.Printf("rate full/empty, pair by pair (sorted): %.2f; median %.2f\n", ratios, ratios[len(ratios)/2])
	fmt.Printf("CPU per Allocate full/empty (sorted): %.2f; median %.2f\n", cpuRatios,
		cpuRatios[len(cpuRatios)/2])
	return nil
}

// fullDataDir is the data directory of a run's work directory.
func fullDataDir(dir string) string { return filepath.Join(dir, "data") }
