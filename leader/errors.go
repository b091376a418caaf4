package leader

import "errors"

// ErrNotLeader is the sentinel of NotLeaderError.
var ErrNotLeader = errors.New("not the leader")

// NotLeaderError is returned by a controller's call that only the leader serves, on a
// replica that does not lead (or whose term just ended) and could not hand the call to
// the leader.
type NotLeaderError struct {
	// Controller names the controller that was called ("repair", "endpoints"), for the
	// message and for the server's error reason.
	Controller string
	// Leader is the leader's identity (its gRPC address), "" when none is elected or
	// it is not known.
	Leader string
	// Err is why forwarding to the leader failed, if it was tried.
	Err error
}

// Error says which controller this replica does not lead, and who does: the leader's
// address, that none is elected yet, or why the leader could not be reached.
func (e *NotLeaderError) Error() string {
	what := "this replica does not lead"
	if e.Controller != "" {
		what += " the " + e.Controller + " controller"
	}
	switch {
	case e.Leader == "":
		return what + ", and no leader is elected yet"
	case e.Err != nil:
		return what + "; the leader " + e.Leader + " is unreachable: " + e.Err.Error()
	}
	return what + "; the leader is " + e.Leader
}

// Unwrap lets errors.Is(err, ErrNotLeader) match, and errors.Is and errors.As reach the
// error of the failed call to the leader, if any.
func (e *NotLeaderError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrNotLeader}
	}
	return []error{ErrNotLeader, e.Err}
}
