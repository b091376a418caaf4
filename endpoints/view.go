package endpoints

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/etcd/watch"
)

// view is a term's view of one kind of stored object (the Endpoints objects, the
// EndpointSlices): what etcd holds under the kind's prefix as the term last saw it, by
// the key of the objects' Service and the object's name, each state with the revision
// it was seen at, so that an older sight never overwrites a newer one. Four things
// keep it current:
//
//   - a listing merged (mergeListed): at the start of a term and after a broken watch;
//   - a watch event applied (applyEvent): others' writes, and the term's own, which
//     the view knows already;
//   - a commit recorded (committed, by the committer): the term's own writes, at once;
//   - a failed commit: what etcd holds after a conflict (refresh), or the mark of a
//     write whose outcome is unknown (unknown), read again before the Service's next
//     sync (reloadUnsure).
//
// A Service whose objects someone else deleted (or, with foreignPuts, wrote) is passed
// to changed, which queues it again: its sync puts them right. The view's store[T] says
// where the kind lives and how it decodes; what else differs between the kinds is in
// the functions a view is built with (newEndpointsView, newSlicesView). T is a pointer
// type; its zero value (nil) is "no object". It is safe for concurrent use.
type view[T comparable] struct {
	store[T]
	log *slog.Logger
	// unreadable is what the view keeps of a stored value that does not decode (err),
	// after logging it: ok false keeps nothing.
	unreadable func(kv *mvccpb.KeyValue, err error) (obj T, ok bool)
	// stamp is a copy of obj with the etcd revisions of its write.
	stamp func(obj T, modRev, createRev int64) T
	// foreignPuts: someone else's put is a change to put right too, not only a delete.
	foreignPuts bool
	// changed is told the key of a Service whose stored objects changed under the
	// term.
	changed func(svcKey string)
	// metrics counts the stored values that do not decode and the watches that fail.
	metrics viewMetrics

	mu     sync.Mutex
	seen   map[string]sights[T] // by Service key
	unsure map[string]bool      // Service keys with a write of unknown outcome
	listed chan struct{}        // closed once the first listing is merged
}

// sight is what etcd held for a key at rev: obj (nil when nothing), and the revision
// of that sight (the object's ModRevision, or of its delete, or of a read that found
// nothing).
type sight[T any] struct {
	obj T
	rev int64
}

// sights are what a view saw of the objects of one Service, by name. The object named
// "" (an Endpoints object: a Service has one) is kept apart from the map, so that a kind
// of one object per Service costs no map per Service (10,000 Services: 10,000 maps).
type sights[T any] struct {
	unnamed    sight[T]
	hasUnnamed bool
	named      map[string]sight[T]
}

func (s *sights[T]) get(name string) (sight[T], bool) {
	if name == "" {
		return s.unnamed, s.hasUnnamed
	}
	st, ok := s.named[name]
	return st, ok
}

func (s *sights[T]) set(name string, st sight[T]) {
	if name == "" {
		s.unnamed, s.hasUnnamed = st, true
		return
	}
	if s.named == nil {
		s.named = map[string]sight[T]{}
	}
	s.named[name] = st
}

// all calls fn with every name and what was seen of it, in no order.
func (s *sights[T]) all(fn func(name string, st sight[T])) {
	if s.hasUnnamed {
		fn("", s.unnamed)
	}
	for name, st := range s.named {
		fn(name, st)
	}
}

func newView[T comparable](s store[T], log *slog.Logger) *view[T] {
	return &view[T]{store: s, log: log, seen: map[string]sights[T]{}, unsure: map[string]bool{},
		listed: make(chan struct{}), changed: func(string) {}}
}

// span is what holds the stored objects of a Service: its one key (no options), or the
// prefix of its objects.
func (v *view[T]) span(svcKey string) (string, []clientv3.OpOption) {
	if v.depth == 1 {
		return v.prefix + svcKey, nil
	}
	return v.prefix + svcKey + "/", []clientv3.OpOption{clientv3.WithPrefix()}
}

// read decodes kv, or makes of it what unreadable says.
func (v *view[T]) read(kv *mvccpb.KeyValue) (T, bool) {
	o, err := v.decode(kv)
	if err != nil {
		if v.metrics.unreadable != nil {
			v.metrics.unreadable.Inc()
		}
		return v.unreadable(kv, err)
	}
	return o, true
}

