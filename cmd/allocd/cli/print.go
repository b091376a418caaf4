package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"
)

// newTable returns the tab writer of tables, with kubectl's spacing. Rows are
// tab-separated cells; Flush aligns what was written since the last Flush.
func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 6, 4, 3, ' ', 0) }

// row writes one row of cells.
func row(w io.Writer, cells ...string) { fmt.Fprintln(w, strings.Join(cells, "\t")) }

// writeIndented writes the JSON in b indented by two spaces. protojson's own
// whitespace is deliberately unstable from build to build; this is not.
func writeIndented(w io.Writer, b []byte) error {
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err := w.Write(out.Bytes())
	return err
}

// marshal returns m in the API's proto JSON, compact.
func marshal(m proto.Message) ([]byte, error) {
	b, err := protojson.Marshal(m)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// marshalYAML returns m in the API's proto JSON, as YAML.
func marshalYAML(m proto.Message) ([]byte, error) {
	b, err := marshal(m)
	if err != nil {
		return nil, err
	}
	return yaml.JSONToYAML(b)
}

// printObject writes m as -o json or yaml asks.
func printObject(w io.Writer, format string, m proto.Message) error {
	if format == outYAML {
		y, err := marshalYAML(m)
		if err != nil {
			return err
		}
		_, err = w.Write(y)
		return err
	}
	b, err := marshal(m)
	if err != nil {
		return err
	}
	return writeIndented(w, b)
}

// list writes the items of a paged listing as they arrive, without holding them: for
// -o json one document shaped as the List response ({"<field>": [...], "revision":
// "N"}, no page token), for -o yaml the same in YAML, for tables the rows of each page
// when the page ends, aligned with the pages before (see streamTable).
type list struct {
	w      io.Writer
	format string
	field  string // the items' field in the List response: "allocations"
	header []string
	row    func(m proto.Message, wide bool) []string
	table  *streamTable
	n      int
	rev    int64
}

// add writes one item; rev is the revision of its page.
func (l *list) add(m proto.Message, rev int64) error {
	if l.n == 0 {
		l.rev = rev
	}
	l.n++
	switch l.format {
	case outJSON:
		b, err := marshal(m)
		if err != nil {
			return err
		}
		var ind bytes.Buffer
		if err := json.Indent(&ind, b, "    ", "  "); err != nil {
			return err
		}
		sep := ",\n"
		if l.n == 1 {
			sep = fmt.Sprintf("{\n  %q: [\n", l.field)
		}
		_, err = fmt.Fprintf(l.w, "%s    %s", sep, ind.Bytes())
		return err
	case outYAML:
		return l.addYAML(m)
	}
	if l.table == nil {
		l.table = &streamTable{w: l.w}
		l.table.add(l.header)
	}
	l.table.add(l.row(m, l.format == outWide))
	return nil
}

func (l *list) addYAML(m proto.Message) error {
	y, err := marshalYAML(m)
	if err != nil {
		return err
	}
	if l.n == 1 {
		fmt.Fprintf(l.w, "%s:\n", l.field)
	}
	lines := strings.Split(strings.TrimSuffix(string(y), "\n"), "\n")
	for i, line := range lines {
		prefix := "  "
		if i == 0 {
			prefix = "- "
		}
		if _, err := fmt.Fprintln(l.w, prefix+line); err != nil {
			return err
		}
	}
	return nil
}

// page ends a page: table rows are aligned and written.
func (l *list) page() error {
	if l.table != nil {
		return l.table.flush()
	}
	return nil
}

// end ends the listing; rev is the revision of a listing without items. stderr gets
// "No … found." for an empty table.
func (l *list) end(stderr io.Writer, rev int64) error {
	if l.n == 0 {
		l.rev = rev
	}
	switch {
	case l.format == outJSON && l.n == 0:
		_, err := fmt.Fprintf(l.w, "{\n  %q: [],\n  \"revision\": \"%d\"\n}\n", l.field, l.rev)
		return err
	case l.format == outJSON:
		_, err := fmt.Fprintf(l.w, "\n  ],\n  \"revision\": \"%d\"\n}\n", l.rev)
		return err
	case l.format == outYAML && l.n == 0:
		_, err := fmt.Fprintf(l.w, "%s: []\nrevision: \"%d\"\n", l.field, l.rev)
		return err
	case l.format == outYAML:
		_, err := fmt.Fprintf(l.w, "revision: \"%d\"\n", l.rev)
		return err
	case l.n == 0:
		fmt.Fprintf(stderr, "No %s found.\n", l.field)
		return nil
	}
	return l.page()
}

// cut ends a listing that failed at the page of token (its request's page token): for
// -o json or yaml, when items were written, it closes the document so that it stays
// one valid document of what was fetched, with "nextPageToken" set to token, as the
// List response of a page that has more after it (a listing can go on from there);
// nothing is written for a listing that wrote nothing, nor for tables, whose rows are
// complete lines. It returns err, which Execute prints on stderr.
func (l *list) cut(token string, err error) error {
	if l.n == 0 {
		return err
	}
	switch l.format {
	case outJSON:
		fmt.Fprintf(l.w, "\n  ],\n  \"nextPageToken\": %q,\n  \"revision\": \"%d\"\n}\n", token, l.rev)
	case outYAML:
		fmt.Fprintf(l.w, "nextPageToken: %q\nrevision: \"%d\"\n", token, l.rev)
	}
	return err
}

// streamTable is a table printed a batch of rows at a time (a page of a listing, a
// change of a watch) without holding what was printed: each column is as wide as its
// widest cell so far, so a batch is aligned with the batches before it unless one of
// its cells is wider than any before.
type streamTable struct {
	w       io.Writer
	widths  []int
	pending [][]string
}

// add queues a row for flush.
func (t *streamTable) add(cells []string) { t.pending = append(t.pending, cells) }

// flush writes the rows queued.
func (t *streamTable) flush() error {
	defer func() { t.pending = t.pending[:0] }()
	for _, r := range t.pending {
		for i, c := range r {
			if i == len(t.widths) {
				t.widths = append(t.widths, 0)
			}
			t.widths[i] = max(t.widths[i], len(c)+3) // kubectl's padding
		}
	}
	var b strings.Builder
	for _, r := range t.pending {
		for i, c := range r {
			if i == len(r)-1 {
				b.WriteString(c)
			} else {
				fmt.Fprintf(&b, "%-*s", t.widths[i], c)
			}
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(t.w, b.String())
	return err
}

// bar draws how full a range is: 20 marks and the percentage. A range with anything
// used shows at least "<1%", one with anything free at most "99%".
func bar(used, size uint64) string {
	const width = 20
	if size == 0 {
		return "[" + strings.Repeat("-", width) + "]"
	}
	filled := int(min(used, size) * width / size)
	pct := fmt.Sprintf("%d%%", min(used, size)*100/size)
	switch {
	case used > 0 && used*100 < size:
		pct = "<1%"
	case used < size && used*100/size == 100:
		pct = "99%"
	}
	return fmt.Sprintf("[%s%s] %4s", strings.Repeat("#", filled), strings.Repeat("-", width-filled), pct)
}

// age says how long ago t was, as kubectl's AGE column does ("<unknown>" without t).
func age(t *timestamppb.Timestamp, now time.Time) string {
	if t == nil {
		return "<unknown>"
	}
	return humanDuration(now.Sub(t.AsTime()))
}

// humanDuration is d in the short form of kubectl's AGE column: 45s, 3m20s, 5h, 12d.
func humanDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	s := int64(d / time.Second)
	m, h, days := s/60, s/3600, s/86400
	switch {
	case s < 120:
		return fmt.Sprintf("%ds", s)
	case m < 10 && s%60 != 0:
		return fmt.Sprintf("%dm%ds", m, s%60)
	case h < 3:
		return fmt.Sprintf("%dm", m)
	case h < 8 && m%60 != 0:
		return fmt.Sprintf("%dh%dm", h, m%60)
	case h < 48:
		return fmt.Sprintf("%dh", h)
	case days < 8 && h%24 != 0:
		return fmt.Sprintf("%dd%dh", days, h%24)
	case days < 2*365:
		return fmt.Sprintf("%dd", days)
	}
	return fmt.Sprintf("%dy", days/365)
}

// timestamp writes t as RFC 3339 in UTC with its age ("<none>" without t).
func timestamp(t *timestamppb.Timestamp, now time.Time) string {
	if t == nil {
		return "<none>"
	}
	return fmt.Sprintf("%s (%s ago)", rfc3339(t), age(t, now))
}

// rfc3339 writes t as RFC 3339 in UTC ("<none>" without t).
func rfc3339(t *timestamppb.Timestamp) string {
	if t == nil {
		return "<none>"
	}
	return t.AsTime().UTC().Format(time.RFC3339)
}

// orNone is s, or "<none>" when s is empty.
func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}
