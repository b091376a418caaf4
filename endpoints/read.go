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

// Get returns the stored Endpoints of namespace/name (a linearizable read), or
// ErrNotFound.
func (c *Controller) Get(ctx context.Context, namespace, name string) (*Endpoints, error) {
	if err := validName(namespace, name); err != nil {
		return nil, err
	}
	resp, err := c.cli.Get(ctx, c.etcdKey(namespace+"/"+name))
	if err != nil {
		return nil, fmt.Errorf("read endpoints %s/%s: %w", namespace, name, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: %s/%s", ErrNotFound, namespace, name)
	}
	kv := resp.Kvs[0]
	return decode(kv.Value, kv.ModRevision, kv.CreateRevision)
}

// validName refuses names that would escape their place in the key space.
func validName(namespace, name string) error {
	inv := &InvalidError{}
	if namespace == "" || strings.Contains(namespace, "/") {
		inv.Add("namespace", "must be a non-empty name without '/'")
	}
	if name == "" || strings.Contains(name, "/") {
		inv.Add("name", "must be a non-empty name without '/'")
	}
	return inv.OrNil()
}

// List returns up to pageSize objects (0: DefaultPageSize; capped at MaxPageSize) of
// namespace ("" for all), sorted by namespace and name, after pageToken. Every page of
// one listing is read at the revision of the first (returned), so that a listing is
// one consistent state; a page whose revision was compacted meanwhile is a
// *CompactedError. next is "" on the last page.
func (c *Controller) List(ctx context.Context, namespace string, pageSize int,
	pageToken string) (eps []*Endpoints, next string, rev int64, err error) {
	if namespace != "" && strings.Contains(namespace, "/") {
		return nil, "", 0, &InvalidError{
			Violations: []violation{{Field: "namespace", Description: "must not contain '/'"}}}
	}
	switch {
	case pageSize < 0:
		return nil, "", 0, &InvalidError{
			Violations: []violation{{Field: "page_size", Description: "must not be negative"}}}
	case pageSize == 0:
		pageSize = DefaultPageSize
	case pageSize > MaxPageSize:
		pageSize = MaxPageSize
	}
	prefix := c.prefix
	if namespace != "" {
		prefix += namespace + "/"
	}
	start, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(int64(pageSize) + 1)}
	if pageToken != "" {
		tok, err := parseToken(pageToken, namespace)
		if err != nil {
			return nil, "", 0, err
		}
		start = c.etcdKey(tok.after) + "\x00"
		opts = append(opts, clientv3.WithRev(tok.rev))
	}
	resp, err := c.cli.Get(ctx, start, opts...)
	if err != nil {
		if errors.Is(err, rpctypes.ErrCompacted) {
			return nil, "", 0, &CompactedError{Revision: tokenRev(pageToken, namespace)}
		}
		return nil, "", 0, fmt.Errorf("list endpoints: %w", err)
	}
	rev = resp.Header.Revision
	if pageToken != "" {
		rev = tokenRev(pageToken, namespace)
	}
	kvs := resp.Kvs
	more := len(kvs) > pageSize
	if more {
		kvs = kvs[:pageSize]
	}
	for _, kv := range kvs {
		key := c.objectKey(kv.Key)
		if key == "" {
			continue
		}
		e, err := decode(kv.Value, kv.ModRevision, kv.CreateRevision)
		if err != nil {
			return nil, "", 0, fmt.Errorf("list endpoints: %s: %w", kv.Key, err)
		}
		eps = append(eps, e)
	}
	if more && len(kvs) > 0 {
		next = token{rev: rev, namespace: namespace, after: c.objectKey(kvs[len(kvs)-1].Key)}.String()
	}
	return eps, next, rev, nil
}

// token is a List page token: the revision of the listing, the namespace it lists, and
// the last key of the previous page.
type token struct {
	rev       int64
	namespace string
	after     string
}

func (t token) String() string {
	return base64.RawURLEncoding.EncodeToString(
		[]byte(strconv.FormatInt(t.rev, 10) + "\n" + t.namespace + "\n" + t.after))
}

