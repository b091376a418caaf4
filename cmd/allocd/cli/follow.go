package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/allocd/allocd/client"
)

// followWatch lists (printing what is there as ADDED) and then watches from the
// listing's revision until ctx ends (nil). When the stream breaks (allocd restarted,
// the connection lost), it watches again from the last revision it printed, as
// kubectl's watch does: the changes of that revision are asked for again, and those
// already printed are skipped (a revision's changes may reach the watcher one by
// one). When that revision was compacted away it lists again. Any other error ends
// it.
//
// watch calls seen with the revision and a key of every change it printed, and
// returns false from skip for the changes not to print.
func followWatch(ctx context.Context, s *session, what string, list func(context.Context) (int64, error),
	watch func(ctx context.Context, from int64, r *resume) error) error {
	rev, err := list(ctx)
	if err != nil {
		return err
	}
	r := &resume{last: rev}
	backoff := 250 * time.Millisecond
	for {
		from := r.last
		if r.keys != nil {
			from = r.last - 1 // ask again for the last revision's changes
		}
		err := watch(ctx, from, r)
		switch {
		case ctx.Err() != nil:
			return nil // interrupted: the way a watch ends
		case errors.Is(err, client.ErrCompacted):
			fmt.Fprintf(s.err, "%s: revision %d was compacted; listing again\n", what, r.last)
			if rev, err = list(ctx); err != nil {
				return err
			}
			r = &resume{last: rev}
			continue
		case errors.Is(err, client.ErrUnavailable):
			fmt.Fprintf(s.err, "%s: the stream broke (%v); watching again from revision %d\n", what, err,
				r.last)
		default:
			return s.fail(what, false, err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// resume is where a watch is: the last revision printed, and the keys of the changes
// of that revision already printed.
type resume struct {
	last int64
	keys map[string]bool
}

// skip reports whether the change of key at rev was printed already.
func (r *resume) skip(rev int64, key string) bool {
	return rev < r.last || rev == r.last && r.keys[key]
}

// seen records a change printed.
func (r *resume) seen(rev int64, key string) {
	if rev != r.last || r.keys == nil {
		r.last, r.keys = rev, map[string]bool{}
	}
	r.keys[key] = true
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
