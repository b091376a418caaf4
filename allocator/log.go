package allocator

import (
	"context"
	"log/slog"
	"strconv"
)

// Every write of the allocator is logged at info, one line per request (not per
// item), once etcd committed it: the attributes are built only then, and only when
// the logger is enabled at info. Replays and no-ops write nothing and log nothing.
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
func itemAttrs(attrs []slog.Attr, items func(yield func(Item) bool)) []slog.Attr {
	var ips, ports []byte
	for it := range items {
		if it.Kind == KindClusterIP {
			if len(ips) > 0 {
				ips = append(ips, ',')
			}
			ips = it.Addr.AppendTo(ips)
		} else {
			if len(ports) > 0 {
				ports = append(ports, ',')
			}
			ports = strconv.AppendInt(ports, int64(it.Port), 10)
		}
	}
	if len(ips) > 0 {
		attrs = append(attrs, slog.String("cluster_ips", string(ips)))
	}
	if len(ports) > 0 {
		attrs = append(attrs, slog.String("node_ports", string(ports)))
	}
	return attrs
}

func pickItems(picks []*pick) func(yield func(Item) bool) {
	return func(yield func(Item) bool) {
		for _, p := range picks {
			if !yield(p.item) {
				return
			}
		}
	}
}

func listItems(items []Item) func(yield func(Item) bool) {
	return func(yield func(Item) bool) {
		for _, it := range items {
			if !yield(it) {
				return
			}
		}
	}
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

// logAllocated logs a committed Allocate.
func (a *Allocator) logAllocated(ctx context.Context, o *op, rev int64) {
	var ranges []byte
	for i, p := range o.picks {
		if i > 0 && p.r == o.picks[i-1].r {
			continue
		}
		if len(ranges) > 0 {
			ranges = append(ranges, ',')
		}
		ranges = append(ranges, p.r.name...)
	}
	attrs := make([]slog.Attr, 0, 7)
	attrs = ownerAttrs(attrs, "", o.owner)
	attrs = append(attrs, slog.String("ranges", string(ranges)))
	attrs = itemAttrs(attrs, pickItems(o.picks))
	attrs = append(attrs, slog.Int64("revision", rev))
	a.log.LogAttrs(ctx, slog.LevelInfo, "allocated", attrs...)
}

// logAssigned logs a committed Assign.
func (a *Allocator) logAssigned(ctx context.Context, o *op, rev int64) {
	p := o.picks[0]
	attrs := ownerAttrs(make([]slog.Attr, 0, 6), "", o.owner)
	attrs = append(attrs, slog.String("range", p.r.name))
	attrs = itemAttrs(attrs, pickItems(o.picks))
	attrs = append(attrs, slog.Int64("revision", rev))
	a.log.LogAttrs(ctx, slog.LevelInfo, "assigned", attrs...)
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
	attrs = itemAttrs(attrs, listItems(items))
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
	attrs = itemAttrs(attrs, listItems([]Item{al.Item}))
	attrs = append(attrs, slog.Int64("revision", rev), slog.Int64("if_mod_revision", al.ModRevision))
	a.log.LogAttrs(ctx, slog.LevelInfo, msg, attrs...)
}
