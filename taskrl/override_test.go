package taskrl

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// TestOverrideLimits runs the overrides through the middleware on asynq:
// under 1/s burst 1 per business, business b7, overridden to burst 4, runs
// 4 of its 6 tasks at once while b8 runs 1 of its 6; the others wait
// (rescheduled), and with b7's override set live (SetPolicy) b9 does the
// same; b10, exempted live (unlimited), runs all 6 and is charged nothing.
func TestOverrideLimits(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	perBusiness := policy.Rule{Name: "per-business", Match: policy.Match{Type: "job"}, Key: "{{.business_id}}", Limit: quotas.GCRA(gcra.Limit{Rate: 1, Period: time.Hour, Burst: 1})}
	p, err := mustPolicy(t, perBusiness).WithOverrides(policy.Override{Rule: "per-business", Key: "b7", Limit: quotas.GCRA(gcra.Limit{Rate: 1, Period: time.Hour, Burst: 4})})
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Policy: p, Client: c})
	if err != nil {
		t.Fatal(err)
	}
	w := countRuns(t, c, m)
	enqueue := func(biz ...string) {
		t.Helper()
		for _, b := range biz {
			w.enqueue(t, `{"business_id": "`+b+`"}`, 6)
		}
		w.decided(t)
	}
	check := func(want map[string]int) {
		t.Helper()
		for b, n := range want {
			if got := w.ran(`{"business_id": "` + b + `"}`); got != n {
				t.Errorf("business %s ran %d tasks, want %d", b, got, n)
			}
		}
	}
	enqueue("b7", "b8")
	check(map[string]int{"b7": 4, "b8": 1})
	live, err := p.WithOverrides(policy.Override{Rule: "per-business", Key: "b9", Limit: quotas.GCRA(gcra.Limit{Rate: 1, Period: time.Hour, Burst: 4})})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetPolicy(live); err != nil {
		t.Fatal(err)
	}
	enqueue("b9")
	check(map[string]int{"b7": 4, "b8": 1, "b9": 4})
	// Exempt (unlimited): b10 runs all 6 at once, and the rule keeps no
	// state for it.
	if live, err = live.WithOverrides(policy.Override{Rule: "per-business", Key: "b10", Unlimited: true}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetPolicy(live); err != nil {
		t.Fatal(err)
	}
	enqueue("b10", "b11")
	check(map[string]int{"b7": 4, "b8": 1, "b9": 4, "b10": 6, "b11": 1})
	set, err := quotas.NewSet(quotas.Rule{Name: "per-business", Limit: perBusiness.Limit})
	if err != nil {
		t.Fatal(err)
	}
	l, err := quotas.New(quotas.Config{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	for b, want := range map[string]int{"b10": 0, "b11": 1} {
		if d, err := l.Status(context.Background(), set, quotas.Request{Keys: []string{b}}); err != nil || d.Rules[0].Used != want {
			t.Errorf("per-business %s: used %v (%v), want %d", b, d.Rules, err, want)
		}
	}
}

// TestTierLimits: under a per-business rule of 1/h burst 1 with a plan
// "pro" of burst 4, the tasks of b1, whose payloads name plan pro, run 4
// of 6 at once, b2's (no plan) 1 of 6, b3's (an unknown plan) 1 of 6.
func TestTierLimits(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	p := mustPolicy(t, policy.Rule{Name: "per-business", Match: policy.Match{Type: "job"}, Key: "{{.business_id}}", Tier: "{{.plan}}",
		Tiers: map[string]quotas.Limit{"pro": quotas.GCRA(gcra.Limit{Rate: 1, Period: time.Hour, Burst: 4})},
		Limit: quotas.GCRA(gcra.Limit{Rate: 1, Period: time.Hour, Burst: 1})})
	m, err := New(Config{Policy: p, Client: c})
	if err != nil {
		t.Fatal(err)
	}
	w := countRuns(t, c, m)
	payloads := map[string]string{"b1": `{"business_id": "b1", "plan": "pro"}`, "b2": `{"business_id": "b2"}`, "b3": `{"business_id": "b3", "plan": "gold"}`}
	for _, pl := range payloads {
		w.enqueue(t, pl, 6)
	}
	w.decided(t)
	for b, want := range map[string]int{"b1": 4, "b2": 1, "b3": 1} {
		if got := w.ran(payloads[b]); got != want {
			t.Errorf("business %s ran %d tasks, want %d", b, got, want)
		}
	}
}

// runCounter is one worker of 8 slots on queue "q" counting the runs of
// each payload of task type "job" (countRuns).
type runCounter struct {
	mu     sync.Mutex
	runs   map[string]int
	client *asynq.Client
	insp   *asynq.Inspector
}

// countRuns starts a runCounter on c with m.
func countRuns(t *testing.T, c redis.UniversalClient, m *Middleware) *runCounter {
	w := &runCounter{runs: map[string]int{}, client: asynq.NewClientFromRedisClient(c), insp: asynq.NewInspectorFromRedisClient(c)}
	runWorkers(t, c, m, 1, 8, "q", func(_ context.Context, task *asynq.Task) error {
		w.mu.Lock()
		w.runs[string(task.Payload())]++
		w.mu.Unlock()
		return nil
	})
	return w
}

// enqueue enqueues n tasks of payload.
func (w *runCounter) enqueue(t *testing.T, payload string, n int) {
	t.Helper()
	for range n {
		if _, err := w.client.Enqueue(asynq.NewTask("job", []byte(payload)), asynq.Queue("q")); err != nil {
			t.Fatal(err)
		}
	}
}

// decided waits until no task is pending or active (each ran or waits),
// at most 20 s.
func (w *runCounter) decided(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if info, err := w.insp.GetQueueInfo("q"); err == nil && info.Pending == 0 && info.Active == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the tasks were not decided in 20 s")
		}
	}
}

// ran returns how many times a task of payload ran.
func (w *runCounter) ran(payload string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.runs[payload]
}

// TestExemptThrottleScope: under a throttle scope of the per-business rule
// alone, a 429 for a key exempt from that rule blocks nothing (not the
// shared vendor rule instead, which would hold every business back); for
// another key it blocks its per-business rule.
func TestExemptThrottleScope(t *testing.T) {
	p, err := mustPolicy(t,
		policy.Rule{Name: "vendor", Match: policy.Match{Type: "job"}, Limit: quotas.GCRA(gcra.Limit{Rate: 100, Period: time.Second, Burst: 10})},
		policy.Rule{Name: "per-business", Match: policy.Match{Type: "job"}, Key: "{{.b}}", Limit: quotas.GCRA(gcra.Limit{Rate: 20, Period: time.Second, Burst: 2})}).
		WithThrottle("per-business")
	if err != nil {
		t.Fatal(err)
	}
	if p, err = p.WithOverrides(policy.Override{Rule: "per-business", Key: "b9", Unlimited: true}); err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Policy: p, Client: redistest.Client(t)})
	if err != nil {
		t.Fatal(err)
	}
	b := p.Bind("job", "q")
	for key, want := range map[string][]string{"b9": nil, "b1": {"per-business"}} {
		sp, err := m.split(b.ForKeys([]string{"", key}))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		if sp.throttle != nil {
			for _, r := range sp.throttle.Rules() {
				got = append(got, r.Name)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: a 429 blocks %v, want %v", key, got, want)
		}
	}
}
