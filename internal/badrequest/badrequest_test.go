package badrequest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestError(t *testing.T) {
	if (&Error{}).OrNil() != nil || (*Error)(nil).OrNil() != nil {
		t.Fatal("OrNil of an Error with no violation != nil")
	}
	e := &Error{What: "invalid service snapshot"}
	for i := range MaxViolations + 3 {
		e.Add(fmt.Sprintf("snapshot.services[%d].uid", i), "must not be empty")
	}
	err := e.OrNil()
	if err == nil || !errors.Is(err, ErrInvalid) {
		t.Fatalf("OrNil() = %v; want an error that is ErrInvalid", err)
	}
	if len(e.Violations) != MaxViolations || e.More != 3 {
		t.Errorf("violations %d, more %d; want %d and 3", len(e.Violations), e.More, MaxViolations)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "invalid service snapshot: snapshot.services[0].uid: must not be empty; ") ||
		!strings.HasSuffix(msg, "; and 3 more") {
		t.Errorf("Error() = %q", msg)
	}
	if got := New("owner.uid", "required").Error(); got != "owner.uid: required" {
		t.Errorf("New(owner.uid, required).Error() = %q; want %q", got, "owner.uid: required")
	}
}
