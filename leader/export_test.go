package leader

// Reads returns how many times e read the leader from etcd.
func (e *Elector) Reads() int64 { return e.reads.Load() }

// Lists returns how many listings the election's watch took.
func (e *Elector) Lists() int64 { return e.lists.Load() }

// Viewed returns the leader that the watch's view names; ok is false while the view is
// not known or names no candidate.
func (e *Elector) Viewed() (identity string, ok bool) { return e.view.leader() }