// see records the state of an object at rev, unless the view saw a newer one; it
// reports whether it did.
func (v *view[T]) see(svcKey, name string, obj T, rev int64) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	s := v.seen[svcKey]
	if cur, ok := s.get(name); ok && cur.rev >= rev {
		return false
	}
	s.set(name, sight[T]{obj: obj, rev: rev})
	v.seen[svcKey] = s
	return true
}

// saw reports whether the view has seen the object at rev or later.
func (v *view[T]) saw(svcKey, name string, rev int64) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	s := v.seen[svcKey]
	cur, ok := s.get(name)
	return ok && cur.rev >= rev
}

// get returns what etcd holds for an object, as the view last saw it.
func (v *view[T]) get(svcKey, name string) sight[T] {
	v.mu.Lock()
	defer v.mu.Unlock()
	s := v.seen[svcKey]
	st, _ := s.get(name)
	return st
}

// objects returns the stored objects of a Service, sorted by name.
func (v *view[T]) objects(svcKey string) []T {
	var zero T
	v.mu.Lock()
	defer v.mu.Unlock()
	s := v.seen[svcKey]
	var names []string
	s.all(func(name string, st sight[T]) {
		if st.obj != zero {
			names = append(names, name)
		}
	})
	slices.Sort(names)
	out := make([]T, 0, len(names))
	for _, name := range names {
		st, _ := s.get(name)
		out = append(out, st.obj)
	}
	return out
}

// names returns the names of the stored objects of a Service, as their keys spell them
// (a stored value may carry another name, or none).
func (v *view[T]) names(svcKey string) map[string]bool {
	var zero T
	v.mu.Lock()
	defer v.mu.Unlock()
	s := v.seen[svcKey]
	out := map[string]bool{}
	s.all(func(name string, st sight[T]) {
		if st.obj != zero {
			out[name] = true
		}
	})
	return out
}

// keys returns the keys of the Services that have a stored object, not of those whose
// objects the view saw deleted (by the term, or by someone else: that queued them).
func (v *view[T]) keys() []string {
	var zero T
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []string
	for svcKey, s := range v.seen {
		present := false
		s.all(func(_ string, st sight[T]) { present = present || st.obj != zero })
		if present {
			out = append(out, svcKey)
		}
	}
	return out
}

// each calls fn with every stored object, under the view's lock.
func (v *view[T]) each(fn func(T)) {
	var zero T
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, s := range v.seen {
		s.all(func(_ string, st sight[T]) {
			if st.obj != zero {
				fn(st.obj)
			}
		})
	}
}

// committed records a write of obj (nil: a delete) at key, which committed at rev
// over an object created at createRev (0: none) (storedView).
func (v *view[T]) committed(key string, obj any, createRev, rev int64) {
	svcKey, name, _ := v.split([]byte(key))
	var o T
	if obj != nil {
		if createRev == 0 {
			createRev = rev
		}
		o = v.stamp(obj.(T), rev, createRev)
	}
	v.see(svcKey, name, o, rev)
}

// refresh records what etcd holds for key after a failed commit: kv, or nothing at rev
// (storedView).
func (v *view[T]) refresh(key string, kv *mvccpb.KeyValue, rev int64) {
	svcKey, name, _ := v.split([]byte(key))
	var zero T
	if kv == nil {
		v.see(svcKey, name, zero, rev)
		return
	}
	if o, ok := v.read(kv); ok {
		v.see(svcKey, name, o, kv.ModRevision)
	}
}

// unknown marks the Service of key, whose write may or may not have committed: its
// objects are read again before its next sync (storedView).
func (v *view[T]) unknown(key string) {
	svcKey, _, _ := v.split([]byte(key))
	v.mu.Lock()
	v.unsure[svcKey] = true
	v.mu.Unlock()
}

