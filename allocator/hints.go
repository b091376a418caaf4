package allocator

import "sync"

// maxHints bounds each of the two generations of ownerHints.
const maxHints = 4096

// ownerHints remembers the owner records this replica wrote or read last, so that
// the next request of such an owner starts from the record's revision instead of
// from "no record": without it, every request of an existing owner fails its whole
// group-commit transaction once. A hint is only a guess: the transaction still
// compares the record's ModRevision, and a stale hint costs one conflict and a
// read-back, as no hint would. Two generations of at most maxHints owners each keep
// the recently used ones (retries and follow-up requests come soon) in bounded
// memory.
type ownerHints struct {
	mu       sync.Mutex
	cur, old map[string]ownerHint
}

type ownerHint struct {
	rev int64
	rec *ownerRecord // never modified: ops clone it
}

func (h *ownerHints) get(uid string) (ownerHint, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if v, ok := h.cur[uid]; ok {
		return v, true
	}
	v, ok := h.old[uid]
	return v, ok
}

func (h *ownerHints) put(uid string, rev int64, rec *ownerRecord) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur == nil {
		h.cur = make(map[string]ownerHint, maxHints)
	}
	h.cur[uid] = ownerHint{rev: rev, rec: rec}
	if len(h.cur) >= maxHints {
		// The forgotten generation's map, emptied, is the next current one: it keeps
		// its room for maxHints owners, so that neither the turn nor the puts after it
		// allocate (a map grown from empty moves its entries at every growth on the way).
		h.old, h.cur = h.cur, h.old
		if h.cur == nil {
			h.cur = make(map[string]ownerHint, maxHints)
		}
		clear(h.cur)
	}
}

func (h *ownerHints) del(uids ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, uid := range uids {
		delete(h.cur, uid)
		delete(h.old, uid)
	}
}
