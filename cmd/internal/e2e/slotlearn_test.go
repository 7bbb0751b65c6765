package e2e

import (
	"slices"
	"testing"
	"time"

	"github.com/taskrl/taskrl/internal/testkit/fakeapi"
)

// TestAdaptiveConcurrency runs 3 worker binaries of 20 slots under one
// adaptive_concurrency rule that knows only 1-60 against a service that
// never refuses but slows down above N calls at once (fakeapi
// Limits.Slots: 100 ms unloaded, twice that at 1.25 N), N 20 and then 10
// (unknown to the policy), MaxRetry(0) tasks kept at a backlog of 200 (with
// 80 the fleet ran dry now and then: the tasks that found no slot waited
// in asynq's scheduled set, 1 s each, while the slots were free). The
// bars (issue 31), from 5 s after the start and after the change: the
// calls in service average within 20 % of N (the time-weighted mean of the
// service's own records), the 99th percentile of the latency is within
// twice the unloaded one, and nothing is archived, lost or answered twice.
func TestAdaptiveConcurrency(t *testing.T) {
	const (
		phase    = 12 * time.Second
		settle   = 5 * time.Second
		unloaded = 100 * time.Millisecond
	)
	slots := []int{20, 10}
	r := start(t, fakeapi.Limits{Latency: unloaded, Slots: slots[0]}, `
rules:
  - name: backend
    match: {type: "http:call"}
    adaptive_concurrency: {min: 1, max: 60, lease: 30s}
`, 3, "--concurrency", "20")
	enqueued, stopFeed := r.feed(200)
	begin := time.Now()
	time.Sleep(phase)
	if err := r.api.SetSlots(slots[1]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(phase)
	stopFeed()
	r.stop()
	calls := r.api.Calls()
	for i, n := range slots {
		from, to := begin.Add(time.Duration(i)*phase+settle), begin.Add(time.Duration(i+1)*phase)
		var busy time.Duration // call-time in service within [from, to)
		var took []time.Duration
		for _, c := range calls {
			if c.Status != 200 {
				continue
			}
			if end := c.At.Add(c.Took); end.After(from) && c.At.Before(to) {
				busy += earlier(end, to).Sub(later(c.At, from))
			}
			if !c.At.Before(from) && c.At.Before(to) {
				took = append(took, c.Took)
			}
		}
		if len(took) == 0 {
			t.Fatalf("phase %d: no call answered", i+1)
		}
		slices.Sort(took)
		p99 := took[(len(took)*99+99)/100-1]
		inService := float64(busy) / float64(to.Sub(from))
		t.Logf("phase %d (%d at once): %.1f calls in service on average, %d calls, p99 latency %v", i+1, n, inService, len(took), p99.Round(time.Millisecond))
		if inService < 0.8*float64(n) || inService > 1.2*float64(n) {
			t.Errorf("phase %d: %.1f calls in service on average, want %d within 20%%", i+1, inService, n)
		}
		if p99 > 2*unloaded {
			t.Errorf("phase %d: p99 latency %v, want at most %v", i+1, p99, 2*unloaded)
		}
	}
	r.noneLost(int(enqueued.Load()))
}

// later and earlier are the later and the earlier of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
