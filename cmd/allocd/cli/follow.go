package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// The pause before a broken watch is opened again: it doubles while the stream keeps
// failing, up to maxResumeDelay.
const (
	firstResumeDelay = 100 * time.Millisecond
	maxResumeDelay   = 5 * time.Second
)

// watchKind is what followWatch needs to follow one kind of object (O), whose changes
// are the watch's messages (E).
type watchKind[O, E proto.Message] struct {
	what string // the command, for its messages: "watch endpoints"
	// list lists the objects: each with every one and the listing's revision, page
	// after each page; it returns that revision.
	list func(ctx context.Context, each func(O, int64) error, page func() error) (int64, error)
	// watch opens one stream of the changes after from, each with every one, until it
	// breaks.
	watch func(ctx context.Context, from int64, each func(E) error) error
	key   func(O) string // namespace/name
	// change splits a message; event makes one.
	change func(E) (allocdv1.WatchEventType, O, int64)
	event  func(allocdv1.WatchEventType, O, int64) E
}

// followed is a watch as it runs, kubectl's RetryWatcher and reflector in one: it
// resumes a broken stream from the last change printed and lists again when that
// revision was compacted, printing each change of an object once.
type followed[O, E proto.Message] struct {
	k watchKind[O, E]
	p *eventPrinter[E]
	// known holds the last change printed of each object that exists (by key), with
	// its revision; deleted the revision of each deletion printed that a new stream
	// may send again.
	known   map[string]printed[O]
	deleted map[string]int64
	last    int64 // the revision of the last change printed
	from    int64 // a new stream sends the changes after this revision
	stale   bool  // from was compacted: list again before watching
}

// printed is the last change printed of one object.
type printed[O any] struct {
	o   O
	rev int64 // of the change
}

// followWatch lists (printing what is there as ADDED) and then follows the changes from
// the listing's revision, printing each, until ctx ends (nil) or a failure no new
// stream can mend. A stream that breaks (allocd restarted, the connection lost) is
// opened again after a pause, from before the last change printed (one revision can
// hold the changes of many objects, committed together): the changes printed already
// are skipped. When that revision was compacted, it lists again and prints what
// changed since: DELETED for what is gone, ADDED or MODIFIED for the rest. An allocd
// out of reach at the start is said at once.
func followWatch[O, E proto.Message](ctx context.Context, s *session, k watchKind[O, E],
	p *eventPrinter[E]) error {
	w := &followed[O, E]{k: k, p: p, known: map[string]printed[O]{}, deleted: map[string]int64{}}
	if err := w.list(ctx); err != nil {
		return err
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
			fmt.Fprintf(s.err, "%s: revision %d was compacted; listing again\n", k.what, w.from)
			w.stale = true
			continue
		case !resumable(err):
			return s.fail(k.what, false, err)
		}
		if w.last != last || err == nil {
			failures = 0 // it went on for a while
		}
		d := min(firstResumeDelay<<min(failures, 8), maxResumeDelay)
		failures++
		fmt.Fprintf(s.err, "%s; watching again from revision %d in %s\n", errorLine(s, k.what, err), w.from,
			d)
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
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition,
		codes.OutOfRange, codes.Unimplemented, codes.Unauthenticated:
		return false
	}
	return true
}

// errorLine is err of what as Execute would print it, without "error: ".
func errorLine(s *session, what string, err error) string {
	var ce *callError
	if !errors.As(err, &ce) {
		ce = s.fail(what, false, err).(*callError)
	}
	return ce.line()
}

// follow opens one stream from w.from and prints its changes until it breaks.
func (w *followed[O, E]) follow(ctx context.Context) error {
	return w.k.watch(ctx, w.from, func(ev E) error {
		typ, o, rev := w.k.change(ev)
		key := w.k.key(o)
		if p, ok := w.known[key]; ok && p.rev >= rev || w.deleted[key] >= rev {
			return nil // printed before the stream broke
		}
		if rev > w.last {
			w.forgetDeleted(rev)
			w.last, w.from = rev, rev-1
		}
		w.record(key, typ, o, rev)
		w.p.add(ev)
		return w.p.flush()
	})
}

