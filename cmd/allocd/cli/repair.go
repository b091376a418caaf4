package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

func newRepairRun(o *options) *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "run [--dry-run]",
		Short: "Run a repair pass now and list its findings",
		Long: `Run a repair pass now (RunRepair), on the replica elected to run them, against the last
Service snapshot a shim pushed, and list what it found, with Kubernetes' reasons:
addresses and ports Services use that are not allocated (allocated again), allocated
to another owner, out of range or invalid (to fix in the Service), and allocations no
Service uses (leaks: freed after --repair-leak-strikes passes; allocd repair status
shows the countdown). --dry-run reports without writing or counting a strike.

-o wide adds each finding's range, the Service's UID and whether the pass repaired it.`,
		Example: `  allocd repair run --dry-run
  allocd repair run -o json | jq '.findings[] | select(.reason == "LeakSuspected")'`,
		Args: args(0, 0, "no argument"),
		RunE: runE(o, func(ctx context.Context, s *session, _ []string) error {
			run := callWrite[*allocdv1.RepairReport]
			if dryRun {
				run = call[*allocdv1.RepairReport]
			}
			report, err := run(ctx, o, func(ctx context.Context) (*allocdv1.RepairReport, error) {
				return s.c.RunRepair(ctx, &allocdv1.RunRepairRequest{DryRun: dryRun})
			})
			if err != nil {
				return s.fail("repair run", !dryRun, err)
			}
			if o.structured() {
				if err := printObject(s.out, o.output, report); err != nil {
					return err
				}
			} else {
				if err := printFindings(s.out, report.GetFindings(), o.output == outWide); err != nil {
					return err
				}
				fmt.Fprintln(s.out, passSummary(report))
			}
			if report.GetError() != "" { // the pass stopped early: exit 1, in every format
				return ExitCode(1)
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "report without writing or counting a strike")
	return cmd
}

func newRepairStatus(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the repair leader, the leak candidates' countdowns and the last pass",
		Long: `Show repair's state (GetRepairStatus): the replica that runs the passes, the revision of
the last Service snapshot accepted, the leak candidates (allocations no Service uses)
with their strikes, the strikes left before they are freed and their age, and the
findings of the last pass.`,
		Example: `  allocd repair status
  allocd repair status -o json | jq '.leakCandidates'`,
		Args: args(0, 0, "no argument"),
		RunE: runE(o, func(ctx context.Context, s *session, _ []string) error {
			st, err := call(ctx, o, s.c.GetRepairStatus)
			if err != nil {
				return s.fail("repair status", false, err)
			}
			if o.structured() {
				return printObject(s.out, o.output, st)
			}
			return printRepairStatus(s.out, st, o.output == outWide)
		}),
	}
}

func printRepairStatus(w io.Writer, st *allocdv1.GetRepairStatusResponse, wide bool) error {
	last := "none yet"
	if r := st.GetLastReport(); r != nil {
		last = fmt.Sprintf("%s: %s", timestamp(r.GetStartTime(), time.Now()), passSummary(r))
	}
	snap := "none yet (a shim pushes Service snapshots)"
	if st.GetSnapshotRevision() != 0 {
		snap = strconv.FormatInt(st.GetSnapshotRevision(), 10)
	}
	tw := newTable(w)
	row(tw, "Leader:", orNone(st.GetLeader()))
	row(tw, "Snapshot revision:", snap)
	row(tw, "Last pass:", last)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nLeak candidates:")
	if len(st.GetLeakCandidates()) == 0 {
		fmt.Fprintln(w, "  none")
	} else {
		tw = newTable(w)
		row(tw, "  ITEM", "RANGE", "OWNER", "UID", "STRIKES", "STRIKES LEFT", "AGE")
		for _, c := range st.GetLeakCandidates() {
			row(tw, "  "+itemOf(c), c.GetRange(), ownerName(c.GetOwner()), c.GetOwner().GetUid(),
				fmt.Sprint(c.GetStrikes()),
				fmt.Sprint(c.GetStrikesLeft()), humanDuration(c.GetAge().AsDuration()))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if st.GetLastReport() == nil {
		return nil
	}
	fmt.Fprintln(w, "\nFindings of the last pass:")
	return printFindings(w, st.GetLastReport().GetFindings(), wide)
}

// printFindings writes the findings of a pass as a table.
func printFindings(w io.Writer, findings []*allocdv1.Finding, wide bool) error {
	if len(findings) == 0 {
		fmt.Fprintln(w, "No findings.")
		return nil
	}
	tw := newTable(w)
	if wide {
		row(tw, "REASON", "RANGE", "ITEM", "SERVICE", "UID", "REPAIRED", "MESSAGE")
	} else {
		row(tw, "REASON", "ITEM", "SERVICE", "MESSAGE")
	}
	for _, f := range findings {
		item := itemOf(f)
		if wide {
			row(tw, f.GetReason(), orNone(f.GetRange()), item, ownerName(f.GetService()),
				f.GetService().GetUid(),
				fmt.Sprint(f.GetRepaired()), oneLine(f.GetMessage()))
		} else {
			row(tw, f.GetReason(), item, ownerName(f.GetService()), oneLine(f.GetMessage()))
		}
	}
	return tw.Flush()
}

// passSummary says what a pass did in one line.
func passSummary(r *allocdv1.RepairReport) string {
	repaired := 0
	for _, f := range r.GetFindings() {
		if f.GetRepaired() {
			repaired++
		}
	}
	var counts []string
	for reason, n := range r.GetCounts() {
		counts = append(counts, fmt.Sprintf("%s %d", reason, n))
	}
	sort.Strings(counts)
	s := fmt.Sprintf("pass on snapshot revision %d took %s: %d findings, %d repaired",
		r.GetSnapshotRevision(),
		r.GetDuration().AsDuration().Round(time.Microsecond), len(r.GetFindings()), repaired)
	if len(counts) > 0 {
		s += " (" + strings.Join(counts, ", ") + ")"
	}
	if r.GetDryRun() {
		s += "; dry run: nothing written, no strike counted"
	}
	if r.GetError() != "" {
		s += "; the pass stopped early: " + oneLine(r.GetError())
	}
	return s
}
