package repair_test

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// A node port that no range can hold, 65536 above an allocated port nobody uses, is
// its own item: PortOutOfRange, and a leak strike for the allocated one (a pass that
// keyed ports in 16 bits moved 30006 to the bad port's Service).
func TestPassBadPortIsNotAnother(t *testing.T) {
	r := newEnv(t, opts{})
	r.assign("uid-leak", port(30006))
	r.push(1, svc("uid-bad", nil, 30006+65536))
	for i := range 2 { // the first pass lists; the second reads only what it judges
		want := sorted("PortOutOfRange 95542 uid-bad", "LeakSuspected 30006 uid-leak")
		if got := summary(r.pass(false).Findings); !slices.Equal(got, want) {
			t.Errorf("pass %d findings =\n%q\nwant\n%q", i+1, got, want)
		}
	}
	if got := r.holder(port(30006)); got != "uid-leak" {
		t.Errorf("holder(30006) = %q; want uid-leak", got)
	}
}

// A negative node port beside a Service that holds the port it would alias.
func TestPassNegativePortIsNotAnother(t *testing.T) {
	r := newEnv(t, opts{})
	r.assign("uid-a", port(30006))
	r.push(1, svc("uid-a", nil, 30006), svc("uid-bad", nil, 30006-65536))
	for i := range 2 {
		want := sorted("PortOutOfRange -35530 uid-bad")
		if got := summary(r.pass(false).Findings); !slices.Equal(got, want) {
			t.Errorf("pass %d findings =\n%q\nwant\n%q", i+1, got, want)
		}
	}
}

// A pass that cannot read the allocations records no finding, not even those it found
// in the snapshot alone (an address out of range, one not valid).
func TestPassListErrorRecordsNothing(t *testing.T) {
	var hs *hookStore
	r := newEnv(t, opts{wrap: hooked(&hs)})
	r.push(1, svc("uid-out", ips("10.9.9.9")), svc("uid-bad", ips("not-an-ip")))
	hs.beforeList = func(context.Context) error { return errors.New("etcd down") }
	rep, err := r.ctl.RunRepair(context.Background(), false)
	if err == nil {
		t.Fatal("RunRepair = nil error; want the listing's")
	}
	if rep != nil && len(rep.Findings) != 0 {
		t.Errorf("findings of a pass that could not list = %q; want none", summary(rep.Findings))
	}
	if last := r.status().LastReport; last != nil && len(last.Findings) != 0 {
		t.Errorf("LastReport findings = %q; want none", summary(last.Findings))
	}
}
