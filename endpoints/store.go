package endpoints

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// This file reads one kind of stored object from etcd, for the reads of every replica
// (read.go) and the leader's views of what is stored (view.go): paged listings at one
// revision, watches resumable from a revision, and where a key's Service and name are.

// store reads one kind of stored object under prefix.
type store[T any] struct {
	cli    *clientv3.Client
	prefix string
	what   string // "endpoints", "endpoint slices": in errors
	// depth is the number of '/' in a key under prefix ("ns/name": 1; "ns/svc/name": 2).
	depth  int
	decode func(kv *mvccpb.KeyValue) (T, error)
	// exact reports whether a stored value goes to a watcher as it is stored (exact.go).
	exact func(b []byte) bool
}

// list returns a page of the objects under scope ("" for all, "ns", or "ns/svc").
func (s store[T]) list(ctx context.Context, scope string, pageSize int,
	pageToken string) (out []T, next string, rev int64, err error) {
	kvs, next, rev, err := s.listKVs(ctx, scope, pageSize, pageToken)
	if err != nil {
		return nil, "", 0, err
	}
	for _, kv := range kvs {
		o, err := s.decode(kv)
		if err != nil {
			return nil, "", 0, fmt.Errorf("list %s: %s: %w", s.what, kv.Key, err)
		}
		out = append(out, o)
	}
	return out, next, rev, nil
}

// listKVs is list of the stored key-values, not decoded.
func (s store[T]) listKVs(ctx context.Context, scope string, pageSize int,
	pageToken string) (out []*mvccpb.KeyValue, next string, rev int64, err error) {
	switch {
	case pageSize < 0:
		return nil, "", 0, &InvalidError{
			Violations: []violation{{Field: "page_size", Description: "must not be negative"}}}
	case pageSize == 0:
		pageSize = DefaultPageSize
	case pageSize > MaxPageSize:
		pageSize = MaxPageSize
	}
	prefix := s.prefix
	if scope != "" {
		prefix += scope + "/"
	}
	start, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(int64(pageSize) + 1)}
	if pageToken != "" {
		tok, err := parseToken(pageToken, scope)
		if err != nil {
			return nil, "", 0, err
		}
		start = s.prefix + tok.after + "\x00"
		opts = append(opts, clientv3.WithRev(tok.rev))
	}
	resp, err := s.cli.Get(ctx, start, opts...)
	if err != nil {
		if errors.Is(err, rpctypes.ErrCompacted) {
			return nil, "", 0, &CompactedError{Revision: tokenRev(pageToken, scope)}
		}
		return nil, "", 0, fmt.Errorf("list %s: %w", s.what, err)
	}
	rev = resp.Header.Revision
	if pageToken != "" {
		rev = tokenRev(pageToken, scope)
	}
	kvs := resp.Kvs
	more := len(kvs) > pageSize
	if more {
		kvs = kvs[:pageSize]
	}
	for _, kv := range kvs {
		if s.relKey(kv.Key) != "" {
			out = append(out, kv)
		}
	}
	if more && len(kvs) > 0 {
		next = token{rev: rev, scope: scope, after: s.relKey(kvs[len(kvs)-1].Key)}.String()
	}
	return out, next, rev, nil
}

// relKey is the key under prefix ("ns/name", "ns/svc/name"), "" when k is not one.
func (s store[T]) relKey(k []byte) string {
	r, ok := strings.CutPrefix(string(k), s.prefix)
	if !ok || strings.Count(r, "/") != s.depth {
		return ""
	}
	return r
}

// split returns the key of the Service of a stored key and the object's name among
// that Service's ("" for an Endpoints object: a Service has one); ok is false for a key
// that is not one of the kind's.
func (s store[T]) split(k []byte) (svcKey, name string, ok bool) {
	r := s.relKey(k)
	switch {
	case r == "":
		return "", "", false
	case s.depth == 1:
		return r, "", true
	}
	i := strings.LastIndexByte(r, '/')
	return r[:i], r[i+1:], true
}

// token is a List page token: the revision of the listing, the scope it lists, and the
// last key of the previous page.
type token struct {
	rev   int64
	scope string
	after string
}

func (t token) String() string {
	return base64.RawURLEncoding.EncodeToString(
		[]byte(strconv.FormatInt(t.rev, 10) + "\n" + t.scope + "\n" + t.after))
}

func parseToken(s, scope string) (token, error) {
	bad := func(why string) (token, error) {
		return token{}, &InvalidError{Violations: []violation{{Field: "page_token", Description: why}}}
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return bad("not a token this server issued")
	}
	parts := strings.SplitN(string(b), "\n", 3)
	if len(parts) != 3 {
		return bad("not a token this server issued")
	}
	rev, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil || rev <= 0 || parts[2] == "" {
		return bad("not a token this server issued")
	}
	if parts[1] != scope {
		return bad(fmt.Sprintf("issued for %q, not %q: pass the same namespace (and service) on every page",
			parts[1], scope))
	}
	return token{rev: rev, scope: parts[1], after: parts[2]}, nil
}

func tokenRev(s, scope string) int64 {
	t, err := parseToken(s, scope)
	if err != nil {
		return 0
	}
	return t.rev
}

// watch sends the changes of the objects under scope (see Controller.Watch).
func (s store[T]) watch(ctx context.Context, scope string, startRev int64,
	send func(WatchType, T, int64) error) error {
	return s.watchKVs(ctx, scope, startRev, func(t WatchType, kv *mvccpb.KeyValue, rev int64) error {
		o, err := s.decode(kv)
		if err != nil {
			return err
		}
		return send(t, o, rev)
	})
}