func parseToken(s, namespace string) (token, error) {
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
	if parts[1] != namespace {
		return bad(fmt.Sprintf("issued for namespace %q, not %q: pass the same namespace on every page",
			parts[1], namespace))
	}
	return token{rev: rev, namespace: parts[1], after: parts[2]}, nil
}

func tokenRev(s, namespace string) int64 {
	t, err := parseToken(s, namespace)
	if err != nil {
		return 0
	}
	return t.rev
}

// Watch sends the changes of the stored objects of namespace ("" for all) to send: with
// startRev 0, first every current object as Added (read at one revision R), then the
// changes after R; with startRev N, the changes after N. It returns when ctx ends (nil),
// when send fails (its error), with a *CompactedError when the history it needs was
// compacted, or with the watch's error (etcd unreachable, no leader): the caller then
// watches again from the last revision it got.
func (c *Controller) Watch(ctx context.Context, namespace string, startRev int64,
	send func(WatchEvent) error) error {
	if namespace != "" && strings.Contains(namespace, "/") {
		return &InvalidError{
			Violations: []violation{{Field: "namespace", Description: "must not contain '/'"}}}
	}
	if startRev < 0 {
		return &InvalidError{
			Violations: []violation{{Field: "start_revision", Description: "must not be negative"}}}
	}
	if startRev == 0 {
		rev, err := c.sendAll(ctx, namespace, send)
		if err != nil {
			return err
		}
		startRev = rev
	}
	prefix := c.prefix
	if namespace != "" {
		prefix += namespace + "/"
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := c.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(startRev+1),
		clientv3.WithPrevKV())
	for wr := range wch {
		if wr.CompactRevision != 0 {
			return &CompactedError{Revision: startRev, Compacted: wr.CompactRevision}
		}
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch endpoints: %w", err)
		}
		for _, ev := range wr.Events {
			we, ok, err := c.watchEvent(ev)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			if err := send(we); err != nil {
				return err
			}
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("watch endpoints: %w", ErrNotReady)
}

// sendAll sends every current object as Added, listing a page at a time at one
// revision, and returns that revision.
func (c *Controller) sendAll(ctx context.Context, namespace string,
	send func(WatchEvent) error) (int64, error) {
	var rev int64
	tok := ""
	for {
		eps, next, r, err := c.List(ctx, namespace, MaxPageSize, tok)
		if err != nil {
			return 0, err
		}
		rev = r
		for _, e := range eps {
			if err := send(WatchEvent{Type: Added, Endpoints: e, Revision: e.Revision}); err != nil {
				return 0, err
			}
		}
		if next == "" {
			return rev, nil
		}
		tok = next
	}
}

func (c *Controller) watchEvent(ev *clientv3.Event) (WatchEvent, bool, error) {
	if c.objectKey(ev.Kv.Key) == "" {
		return WatchEvent{}, false, nil
	}
	rev := ev.Kv.ModRevision
	if ev.Type == mvccpb.DELETE {
		e := &Endpoints{}
		if ev.PrevKv != nil {
			var err error
			if e, err = decode(ev.PrevKv.Value, ev.PrevKv.ModRevision, ev.PrevKv.CreateRevision); err != nil {
				return WatchEvent{}, false, err
			}
		} else {
			// etcd drops the previous value when its revision was compacted (an event
			// at the compaction revision, or sent late): a Deleted event must carry the
			// last state, so the watcher lists again instead.
			return WatchEvent{}, false, &CompactedError{Revision: ev.Kv.ModRevision - 1}
		}
		return WatchEvent{Type: Deleted, Endpoints: e, Revision: rev}, true, nil
	}
	e, err := decode(ev.Kv.Value, ev.Kv.ModRevision, ev.Kv.CreateRevision)
	if err != nil {
		return WatchEvent{}, false, err
	}
	t := Modified
	if ev.IsCreate() {
		t = Added
	}
	return WatchEvent{Type: t, Endpoints: e, Revision: rev}, true, nil
}
