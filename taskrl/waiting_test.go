package taskrl

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// TestWaitingIndex: under 1/h burst 1 per business and a global 1/h burst
// 100, b1's 6 tasks run 1 and wait 5 (booked an hour and more ahead), b2's
// 2 run 1 and wait 1, and b3, exempt (unlimited), runs all 3: Waiting
// counts 5, 1 and 0 under the keyed rule and 6 under the global one, in
// sets that expire a minute after their last task is due; CheckBacklog
// refuses a b1 task over 4 naming the rule and key and passes it at 6;
// b3's is refused over 5 by the global rule alone; a task deleted while it
// waits still counts (the index is not told).
func TestWaitingIndex(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	ctx := context.Background()
	p := mustPolicy(t,
		policy.Rule{Name: "per-business", Match: policy.Match{Type: "job"}, Key: "{{.business_id}}", Limit: quotas.GCRA(gcra.Limit{Rate: 1, Period: time.Hour, Burst: 1})},
		policy.Rule{Name: "global", Match: policy.Match{Type: "job"}, Limit: quotas.GCRA(gcra.Limit{Rate: 1, Period: time.Hour, Burst: 100})})
	p, err := p.WithOverrides(policy.Override{Rule: "per-business", Key: "b3", Unlimited: true})
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Policy: p, Client: c})
	if err != nil {
		t.Fatal(err)
	}
	w := countRuns(t, c, m)
	payload := func(b string) []byte { return []byte(`{"business_id": "` + b + `"}`) }
	for b, n := range map[string]int{"b1": 6, "b2": 2, "b3": 3} {
		w.enqueue(t, string(payload(b)), n)
	}
	w.decided(t)
	if info, err := w.insp.GetQueueInfo("q"); err != nil || info.Scheduled != 6 {
		t.Fatalf("%+v %v: want 6 tasks waiting", info, err)
	}
	for _, tc := range []struct {
		rule, key string
		want      int
	}{{"per-business", "b1", 5}, {"per-business", "b2", 1}, {"per-business", "b3", 0}, {"global", "", 6}, {"per-business", "b9", 0}} {
		if n, err := Waiting(ctx, c, "", tc.rule, tc.key); err != nil || n != tc.want {
			t.Errorf("Waiting(%s, %q) = %d, %v; want %d", tc.rule, tc.key, n, err, tc.want)
		}
	}
	now := c.Time(ctx).Val()
	for _, k := range []string{keys.Waiting("taskrl:", "per-business", "b1"), keys.Waiting("taskrl:", "global", "")} {
		// A minute after the last task is due (hours ahead: 1/h).
		last := c.ZRangeWithScores(ctx, k, -1, -1).Val()
		if len(last) != 1 {
			t.Fatalf("%s: %v", k, last)
		}
		due := time.UnixMicro(int64(last[0].Score))
		if ttl, want := c.PTTL(ctx, k).Val(), due.Sub(now)+time.Minute; due.Sub(now) < time.Hour || ttl < want-5*time.Second || ttl > want+time.Second {
			t.Errorf("%s: TTL %v, want %v (last task due in %v)", k, ttl, want, due.Sub(now))
		}
	}
	err = CheckBacklog(ctx, c, "", p, "job", "q", payload("b1"), 4)
	var be *BacklogError
	if !errors.As(err, &be) || be.Rule != "per-business" || be.Key != "b1" || be.Waiting != 5 || be.Max != 4 {
		t.Errorf("CheckBacklog(b1, 4) = %v", err)
	} else if want := `taskrl: 5 tasks already wait under rule "per-business" for key "b1", more than 4`; err.Error() != want {
		t.Errorf("got %q, want %q", err, want)
	}
	if err := CheckBacklog(ctx, c, "", p, "job", "q", payload("b1"), 6); err != nil {
		t.Errorf("CheckBacklog(b1, 6) = %v", err)
	}
	// b3 is exempt from per-business, whose set for b3 (seeded here) is
	// not read; the global rule's 6 still count.
	for i := range 10 {
		c.ZAdd(ctx, keys.Waiting("taskrl:", "per-business", "b3"), redis.Z{Score: float64(now.Add(time.Hour).UnixMicro()), Member: i})
	}
	c.Expire(ctx, keys.Waiting("taskrl:", "per-business", "b3"), 2*time.Hour)
	if err := CheckBacklog(ctx, c, "", p, "job", "q", payload("b3"), 5); !errors.As(err, &be) || be.Rule != "global" {
		t.Errorf("CheckBacklog(b3, 5) = %v, want the global rule's backlog", err)
	}
	if err := CheckBacklog(ctx, c, "", p, "other", "q", payload("b1"), 0); err != nil {
		t.Errorf("a task no rule governs: %v", err)
	}
	// Deleted through the Inspector while waiting: still counted.
	tasks, err := w.insp.ListScheduledTasks("q")
	if err != nil || len(tasks) == 0 {
		t.Fatal(tasks, err)
	}
	if err := w.insp.DeleteTask("q", tasks[0].ID); err != nil {
		t.Fatal(err)
	}
	if n, _ := Waiting(ctx, c, "", "global", ""); n != 6 {
		t.Errorf("after a delete, Waiting(global) = %d, want 6 (the index is not told)", n)
	}
}
