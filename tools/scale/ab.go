package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// side is one side of an A/B: a store, the binary that serves it and its environment.
type side struct {
	name string
	dir  string
	bin  string   // "" this program
	env  []string // added to allocd's environment (GOGC=200, ...)
}

// abRun alternates rate runs on two sides, -ab-rounds times, each on a fresh allocd,
// so that the machine's drift hits both sides of every ratio alike, and prints each
// pair's ratios (A / B) and their medians. The sides: with -ab-full DIR, an empty store
// (A) against the store a run left in DIR (B: -dir of an earlier run with -keep); with
// -ab-vs BIN, the store in -dir served by this program (A) and by BIN (B, a `scale`
// built from other code); -ab-env adds variables to A's environment (GOGC=200: the
// collector's settings). Every rate run starts on a compacted store: what ran before
// leaves no history for it to compact.
func abRun(ctx context.Context, o options) error {
	var a, b side
	switch {
	case o.abFull != "":
		empty, err := os.MkdirTemp("", "allocd-scale-empty-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(empty)
		a, b = side{name: "empty", dir: empty}, side{name: "full", dir: o.abFull}
	case o.abVs != "" && o.dir != "":
		a, b = side{name: "this", dir: o.dir}, side{name: filepath.Base(o.abVs), dir: o.dir, bin: o.abVs}
	case o.abEnv != "" && o.dir != "":
		a, b = side{name: "env", dir: o.dir}, side{name: "default", dir: o.dir}
	default:
		return fmt.Errorf("-ab-full DIR, or -dir DIR with -ab-vs BIN or -ab-env VARS")
	}
	if o.abEnv != "" {
		a.env = strings.Split(o.abEnv, ",")
		a.name += " (" + o.abEnv + ")"
	}
	stacks := map[string]*stack{}
	for _, sd := range []side{a, b} {
		s, err := newStack(sd.dir, o)
		if err != nil {
			return err
		}
		if sd.bin != "" {
			s.bin = sd.bin
		}
		s.env = sd.env
		defer s.stop()
		stacks[sd.name] = s
	}
	f := newFiller(o.clients)
	defer f.close()
	var ratios, cpuRatios []float64
	for round := range o.abRounds {
		var rates [2]float64
		var cpus [2]time.Duration
		for i, sd := range []side{a, b} {
			s := stacks[sd.name]
			took, err := s.startAllocd(ctx, "")
			if err != nil {
				return err
			}
			if _, err := s.compactNow(ctx); err != nil {
				return err
			}
			if o.abProfile {
				s.profileName = fmt.Sprintf("ab%d-%s", round, strings.Fields(sd.name)[0])
			}
			var compactions int
			if rates[i], cpus[i], compactions, err = s.rateRun(ctx, f, -1); err != nil {
				return err
			}
			rss := rss(s.allocd.Process.Pid)
			s.killAllocd()
			fmt.Printf("round %d %s: start → SERVING %s, %.0f cycles/s, %.1f µs CPU each, "+
				"%d compactions, RSS %s\n", round, sd.name, secs(took), rates[i], us(cpus[i]), compactions,
				mib(rss))
		}
		ratios = append(ratios, rates[0]/rates[1])
		cpuRatios = append(cpuRatios, float64(cpus[0])/float64(cpus[1]))
	}
	slices.Sort(ratios)
	slices.Sort(cpuRatios)
	fmt.Printf("rate %s / %s, pair by pair (sorted): %.2f; median %.2f\n", a.name, b.name, ratios,
		ratios[len(ratios)/2])
	fmt.Printf("CPU per cycle %s / %s (sorted): %.2f; median %.2f\n", a.name, b.name, cpuRatios,
		cpuRatios[len(cpuRatios)/2])
	return nil
}