// list lists the objects and prints how they differ from what was printed: every
// object as ADDED the first time; after a compaction ADDED, MODIFIED or DELETED for
// what changed since. The changes after the listing's revision follow.
func (w *followed[O, E]) list(ctx context.Context) error {
	listed := map[string]bool{}
	rev, err := w.k.list(ctx, func(o O, rev int64) error {
		key := w.k.key(o)
		listed[key] = true
		typ := allocdv1.WatchEventType_WATCH_EVENT_TYPE_ADDED
		if p, ok := w.known[key]; ok {
			if proto.Equal(p.o, o) {
				return nil
			}
			typ = allocdv1.WatchEventType_WATCH_EVENT_TYPE_MODIFIED
		}
		w.record(key, typ, o, rev)
		w.p.add(w.k.event(typ, o, rev))
		return nil
	}, w.p.flush)
	if err != nil {
		return err
	}
	var gone []string
	for key := range w.known {
		if !listed[key] {
			gone = append(gone, key)
		}
	}
	slices.Sort(gone)
	for _, key := range gone {
		w.p.add(w.k.event(allocdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED, w.known[key].o, rev))
		delete(w.known, key)
	}
	clear(w.deleted) // a stream from rev sends no change of rev or before
	w.last, w.from, w.stale = rev, rev, false
	return w.p.flush()
}

// record notes the change of the object key as the last one printed.
func (w *followed[O, E]) record(key string, typ allocdv1.WatchEventType, o O, rev int64) {
	if typ == allocdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED {
		delete(w.known, key)
		w.deleted[key] = rev
		return
	}
	delete(w.deleted, key)
	w.known[key] = printed[O]{o: o, rev: rev}
}

// forgetDeleted drops the deletions no stream sends again: those before rev, once a
// change of rev arrived (a new stream starts at rev).
func (w *followed[O, E]) forgetDeleted(rev int64) {
	for key, r := range w.deleted {
		if r < rev {
			delete(w.deleted, key)
		}
	}
}

// eventPrinter prints watch events one line each, in a streamTable: the listing's
// pages aligned, and each change as soon as it arrives; -o json one line of JSON a
// change, -o yaml a document.
type eventPrinter[E proto.Message] struct {
	w       io.Writer
	format  string
	header  []string
	row     func(ev E, wide bool) (event string, cols []string)
	table   *streamTable
	pending []E
}

// add queues a change for flush.
func (p *eventPrinter[E]) add(ev E) { p.pending = append(p.pending, ev) }

// flush prints the changes queued.
func (p *eventPrinter[E]) flush() error {
	defer func() { p.pending = p.pending[:0] }()
	if p.format == outJSON || p.format == outYAML {
		for _, ev := range p.pending {
			if err := printEvent(p.w, p.format, ev); err != nil {
				return err
			}
		}
		return nil
	}
	if p.table == nil {
		p.table = &streamTable{w: p.w, widths: []int{len("MODIFIED") + 3}}
		p.table.add(append([]string{"EVENT"}, p.header...))
	}
	for _, ev := range p.pending {
		event, cols := p.row(ev, p.format == outWide)
		p.table.add(append([]string{strings.TrimPrefix(event, "WATCH_EVENT_TYPE_")}, cols...))
	}
	return p.table.flush()
}

// printEvent prints one change as one line of JSON, or as a YAML document.
func printEvent(w io.Writer, format string, ev proto.Message) error {
	if format == outYAML {
		if _, err := fmt.Fprintln(w, "---"); err != nil {
			return err
		}
		return printObject(w, outYAML, ev)
	}
	b, err := marshal(ev)
	if err == nil {
		_, err = fmt.Fprintf(w, "%s\n", b)
	}
	return err
}
