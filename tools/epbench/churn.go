package main

import (
	"context"
	"fmt"
	"time"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// churnResult is what the churn pushed.
type churnResult struct {
	flips, applied int
	sent           time.Duration // from the first push to the last acknowledgement
}

// churn flips the readiness of one Pod per event, rate events a second for d, pushed
// in order by one sender as they fall due (PushEvents, one stream a push). Event i
// flips Pod (i / services) % podsPerSvc of Service i % services, so that a Service has
// at most one flip in flight (it comes back after services events), and each flip
// changes exactly one Endpoints object and one slice. Every tracker is told the ready
// count each flip implies before the push, and the acknowledgement after it.
func churn(ctx context.Context, c *client.Client, w workload, rate int, d time.Duration,
	ts ...*tracker) (churnResult, error) {
	ready := make([][]bool, w.services)
	for s := range ready {
		ready[s] = make([]bool, w.podsPerSvc)
		for p := range ready[s] {
			ready[s][p] = true
		}
	}
	var r churnResult
	total := int(d.Seconds() * float64(rate))
	start := time.Now()
	rev := int64(1)
	for i := 0; i < total; {
		due := min(total, int(time.Since(start).Seconds()*float64(rate))+1)
		if due <= i {
			time.Sleep(time.Millisecond)
			continue
		}
		req := &allocdv1.PushEventsRequest{}
		var batch []int
		for ; i < due; i++ {
			s, p := i%w.services, (i/w.services)%w.podsPerSvc
			ready[s][p] = !ready[s][p]
			rev++
			n := 0
			for _, ok := range ready[s] {
				if ok {
					n++
				}
			}
			for _, t := range ts {
				t.expect(s, n)
			}
			req.Events = append(req.Events, &allocdv1.Event{Type: allocdv1.EventType_EVENT_TYPE_UPSERT,
				Object: &allocdv1.Event_Pod{Pod: w.pod(s, p, ready[s][p], rev)}})
			batch = append(batch, s)
		}
		req.Revision = rev
		resp, err := c.PushEvents(ctx, req)
		if err != nil {
			return r, fmt.Errorf("push events: %w", err)
		}
		now := time.Now()
		for _, t := range ts {
			t.ack(batch, now)
		}
		r.applied += int(resp.GetApplied())
	}
	r.flips, r.sent = total, time.Since(start)
	return r, nil
}

// settle waits until every tracker saw the change of every flip, at most limit.
func settle(ts []*tracker, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		left := 0
		for _, t := range ts {
			left += t.outstanding()
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			var msg string
			for _, t := range ts {
				msg += fmt.Sprintf(" %s: %d", t.name, t.outstanding())
			}
			return fmt.Errorf("flips not seen on the watches after %v:%s", limit, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
