// Package bitmap holds the offsets of one allocation range in memory, as Kubernetes'
// allocator bitmap does, knowing nothing of IP addresses or ports: offset 0 to Size-1,
// a static (lower) band [0, Band) and a dynamic (upper) band [Band, Size).
//
// A Bitmap keeps two sets: used (what the caller saw committed in etcd) and pending
// (local reservations whose outcome is not known yet). A dynamic pick skips both: it
// takes a free offset of the dynamic band from a random start with wrap-around, and
// of the static band only when the dynamic one is full (KEP-3070, KEP-3668).
//
//	b := bitmap.New(254, 16)
//	off, ok := b.Pick()     // pending until settled
//	b.SetUsed(off, true)    // the watch saw it in etcd
//	b.Unpend(off)           // the reservation is settled
//
// Every method is safe for concurrent use. Offsets past Size are ignored (a bitset
// grows silently when set past its end).
package bitmap
