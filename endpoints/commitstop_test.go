package endpoints

import (
	"context"
	"testing"
	"time"
)

// A write submitted after the term's committer has stopped (its context ended, as
// keepMaster can when a tick and the end of the term come together) is never
// answered half of the time: commitNow blocks for ever.
func TestCommitNowAfterCommitterStopped(t *testing.T) {
	h := newSliceHarness(t, Config{})
	tm, err := h.c.currentTerm()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	hung := 0
	for range 20 {
		done := make(chan struct{})
		go func() {
			tm.commitNow(ctx, &write{ops: []writeOp{{key: "/x", val: []byte("v"), view: tm.storedSlices}}})
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(200 * time.Millisecond):
			hung++
		}
	}
	t.Logf("commitNow after the committer stopped: %d of 20 never returned", hung)
	if hung > 0 {
		t.Errorf("commitNow hangs")
	}
}
