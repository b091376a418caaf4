package allocator

import (
	"context"
	"log/slog"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"
)

// Every write of the allocator is logged at info, one line per request (not per
// item), once etcd committed it: the attributes are built only then, and only when
// the logger is enabled at info. Replays and no-ops write nothing and log nothing; a
// full release of an owner that holds nothing writes a tombstone anew (epoch.go) and
// logs nothing.
// Keys are flat (a group costs the text handler twice as much per line) and in
// snake_case, as the API's fields and repair's lines.

// ownerAttrs appends o as namespace, name and uid, each key after prefix.
func ownerAttrs(attrs []slog.Attr, prefix string, o Owner) []slog.Attr {
	if prefix == "" {
		return append(attrs, slog.String("namespace", o.Namespace), slog.String("name", o.Name),
			slog.String("uid", o.UID))
	}
	return append(attrs, slog.String(prefix+"namespace", o.Namespace), slog.String(prefix+"name", o.Name),
		slog.String(prefix+"uid", o.UID))
}

// itemAttrs appends the cluster_ips and node_ports attributes of items (each a
// comma-separated list, left out when empty).
func itemAttrs(attrs []slog.Attr, items []Item) []slog.Attr {
	var ipBuf, portBuf [64]byte // the lists, on the stack for all but long ones
	ips, ports := ipBuf[:0], portBuf[:0]
	for _, it := range items {
		ips, ports = appendItem(ips, ports, it)
	}
	return listAttrs(attrs, ips, ports)
}

// pickAttrs is itemAttrs of the picks' items.
func pickAttrs(attrs []slog.Attr, picks []*pick) []slog.Attr {
	var ipBuf, portBuf [64]byte
	ips, ports := ipBuf[:0], portBuf[:0]
	for _, p := range picks {
		ips, ports = appendItem(ips, ports, p.item)
	}
	return listAttrs(attrs, ips, ports)
}

// appendItem appends it to the list of its kind: ips or ports.
func appendItem(ips, ports []byte, it Item) ([]byte, []byte) {
	if it.Kind == KindClusterIP {
		if len(ips) > 0 {
			ips = append(ips, ',')
		}
		return it.Addr.AppendTo(ips), ports
	}
	if len(ports) > 0 {
		ports = append(ports, ',')
	}
	return ips, strconv.AppendInt(ports, int64(it.Port), 10)
}

// listAttrs appends the cluster_ips and node_ports attributes, each unless empty.
func listAttrs(attrs []slog.Attr, ips, ports []byte) []slog.Attr {
	if len(ips) > 0 {
		attrs = append(attrs, slog.String("cluster_ips", string(ips)))
	}
	if len(ports) > 0 {
		attrs = append(attrs, slog.String("node_ports", string(ports)))
	}
	return attrs
}

// logWrite logs op o that committed at rev, if it wrote anything. The op's caller
// may have its reply already: o is only read.
func (a *Allocator) logWrite(ctx context.Context, o *op, rev int64) {
	wrote := o.putRecord
	for _, p := range o.picks {
		wrote = wrote || !p.held
	}
	if !wrote || !a.log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	if o.assign {
		a.logAssigned(ctx, o, rev)
	} else {
		a.logAllocated(ctx, o, rev)
	}
}

// logAllocated logs a committed Allocate. It hands its record to the handler itself,
// as slog's doc shows for wrappers of its output methods, with the program counter
// found on its first line rather than on every one (runtime.Callers was a fifth of a
// line's cost): a handler that adds the source names logAllocated, as it did.
// logWrite checked that the logger is enabled at info.
func (a *Allocator) logAllocated(ctx context.Context, o *op, rev int64) {
	pc := allocatedPC.Load()
	if pc == 0 {
		var pcs [1]uintptr
		runtime.Callers(1, pcs[:])
		pc = pcs[0]
		allocatedPC.Store(pc)
	}
	var attrs [7]slog.Attr // on the stack: AddAttrs copies them into the record
	line := ownerAttrs(attrs[:0], "", o.owner)
	line = append(line, slog.String("ranges", pickRanges(o.picks)))
	line = pickAttrs(line, o.picks)
	line = append(line, slog.Int64("revision", rev))
	r := slog.NewRecord(time.Now(), slog.LevelInfo, "allocated", pc)
	r.AddAttrs(line...)
	// A handler's error is dropped, as slog.Logger's own output methods drop it: there
	// is nowhere else to log it.
	_ = a.log.Handler().Handle(ctx, r)
}

// allocatedPC is logAllocated's program counter, once its first line found it.
var allocatedPC atomic.Uintptr

// pickRanges is the names of the picks' ranges, comma-separated, a name once for a
// run of picks from one range: the name itself, not a copy, for a single range.
func pickRanges(picks []*pick) string {
	if len(picks) == 0 {
		return ""
	}
	var buf [128]byte
	joined := buf[:0]
	for i, p := range picks[1:] {
		if p.r == picks[i].r {
			continue
		}
		if len(joined) == 0 {
			joined = append(joined, picks[0].r.name...)
		}
		joined = append(append(joined, ','), p.r.name...)
	}
	if len(joined) == 0 {
		return picks[0].r.name
	}
	return string(joined)
}

// logAssigned logs a committed Assign.
func (a *Allocator) logAssigned(ctx context.Context, o *op, rev int64) {
	p := o.picks[0]
	var attrs [6]slog.Attr
	line := ownerAttrs(attrs[:0], "", o.owner)
	line = append(line, slog.String("range", p.r.name))
	line = pickAttrs(line, o.picks)
	line = append(line, slog.Int64("revision", rev))
	a.log.LogAttrs(ctx, slog.LevelInfo, "assigned", line...)
}

// logReleased logs a committed Release; holders are the other owners that held
// released items (force).
func (a *Allocator) logReleased(ctx context.Context, o Owner, items []Item, holders []string, rev int64,
	force bool) {
	if !a.log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	attrs := make([]slog.Attr, 0, 8)
	if o.UID != "" {
		attrs = ownerAttrs(attrs, "", o)
	}
	attrs = itemAttrs(attrs, items)
	attrs = append(attrs, slog.Int64("revision", rev), slog.Bool("force", force))
	if len(holders) > 0 {
		attrs = append(attrs, slog.Any("holder_uids", holders))
	}
	a.log.LogAttrs(ctx, slog.LevelInfo, "released", attrs...)
}

// logConditional logs a committed ReleaseIf (to is nil) or Reassign.
func (a *Allocator) logConditional(ctx context.Context, al Allocation, to *Owner, rev int64) {
	if !a.log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	msg := "released"
	attrs := ownerAttrs(make([]slog.Attr, 0, 9), "", al.Owner)
	if to != nil {
		msg = "reassigned"
		attrs = ownerAttrs(attrs, "to_", *to)
	}
	attrs = itemAttrs(attrs, []Item{al.Item})
	attrs = append(attrs, slog.Int64("revision", rev), slog.Int64("if_mod_revision", al.ModRevision))
	a.log.LogAttrs(ctx, slog.LevelInfo, msg, attrs...)
}

// logTransferred logs a committed Transfer of moved from from to to.
func (a *Allocator) logTransferred(ctx context.Context, from, to Owner, moved []Item, rev int64) {
	if !a.log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	attrs := ownerAttrs(make([]slog.Attr, 0, 9), "", from)
	attrs = ownerAttrs(attrs, "to_", to)
	attrs = itemAttrs(attrs, moved)
	attrs = append(attrs, slog.Int64("revision", rev))
	a.log.LogAttrs(ctx, slog.LevelInfo, "transferred", attrs...)
}
