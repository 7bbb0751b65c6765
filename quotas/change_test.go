package quotas

import (
	"context"
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// TestChangedLimitStartsAfresh: a GCRA rule booked 10 s ahead at 1/s
// holds the next request back under the same limit, but the same rule at
// 5/s (a reloaded policy, an override) starts a schedule of its own: its
// first request passes at once, its burst is its own, and the 1/s backlog
// is still there for the old limit. A window rule of the same name keeps
// its count across a change of its limit.
func TestChangedLimitStartsAfresh(t *testing.T) {
	ctx := context.Background()
	l := newClocked(t, redistest.Client(t), redistest.Prefix(t), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC))
	slow := mustSet(Rule{Name: "r", Limit: GCRA(gcra.Limit{Rate: 1, Period: time.Second, Burst: 1})})
	fast := mustSet(Rule{Name: "r", Limit: GCRA(gcra.Limit{Rate: 5, Period: time.Second, Burst: 2})})
	for i := 0; i < 10; i++ {
		if d, err := l.Reserve(ctx, slow, Request{}, time.Minute); err != nil || !d.Allowed {
			t.Fatalf("booking %d: %+v %v", i, d, err)
		}
	}
	if d, err := l.Allow(ctx, slow, Request{}); err != nil || d.Allowed || d.RetryAfter < 8*time.Second {
		t.Fatalf("the old limit admits at once: %+v %v", d, err)
	}
	for i := 0; i < 2; i++ {
		if d, err := l.Allow(ctx, fast, Request{}); err != nil || !d.Allowed {
			t.Fatalf("request %d at the new limit: %+v %v", i, d, err)
		}
	}
	if d, err := l.Allow(ctx, fast, Request{}); err != nil || d.Allowed || d.RetryAfter != 200*time.Millisecond {
		t.Fatalf("the new limit's burst is not its own: %+v %v", d, err)
	}

	small := mustSet(Rule{Name: "w", Limit: SlidingWindow{Limit: 3, Every: time.Hour}})
	large := mustSet(Rule{Name: "w", Limit: SlidingWindow{Limit: 5, Every: time.Hour}})
	for i := 0; i < 3; i++ {
		if d, err := l.Allow(ctx, small, Request{}); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
	}
	for i, want := range []bool{true, true, false} {
		if d, err := l.Allow(ctx, large, Request{}); err != nil || d.Allowed != want {
			t.Fatalf("request %d under the raised window: %+v %v", 4+i, d, err)
		}
	}
}
