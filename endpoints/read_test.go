package endpoints

import (
	"context"
	"errors"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	"strconv"
	"testing"
	"time"
)

// TestList: pages of one listing are read at one revision, namespaces are separate
// (a namespace that is a prefix of another lists only its own), and a bad token is
// INVALID_ARGUMENT, not INTERNAL.
func TestList(t *testing.T) {
	h := newHarness(t, Config{})
	for i := range 7 {
		e := handMade("ns", "svc"+strconv.Itoa(i))
		h.store(e)
	}
	h.store(handMade("ns2", "other"))
	ctx := etcdtest.Context(t)
	var names []string
	tok := ""
	var rev0 int64
	for page := 0; ; page++ {
		eps, next, rev, err := h.c.List(ctx, "ns", 3, tok)
		if err != nil {
			t.Fatalf("List page %d: %v", page, err)
		}
		if page == 0 {
			rev0 = rev
			// Written after the first page: not part of this listing.
			h.store(handMade("ns", "svc9"))
		} else if rev != rev0 {
			t.Fatalf("page %d read at revision %d; want %d", page, rev, rev0)
		}
		for _, e := range eps {
			names = append(names, e.Namespace+"/"+e.Name)
		}
		if next == "" {
			break
		}
		tok = next
	}
	if len(names) != 7 || names[0] != "ns/svc0" || names[6] != "ns/svc6" {
		t.Fatalf("List(ns) = %v; want ns/svc0..ns/svc6", names)
	}
	if _, _, _, err := h.c.List(ctx, "ns", 3, "garbage"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("List with a bad token = %v; want ErrInvalid", err)
	}
	if _, _, _, err := h.c.List(ctx, "ns2", 3, tok); !errors.Is(err, ErrInvalid) {
		t.Fatalf("List with another namespace's token = %v; want ErrInvalid", err)
	}
	all, _, _, err := h.c.List(ctx, "", 0, "")
	if err != nil || len(all) != 9 {
		t.Fatalf("List(all) = %d objects, %v; want 9", len(all), err)
	}
}

// TestWatch: from 0 the current objects come first as ADDED, then changes; from a
// revision, the changes after it; a compacted revision is a CompactedError.
func TestWatch(t *testing.T) {
	h := newHarness(t, Config{})
	h.store(handMade("ns", "a"))
	ctx, cancel := context.WithCancel(etcdtest.Context(t))
	defer cancel()
	got := make(chan WatchEvent, 16)
	errc := make(chan error, 1)
	go func() {
		errc <- h.c.Watch(ctx, "ns", 0, func(e WatchEvent) error { got <- e; return nil })
	}()
	next := func() WatchEvent {
		t.Helper()
		select {
		case e := <-got:
			return e
		case err := <-errc:
			t.Fatalf("Watch ended: %v", err)
		case <-time.After(5 * time.Second):
			t.Fatal("no watch event within 5 s")
		}
		return WatchEvent{}
	}
	if e := next(); e.Type != Added || e.Endpoints.Name != "a" {
		t.Fatalf("first event %v %s; want Added a", e.Type, e.Endpoints.Name)
	}
	h.store(handMade("other", "x")) // another namespace: not sent
	h.store(handMade("ns", "b"))
	if e := next(); e.Type != Added || e.Endpoints.Name != "b" {
		t.Fatalf("event %v %s; want Added b", e.Type, e.Endpoints.Name)
	}
	h.store(handMade("ns", "b"))
	m := next()
	if m.Type != Modified || m.Endpoints.Name != "b" {
		t.Fatalf("event %v %s; want Modified b", m.Type, m.Endpoints.Name)
	}
	if _, err := h.cli.Delete(ctx, testPrefix+"/endpoints/ns/b"); err != nil {
		t.Fatal(err)
	}
	if e := next(); e.Type != Deleted || e.Endpoints.Name != "b" || len(e.Endpoints.Subsets) != 1 {
		t.Fatalf("event %v %+v; want Deleted b with its last state", e.Type, e.Endpoints)
	}

	// Resume after the MODIFIED event: only the DELETE follows.
	got2 := make(chan WatchEvent, 4)
	ctx2, cancel2 := context.WithCancel(ctx)
	go h.c.Watch(ctx2, "ns", m.Revision, func(e WatchEvent) error { got2 <- e; return nil })
	select {
	case e := <-got2:
		if e.Type != Deleted {
			t.Fatalf("resumed watch sent %v first; want Deleted", e.Type)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("resumed watch sent nothing")
	}
	cancel2()

	if _, err := h.cli.Compact(ctx, h.rev()); err != nil {
		t.Fatal(err)
	}
	err := h.c.Watch(ctx, "ns", m.Revision-1, func(WatchEvent) error { return nil })
	var ce *CompactedError
	if !errors.As(err, &ce) || ce.Compacted == 0 {
		t.Fatalf("Watch from a compacted revision = %v; want a CompactedError", err)
	}
}

// A DELETE whose previous state etcd no longer has (compacted at the delete's own
// revision: etcd drops the previous value) ends the watch with a CompactedError rather
// than a Deleted event without the last state.
func TestWatchDeleteWithoutPrevious(t *testing.T) {
	h := newHarness(t, Config{})
	h.store(handMade("ns", "a"))
	ctx := etcdtest.Context(t)
	del, err := h.cli.Delete(ctx, testPrefix+"/endpoints/ns/a")
	if err != nil {
		t.Fatal(err)
	}
	rev := del.Header.Revision
	if _, err := h.cli.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	var sent []WatchEvent
	err = h.c.Watch(ctx, "ns", rev-1, func(e WatchEvent) error { sent = append(sent, e); return nil })
	var ce *CompactedError
	if !errors.As(err, &ce) || len(sent) != 0 {
		t.Fatalf("Watch over a delete whose previous state was compacted = %v, sent %+v; want a "+
			"CompactedError and nothing sent", err, sent)
	}
}