// reloadUnsure reads the stored objects of a Service again when a write of theirs had
// an unknown outcome, so that its sync builds on what etcd has, not on what the term
// last knew.
func (v *view[T]) reloadUnsure(ctx context.Context, svcKey string) error {
	v.mu.Lock()
	unsure := v.unsure[svcKey]
	v.mu.Unlock()
	if !unsure {
		return nil
	}
	key, opts := v.span(svcKey)
	resp, err := v.cli.Get(ctx, key, opts...)
	if err != nil {
		return fmt.Errorf("read %s again after a write of unknown outcome: %w", key, err)
	}
	rev := resp.Header.Revision
	if len(opts) == 0 && len(resp.Kvs) == 0 {
		v.refresh(key, nil, rev) // the Service's one key holds nothing at rev
	}
	found := map[string]bool{}
	for _, kv := range resp.Kvs {
		if sk, name, ok := v.split(kv.Key); ok && sk == svcKey {
			found[name] = true
			v.refresh(string(kv.Key), kv, rev)
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	s := v.seen[svcKey]
	s.all(func(name string, cur sight[T]) {
		if !found[name] && cur.rev <= rev {
			s.set(name, sight[T]{rev: rev})
		}
	})
	v.seen[svcKey] = s
	delete(v.unsure, svcKey)
	return nil
}

// run lists the stored objects, then watches them, until ctx ends; after a broken
// watch (logged at warning by watch.Loop, and counted) it lists again.
func (v *view[T]) run(ctx context.Context) error {
	watch.Loop(ctx, v.log, v.what+" watch", 5*time.Second, func(ctx context.Context) error {
		err := v.listAndWatch(ctx)
		if ctx.Err() == nil && v.metrics.restarts != nil {
			v.metrics.restarts.Inc()
		}
		return err
	})
	return nil
}

func (v *view[T]) listAndWatch(ctx context.Context) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	resp, err := v.cli.Get(wctx, v.prefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("list %s: %w", v.what, err)
	}
	rev := resp.Header.Revision
	listed := map[string]map[string]sight[T]{}
	for _, kv := range resp.Kvs {
		svcKey, name, ok := v.split(kv.Key)
		if !ok {
			continue
		}
		o, ok := v.read(kv)
		if !ok {
			continue
		}
		if listed[svcKey] == nil {
			listed[svcKey] = map[string]sight[T]{}
		}
		listed[svcKey][name] = sight[T]{obj: o, rev: kv.ModRevision}
	}
	gone := v.mergeListed(listed, rev)
	select {
	case <-v.listed:
		for _, k := range gone {
			v.changed(k)
		}
	default:
		close(v.listed)
	}
	wch := v.cli.Watch(wctx, v.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch %s: %w", v.what, err)
		}
		for _, ev := range wr.Events {
			v.applyEvent(ev)
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.New("watch " + v.what + ": channel closed")
}

// mergeListed folds a listing at rev into the view and returns the keys of the Services
// that lost an object.
func (v *view[T]) mergeListed(listed map[string]map[string]sight[T], rev int64) []string {
	for svcKey, byName := range listed {
		for name, s := range byName {
			v.see(svcKey, name, s.obj, s.rev)
		}
	}
	var zero T
	v.mu.Lock()
	defer v.mu.Unlock()
	var gone []string
	for svcKey, s := range v.seen {
		s.all(func(name string, cur sight[T]) {
			if _, ok := listed[svcKey][name]; !ok && cur.obj != zero && cur.rev <= rev {
				s.set(name, sight[T]{rev: rev})
				gone = append(gone, svcKey)
			}
		})
		v.seen[svcKey] = s
	}
	return gone
}

// applyEvent folds one etcd event into the view; a state the term did not write (a
// delete, or with foreignPuts any change, by someone else, or a write of unknown
// outcome seen at last) queues the Service, whose sync puts it right.
func (v *view[T]) applyEvent(ev *clientv3.Event) {
	svcKey, name, ok := v.split(ev.Kv.Key)
	if !ok {
		return
	}
	rev := ev.Kv.ModRevision
	if v.saw(svcKey, name, rev) {
		return // the term's own write, learnt when it committed: no need to decode it again
	}
	var obj T
	if ev.Type == mvccpb.PUT {
		if obj, ok = v.read(ev.Kv); !ok {
			return
		}
	}
	if v.see(svcKey, name, obj, rev) && (ev.Type == mvccpb.DELETE || v.foreignPuts) {
		v.changed(svcKey)
	}
}
