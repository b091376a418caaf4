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

// side is one side of an A/B: a store, the binary that serves it, its environment and
// its extra arguments.
type side struct {
	name string
	dir  string
	bin  string   // "" this program
	env  []string // added to allocd's environment (GOGC=200, ...)
	args []string // added to allocd's command line (--log-level info, ...)
}

// abRun alternates runs on two sides, -ab-rounds times, each on a fresh allocd, so
// that the machine's drift hits both sides of every ratio alike, and prints each
// pair's ratios (A / B) and their medians. The sides: with -ab-full DIR, an empty store
// (A) against the store a run left in DIR (B: -dir of an earlier run with -keep); with
// -ab-vs BIN, the store in -dir served by this program (A) and by BIN (B, a `scale`
// built from other code); -ab-env adds variables to A's environment (GOGC=200: the
// collector's settings), -ab-args arguments to A's command line (--log-level info).
// Each run is a rate run, or with -ab-share a share run (Allocate's CPU against a held
// call and etcd's floor, both measured by this program whatever the side: the controls
// are the same code). Every run starts on a compacted store: what ran before leaves no
// history for it to compact.
func abRun(ctx context.Context, o options) error {
	a, b, cleanup, err := abSides(o)
	if err != nil {
		return err
	}
	defer cleanup()
	stacks := map[string]*stack{}
	for _, sd := range []side{a, b} {
		s, err := newStack(sd.dir, o)
		if err != nil {
			return err
		}
		if sd.bin != "" {
			s.bin = sd.bin
		}
		s.env, s.args = sd.env, sd.args
		defer s.stop()
		stacks[sd.name] = s
	}
	f := newFiller(o.clients)
	defer f.close()
	var ratios, cpuRatios []float64
	for round := range o.abRounds {
		var res [2]abResult
		for i, sd := range []side{a, b} {
			if res[i], err = stacks[sd.name].abOnce(ctx, f, round, sd.name); err != nil {
				return err
			}
		}
		ratios = append(ratios, res[0].rate/res[1].rate)
		cpuRatios = append(cpuRatios, float64(res[0].cpu)/float64(res[1].cpu))
	}
	slices.Sort(ratios)
	slices.Sort(cpuRatios)
	what, per := "rate", "cycle"
	if o.abShare {
		what, per = "Allocate CPU / (held + floor)", "Allocate"
	}
	fmt.Printf("%s %s / %s, pair by pair (sorted): %.2f; median %.2f\n", what, a.name, b.name, ratios,
		ratios[len(ratios)/2])
	fmt.Printf("CPU per %s %s / %s (sorted): %.2f; median %.2f\n", per, a.name, b.name, cpuRatios,
		cpuRatios[len(cpuRatios)/2])
	return nil
}

// abSides returns the two sides of the A/B the options ask for, and what removes the
// empty store of -ab-full.
func abSides(o options) (a, b side, cleanup func(), err error) {
	cleanup = func() {}
	switch {
	case o.abFull != "":
		empty, err := os.MkdirTemp("", "allocd-scale-empty-")
		if err != nil {
			return a, b, cleanup, err
		}
		cleanup = func() { os.RemoveAll(empty) }
		a, b = side{name: "empty", dir: empty}, side{name: "full", dir: o.abFull}
	case o.abVs != "" && o.dir != "":
		a, b = side{name: "this", dir: o.dir}, side{name: filepath.Base(o.abVs), dir: o.dir, bin: o.abVs}
	case (o.abEnv != "" || o.abArgs != "") && o.dir != "":
		a, b = side{name: "with", dir: o.dir}, side{name: "default", dir: o.dir}
	default:
		return a, b, cleanup, fmt.Errorf(
			"-ab-full DIR, or -dir DIR with -ab-vs BIN, -ab-env VARS or -ab-args ARGS")
	}
	if o.abEnv != "" {
		a.env = strings.Split(o.abEnv, ",")
		a.name += " (" + o.abEnv + ")"
	}
	if o.abArgs != "" {
		a.args = strings.Fields(o.abArgs)
		a.name += " (" + o.abArgs + ")"
	}
	return a, b, cleanup, nil
}

// abResult is one side's run of an A/B round: a rate run's cycles per second and CPU
// per cycle, or a share run's ratio (as rate) and Allocate's CPU.
type abResult struct {
	rate float64
	cpu  time.Duration
}

// abOnce starts allocd, compacts its store, measures one run and kills allocd.
func (s *stack) abOnce(ctx context.Context, f *filler, round int, name string) (abResult, error) {
	took, err := s.startAllocd(ctx, "")
	if err != nil {
		return abResult{}, err
	}
	defer s.killAllocd()
	if _, err := s.compactNow(ctx); err != nil {
		return abResult{}, err
	}
	if s.o.abShare {
		sh, err := s.shareRun(ctx, f)
		if err != nil {
			return abResult{}, err
		}
		fmt.Printf("round %d %s: start → SERVING %s, Allocate CPU %.1f µs against a held call %.1f µs + "+
			"etcd's floor %.1f µs (p50 %v, %.1f a transaction): %.2f; load %s\n", round, name, secs(took),
			us(sh.alloc), us(sh.held), us(sh.floor), sh.p50.Round(100*time.Microsecond), sh.batch, sh.ratio(),
			loadAvg())
		return abResult{rate: sh.ratio(), cpu: sh.alloc}, nil
	}
	if s.o.abProfile {
		s.profileName = fmt.Sprintf("ab%d-%s", round, strings.Fields(name)[0])
	}
	rate, cpu, compactions, err := s.rateRun(ctx, f, -1)
	if err != nil {
		return abResult{}, err
	}
	fmt.Printf("round %d %s: start → SERVING %s, %.0f cycles/s, %.1f µs CPU each, %d compactions, "+
		"RSS %s; load %s\n", round, name, secs(took), rate, us(cpu), compactions,
		mib(rss(s.allocd.Process.Pid)), loadAvg())
	return abResult{rate: rate, cpu: cpu}, nil
}
