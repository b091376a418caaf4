package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// The pause before a broken watch is opened again: it doubles while the stream keeps
// failing, up to maxResumeDelay.
const (
	firstResumeDelay = 100 * time.Millisecond
	maxResumeDelay   = 5 * time.Second
)

// endpointsWatch is `allocd watch endpoints` as it runs, kubectl's RetryWatcher and
// reflector in one: it resumes a broken stream from the last change printed and lists
// again when that revision was compacted, printing each change of an object once.
type endpointsWatch struct {
	s         *session
	namespace string
	p         *changePrinter
	// known holds the last change printed of each object that exists (by
	// namespace/name); deleted the revision of each deletion printed that a new stream
	// may send again.
	known   map[string]printed
	deleted map[string]int64
	last    int64 // the revision of the last change printed
	from    int64 // a new stream sends the changes after this revision
	stale   bool  // from was compacted: list again before watching
}

// printed is the last change printed of one object.
type printed struct {
	ep  *allocdv1.ServiceEndpoints
	rev int64
}

// watchEndpoints lists, then follows the changes from the listing's revision,
// printing each, until ctx ends (nil) or a failure no new stream can mend.
func watchEndpoints(ctx context.Context, s *session, namespace string) error {
	w := &endpointsWatch{s: s, namespace: namespace, p: &changePrinter{w: s.out, format: s.o.output},
		known: map[string]printed{}, deleted: map[string]int64{}}
	if err := w.list(ctx); err != nil {
		return err // allocd out of reach at the start: said at once
	}
	failures := 0
	for {
		last, err := w.last, error(nil)
		if w.stale {
			err = w.list(ctx)
		} else {
			err = w.follow(ctx)
		}
		switch {
		case ctx.Err() != nil:
			return nil // interrupted: the way a watch ends
		case errors.Is(err, client.ErrCompacted):
			fmt.Fprintf(s.err, "watch endpoints: revision %d was compacted; listing again\n", w.from)
			w.stale = true
			continue
		case !resumable(err):
			return s.fail("watch endpoints", false, err)
		}
		if w.last != last || err == nil {
			failures = 0 // it went on for a while
		}
		d := min(firstResumeDelay<<min(failures, 8), maxResumeDelay)
		failures++
		fmt.Fprintf(s.err, "%s; resuming after revision %d in %s\n", errorLine(s, err), w.from, d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// resumable reports whether a new stream may mend what err broke: anything but a
// request allocd refuses, or a failure to print.
func resumable(err error) bool {
	var ce *client.Error
	if !errors.As(err, &ce) {
		return false
	}
	switch ce.Code {
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied, codes.FailedPrecondition,
		codes.OutOfRange, codes.Unimplemented, codes.Unauthenticated:
		return false
	}
	return true
}

// errorLine is err as Execute would print it, without "error: ".
func errorLine(s *session, err error) string {
	var ce *callError
	if !errors.As(err, &ce) {
		ce = s.fail("watch endpoints", false, err).(*callError)
	}
	return ce.line()
}

// follow opens one stream from w.from and prints its changes until it breaks.
func (w *endpointsWatch) follow(ctx context.Context) error {
	req := &allocdv1.WatchServiceEndpointsRequest{Namespace: w.namespace, StartRevision: w.from}
	return w.s.c.WatchServiceEndpoints(ctx, req, func(ev *allocdv1.WatchServiceEndpointsResponse) error {
		k := endpointsKey(ev.GetEndpoints())
		if p, ok := w.known[k]; ok && p.rev >= ev.GetRevision() || w.deleted[k] >= ev.GetRevision() {
			return nil // printed before the stream broke
		}
		if ev.GetRevision() > w.last {
			w.forgetDeleted(ev.GetRevision())
			// One revision can hold the changes of many objects (the controller commits
			// them together): a stream that breaks within one resumes before it.
			w.last, w.from = ev.GetRevision(), ev.GetRevision()-1
		}
		w.record(k, ev)
		w.p.add(ev)
		return w.p.flush()
	})
}

// list lists the Endpoints and prints how they differ from what was printed: every
// object as ADDED the first time; after a compaction ADDED, MODIFIED or DELETED for
// what changed since. Changes after the listing's revision follow.
func (w *endpointsWatch) list(ctx context.Context) error {
	listed := map[string]bool{}
	change := func(ep *allocdv1.ServiceEndpoints, rev int64) error {
		k := endpointsKey(ep)
		listed[k] = true
		typ := allocdv1.WatchEventType_WATCH_EVENT_TYPE_ADDED
		if p, ok := w.known[k]; ok {
			if p.ep.GetRevision() == ep.GetRevision() {
				return nil
			}
			typ = allocdv1.WatchEventType_WATCH_EVENT_TYPE_MODIFIED
		}
		ev := &allocdv1.WatchServiceEndpointsResponse{Type: typ, Endpoints: ep, Revision: rev}
		w.record(k, ev)
		w.p.add(ev)
		return nil
	}
	req := &allocdv1.ListServiceEndpointsRequest{Namespace: w.namespace}
	rev, err := listEndpoints(ctx, w.s, "watch endpoints", req, change, w.p.flush)
	if err != nil {
		return err
	}
	var gone []string
	for k := range w.known {
		if !listed[k] {
			gone = append(gone, k)
		}
	}
	slices.Sort(gone)
	for _, k := range gone {
		w.p.add(&allocdv1.WatchServiceEndpointsResponse{Type: allocdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED,
			Endpoints: w.known[k].ep, Revision: rev})
		delete(w.known, k)
	}
	clear(w.deleted) // a stream from rev sends no change of rev or before
	w.last, w.from, w.stale = rev, rev, false
	return w.p.flush()
}

// record notes ev as the last change printed of the object k.
func (w *endpointsWatch) record(k string, ev *allocdv1.WatchServiceEndpointsResponse) {
	if ev.GetType() == allocdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED {
		delete(w.known, k)
		w.deleted[k] = ev.GetRevision()
		return
	}
	delete(w.deleted, k)
	w.known[k] = printed{ep: ev.GetEndpoints(), rev: ev.GetRevision()}
}

// forgetDeleted drops the deletions no stream sends again: those before rev, once a
// change of rev arrived (a new stream starts at rev).
func (w *endpointsWatch) forgetDeleted(rev int64) {
	for k, r := range w.deleted {
		if r < rev {
			delete(w.deleted, k)
		}
	}
}

// endpointsKey names an object: namespace/name.
func endpointsKey(ep *allocdv1.ServiceEndpoints) string {
	return ep.GetNamespace() + "/" + ep.GetName()
}
