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

// An item key outside every range, written after the holders were seeded (a stray
// key: an external writer, a restore), held by the Service that uses it: List leaves
// it out, and so do the holders: ClusterIPOutOfRange on both paths.
func TestPassStrayKeyOutOfRange(t *testing.T) {
	bothPaths(t, func(t *testing.T, listFirst bool) {
		r := newEnv(t, opts{listFirst: listFirst})
		r.push(1, svc("uid-out", ips("10.9.9.9")))
		r.pass(false) // seeds the holders on the listFirst path
		v := `{"namespace":"ns","name":"out","uid":"uid-out","time":"2024-01-01T00:00:00Z"}`
		if _, err := r.cli.Put(context.Background(), prefix+"/clusterips/10.9.9.9", v); err != nil {
			t.Fatal(err)
		}
		if err := r.alloc.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
		want := sorted("ClusterIPOutOfRange 10.9.9.9 uid-out")
		if got := summary(r.pass(false).Findings); !slices.Equal(got, want) {
			t.Errorf("findings = %q; want %q", got, want)
		}
	})
}

// The same through a zoned key: parseKey accepts "2000::5%x", List leaves it out (no
// range holds a zoned address), and so do the holders (an ItemKey has no zone): the
// pass allocates 2000::5 to uid-a, which uses it.
func TestPassZonedKeyIsNotTheAddress(t *testing.T) {
	bothPaths(t, func(t *testing.T, listFirst bool) {
		r := newEnv(t, opts{ranges: []string{"192.168.1.0/24", "2000::/108"}, listFirst: listFirst})
		r.push(1, svc("uid-a", ips("2000::5")))
		if listFirst {
			if _, err := r.ctl.RunRepair(context.Background(), true); err != nil { // seeds; writes nothing
				t.Fatal(err)
			}
		}
		v := `{"namespace":"ns","name":"a","uid":"uid-a","time":"2024-01-01T00:00:00Z"}`
		if _, err := r.cli.Put(context.Background(), prefix+"/clusterips/2000::5%x", v); err != nil {
			t.Fatal(err)
		}
		if err := r.alloc.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
		r.pass(false)
		if got := r.holder(ip("2000::5")); got != "uid-a" {
			t.Errorf("holder(2000::5) = %q; want uid-a (NotAllocated repaired)", got)
		}
	})
}