// watchStored is watch for a caller that sends the objects on in the API's form: an
// event carries the stored form when exact says it is exact, else the decoded object.
func (s store[T]) watchStored(ctx context.Context, scope string, startRev int64,
	send func(t WatchType, st *Stored, o T, rev int64) error) error {
	return s.watchKVs(ctx, scope, startRev, func(t WatchType, kv *mvccpb.KeyValue, rev int64) error {
		var zero T
		if s.exact(kv.Value) {
			return send(t, storedOf(kv), zero, rev)
		}
		o, err := s.decode(kv)
		if err != nil {
			return err
		}
		return send(t, nil, o, rev)
	})
}

func storedOf(kv *mvccpb.KeyValue) *Stored {
	return &Stored{Value: kv.Value, ModRevision: kv.ModRevision, CreateRevision: kv.CreateRevision}
}

// watchKVs is watch of the stored key-values, not decoded: for Deleted, the last one.
func (s store[T]) watchKVs(ctx context.Context, scope string, startRev int64,
	send func(WatchType, *mvccpb.KeyValue, int64) error) error {
	if startRev < 0 {
		return &InvalidError{
			Violations: []violation{{Field: "start_revision", Description: "must not be negative"}}}
	}
	if startRev == 0 {
		rev, err := s.sendAll(ctx, scope, send)
		if err != nil {
			return err
		}
		startRev = rev
	}
	prefix := s.prefix
	if scope != "" {
		prefix += scope + "/"
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	// Without WithPrevKV: etcd would read the previous value of every changed key for
	// it, where only a delete needs one (sendEvent reads it then).
	wch := s.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(startRev+1))
	for wr := range wch {
		if wr.CompactRevision != 0 {
			return &CompactedError{Revision: startRev, Compacted: wr.CompactRevision}
		}
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch %s: %w", s.what, err)
		}
		last := s.lastStates(wctx, wr.Events)
		for i, ev := range wr.Events {
			if err := s.sendEvent(wctx, ev, last[i], send); err != nil {
				return err
			}
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("watch %s: %w", s.what, ErrNotReady)
}

// sendAll sends every current object as Added, listing a page at a time at one
// revision, and returns that revision.
func (s store[T]) sendAll(ctx context.Context, scope string,
	send func(WatchType, *mvccpb.KeyValue, int64) error) (int64, error) {
	var rev int64
	tok := ""
	for {
		kvs, next, r, err := s.listKVs(ctx, scope, MaxPageSize, tok)
		if err != nil {
			return 0, err
		}
		rev = r
		for _, kv := range kvs {
			if err := send(Added, kv, kv.ModRevision); err != nil {
				return 0, err
			}
		}
		if next == "" {
			return rev, nil
		}
		tok = next
	}
}

// lastStatesPerTxn bounds the reads of one transaction of lastStates (etcd's
// --max-txn-ops is 128 by default).
const lastStatesPerTxn = 32

// lastStates reads the last state of each delete among evs (by position), a transaction
// per lastStatesPerTxn of them, each at the revision before its delete: one round trip
// for a namespace's worth of deletes instead of one per delete. A read that fails (a
// compacted revision, a smaller --max-txn-ops) leaves its deletes out; sendEvent reads
// those one by one and answers as it always did.
func (s store[T]) lastStates(ctx context.Context, evs []*clientv3.Event) map[int]*mvccpb.KeyValue {
	var at []int
	var ops []clientv3.Op
	out := map[int]*mvccpb.KeyValue{}
	flush := func() {
		if len(ops) == 0 {
			return
		}
		resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
		if err == nil {
			for j, r := range resp.Responses {
				if kvs := r.GetResponseRange().GetKvs(); len(kvs) == 1 {
					out[at[j]] = kvs[0]
				}
			}
		}
		at, ops = at[:0], ops[:0]
	}
	for i, ev := range evs {
		if ev.Type != mvccpb.DELETE || s.relKey(ev.Kv.Key) == "" {
			continue
		}
		at = append(at, i)
		ops = append(ops, clientv3.OpGet(string(ev.Kv.Key), clientv3.WithRev(ev.Kv.ModRevision-1)))
		if len(ops) == lastStatesPerTxn {
			flush()
		}
	}
	flush()
	return out
}

// sendEvent sends one etcd event of an object under the prefix; a delete with the
// object's last state (prev, read by lastStates, or read here at the revision before
// the delete when prev is nil).
func (s store[T]) sendEvent(ctx context.Context, ev *clientv3.Event, prev *mvccpb.KeyValue,
	send func(WatchType, *mvccpb.KeyValue, int64) error) error {
	if s.relKey(ev.Kv.Key) == "" {
		return nil
	}
	rev := ev.Kv.ModRevision
	if ev.Type == mvccpb.DELETE && prev != nil {
		return send(Deleted, prev, rev)
	}
	if ev.Type == mvccpb.DELETE {
		resp, err := s.cli.Get(ctx, string(ev.Kv.Key), clientv3.WithRev(rev-1))
		switch {
		case errors.Is(err, rpctypes.ErrCompacted) || err == nil && len(resp.Kvs) == 0:
			// The last state was compacted (an event at the compaction revision, or
			// read late): a Deleted event must carry it, so the watcher lists again
			// instead.
			return &CompactedError{Revision: rev - 1}
		case err != nil:
			return fmt.Errorf("watch %s: read the last state of %s: %w", s.what, ev.Kv.Key, err)
		}
		return send(Deleted, resp.Kvs[0], rev)
	}
	t := Modified
	if ev.IsCreate() {
		t = Added
	}
	return send(t, ev.Kv, rev)
}
