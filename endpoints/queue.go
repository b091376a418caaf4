package endpoints

import (
	"container/heap"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// queue is the controller's work queue of Service keys, with client-go workqueue's
// guarantees: a key is never handed to two workers at once, a key added while it is
// being processed is handed out again after Done, and a key added many times before a
// worker takes it is processed once. addAfter schedules a key for later; a later
// schedule never delays an earlier one (so events inside one batch period collapse into
// one sync at first event + period).
//
// Each key also carries the time of the earliest event not yet synced (since), for the
// event-to-commit latency.
type queue struct {
	clock      clockwork.Clock // of addAfter's delays
	mu         sync.Mutex
	cond       *sync.Cond
	ready      []string
	dirty      map[string]struct{}
	processing map[string]struct{}
	since      map[string]time.Time
	failures   map[string]int
	conflicts  map[string]int

	waiting   waitHeap
	scheduled map[string]time.Time
	wake      chan struct{}
	closed    bool
}

func newQueue(clock clockwork.Clock) *queue {
	q := &queue{
		clock:      clock,
		dirty:      map[string]struct{}{},
		processing: map[string]struct{}{},
		since:      map[string]time.Time{},
		failures:   map[string]int{},
		conflicts:  map[string]int{},
		scheduled:  map[string]time.Time{},
		wake:       make(chan struct{}, 1),
	}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// add queues key now. since is the time of the event behind it (zero for none).
func (q *queue) add(key string, since time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.addLocked(key, since)
}

func (q *queue) addLocked(key string, since time.Time) {
	if q.closed {
		return
	}
	if !since.IsZero() {
		if s, ok := q.since[key]; !ok || since.Before(s) {
			q.since[key] = since
		}
	}
	if _, ok := q.dirty[key]; ok {
		return
	}
	q.dirty[key] = struct{}{}
	if _, ok := q.processing[key]; ok {
		return
	}
	q.ready = append(q.ready, key)
	q.cond.Signal()
}

// addAfter queues key after d, unless it is already scheduled to run sooner.
func (q *queue) addAfter(key string, d time.Duration, since time.Time) {
	if d <= 0 {
		q.add(key, since)
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	if !since.IsZero() {
		if s, ok := q.since[key]; !ok || since.Before(s) {
			q.since[key] = since
		}
	}
	due := q.clock.Now().Add(d)
	if at, ok := q.scheduled[key]; ok && !at.After(due) {
		return
	}
	q.scheduled[key] = due
	heap.Push(&q.waiting, waitItem{key: key, due: due})
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// retry queues key again after a backoff that doubles with its consecutive failures
// (5 ms up to maxRetryDelay), as client-go's per-item rate limiter does; unlike
// kube-controller-manager, a key is never dropped while the term lasts.
func (q *queue) retry(key string) {
	q.mu.Lock()
	n := q.failures[key]
	q.failures[key] = n + 1
	q.mu.Unlock()
	d := 5 * time.Millisecond << min(n, 20)
	q.addAfter(key, min(d, maxRetryDelay), time.Time{})
}

// retryWith is retry for a key whose earliest unsynced event was at since.
func (q *queue) retryWith(key string, since time.Time) {
	if !since.IsZero() {
		q.mu.Lock()
		if s, ok := q.since[key]; !ok || since.Before(s) {
			q.since[key] = since
		}
		q.mu.Unlock()
	}
	q.retry(key)
}

// forget resets the failures and conflicts of key.
func (q *queue) forget(key string) {
	q.mu.Lock()
	delete(q.failures, key)
	delete(q.conflicts, key)
	q.mu.Unlock()
}

// conflicted counts a conflict of key and returns its conflicts in a row.
func (q *queue) conflicted(key string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.conflicts[key]++
	return q.conflicts[key]
}

// maxRetryDelay caps the backoff of a failing key.
const maxRetryDelay = 5 * time.Second

// get blocks until a key is ready and hands it out with the time of its earliest
// event; ok is false once the queue is closed.
func (q *queue) get() (key string, since time.Time, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.ready) == 0 && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return "", time.Time{}, false
	}
	key = q.ready[0]
	q.ready[0] = ""
	q.ready = q.ready[1:]
	delete(q.dirty, key)
	q.processing[key] = struct{}{}
	since = q.since[key]
	delete(q.since, key)
	return key, since, true
}

// done ends the processing of key; it is handed out again if it was added meanwhile.
func (q *queue) done(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.processing, key)
	if _, ok := q.dirty[key]; ok && !q.closed {
		q.ready = append(q.ready, key)
		q.cond.Signal()
	}
}

// close wakes every get with ok false and stops scheduling.
func (q *queue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.cond.Broadcast()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// runTimers moves scheduled keys to the ready list when they are due, until the queue
// is closed. It is the queue's one goroutine; its owner waits for it.
func (q *queue) runTimers() {
	t := q.clock.NewTimer(time.Hour)
	defer t.Stop()
	for {
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return
		}
		now := q.clock.Now()
		for q.waiting.Len() > 0 && !q.waiting[0].due.After(now) {
			it := heap.Pop(&q.waiting).(waitItem)
			if at, ok := q.scheduled[it.key]; ok && at.Equal(it.due) {
				delete(q.scheduled, it.key)
				q.addLocked(it.key, time.Time{})
			}
		}
		next := time.Hour
		if q.waiting.Len() > 0 {
			next = q.waiting[0].due.Sub(now)
		}
		q.mu.Unlock()
		if !t.Stop() {
			select {
			case <-t.Chan():
			default:
			}
		}
		t.Reset(next)
		select {
		case <-t.Chan():
		case <-q.wake:
		}
	}
}

type waitItem struct {
	key string
	due time.Time
}

// waitHeap orders scheduled keys by due time.
type waitHeap []waitItem

func (h waitHeap) Len() int           { return len(h) }
func (h waitHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h waitHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *waitHeap) Push(x any)        { *h = append(*h, x.(waitItem)) }
func (h *waitHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

// idle reports whether no key is ready, being processed or scheduled.
func (q *queue) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.ready) == 0 && len(q.processing) == 0 && q.waiting.Len() == 0
}
