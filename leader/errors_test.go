package leader

import (
	"errors"
	"io"
	"testing"
)

func TestNotLeaderErrorUnwrap(t *testing.T) {
	err := error(&NotLeaderError{Leader: "10.0.0.1:9090", Err: io.ErrUnexpectedEOF})
	if !errors.Is(err, ErrNotLeader) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("errors.Is(%v, ErrNotLeader / the leader's error) = %v, %v; want both true", err,
			errors.Is(err, ErrNotLeader), errors.Is(err, io.ErrUnexpectedEOF))
	}
	if err := error(&NotLeaderError{Leader: "10.0.0.1:9090"}); !errors.Is(err, ErrNotLeader) {
		t.Errorf("errors.Is(%v, ErrNotLeader) = false", err)
	}
}
