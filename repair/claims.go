package repair

import "github.com/allocd/allocd/allocator"

// passClaims is a pass as allocator.Claims: what ListExcept asks of the items it
// holds, so that a pass reads only the allocations it must judge.
type passClaims passRun

var _ allocator.Claims = (*passClaims)(nil)

// Claim marks the claim of k held, and says not to read it, when the allocator shows
// it held by the one Service that uses it. An item two Services use, or reserved for
// the kubernetes Service, or that no Service uses, is read: the pass judges it.
func (pc *passClaims) Claim(k allocator.ItemKey, held uint64) bool {
	p := (*passRun)(pc)
	sl := p.slots[k]
	if sl.holder == 0 || sl.holder != held|1 {
		return true
	}
	c, _ := sl.claim.get()
	p.held[c] = true
	return false
}
