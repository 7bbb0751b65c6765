package taskrl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// TestCostTemplate: cost renders from the payload as a whole number of at
// least 1 (a number or a string of one), a literal as itself, a missing
// field as default_cost; anything else is a *CostError naming the rule and
// the value. Rules without a cost cost 1; a binding without any has no
// Costs.
func TestCostTemplate(t *testing.T) {
	p, err := policy.Parse([]byte(`
rules:
  - name: points
    match: {type: job}
    cost: "{{.units}}"
    gcra: {rate: 30, per: 1s, burst: 30}
  - name: fixed
    match: {type: job}
    cost: 2
    quota: {limit: 100, every: 1m}
  - name: nested
    match: {type: job}
    cost: "{{.q.n}}"
    default_cost: 4
    sliding: {limit: 50, every: 1m}
  - name: plain
    match: {type: job}
    gcra: {rate: 1, per: 1s}
  - name: other
    match: {type: other}
    gcra: {rate: 1, per: 1s}
`))
	if err != nil {
		t.Fatal(err)
	}
	b := p.Bind("job", "q")
	for _, tc := range []struct {
		payload string
		want    string // Costs, or the error
	}{
		{`{"units": 3, "q": {"n": 7}}`, "[3 2 7 1]"},
		{`{"units": "5"}`, "[5 2 4 1]"},
		{`{"units": 40}`, "[40 2 4 1]"}, // above the burst: CheckCosts
		{`{"units": 0}`, `taskrl: rule "points": cost "0" is not a whole number of at least 1`},
		{`{"units": 2.5}`, `taskrl: rule "points": cost "2.5" is not a whole number of at least 1`},
		{`{"units": "many"}`, `taskrl: rule "points": cost "many" is not a whole number of at least 1`},
		{`{"units": -1}`, `taskrl: rule "points": cost "-1" is not a whole number of at least 1`},
		{`{"other": 1}`, `taskrl: rule "points": cost: payload has no field "units" and the rule has no default_cost`},
		{`{"units": {"a": 1}}`, `taskrl: rule "points": cost: payload field "units" is an object; a key needs a string, number or boolean`},
	} {
		rq, err := b.Request([]byte(tc.payload))
		got := fmt.Sprint(rq.Costs)
		if err != nil {
			got = err.Error()
			if !errors.As(err, new(*policy.CostError)) {
				t.Errorf("%s: %T is not a *CostError", tc.payload, err)
			}
		}
		if got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.payload, got, tc.want)
		}
	}
	rq, _ := b.Request([]byte(`{"units": 40}`))
	if err := b.CheckCosts(rq.Costs); err == nil || err.Error() != `taskrl: rule "points": cost 40 is above the rule's burst of 30: the task can never pass` {
		t.Errorf("cost 40 over a burst of 30: %v", err)
	}
	rq, _ = b.Request([]byte(`{"units": 30}`))
	if err := b.CheckCosts(rq.Costs); err != nil {
		t.Errorf("cost 30 under a burst of 30: %v", err)
	}
	if rq, err := p.Bind("other", "q").Request([]byte(`{}`)); err != nil || rq.Costs != nil {
		t.Errorf("a binding without costs: %v %v", rq.Costs, err)
	}
}

// TestCostOverBurstArchived: a task whose cost exceeds the rule's burst,
// one whose cost is not a number and one without the field are archived
// at once with a reason naming the rule, the cost and the limit; nothing
// is charged (a task of cost 30, the whole burst, passes at once after).
func TestCostOverBurstArchived(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	m := newMiddleware(t, c, policy.Rule{Name: "points", Match: policy.Match{Type: "job"}, Cost: "{{.units}}", Limit: quotas.GCRA(gcra.Limit{Rate: 1, Period: time.Minute, Burst: 30})})
	var mu sync.Mutex
	var ran []string
	runWorkers(t, c, m, 1, 2, "q", func(_ context.Context, tk *asynq.Task) error {
		mu.Lock()
		ran = append(ran, string(tk.Payload()))
		mu.Unlock()
		return nil
	})
	client := asynq.NewClientFromRedisClient(c)
	insp := asynq.NewInspectorFromRedisClient(c)
	for _, tc := range []struct{ payload, reason string }{
		{`{"units": 40}`, `taskrl: rule "points": cost 40 is above the rule's burst of 30: the task can never pass`},
		{`{"units": "x"}`, `taskrl: rule "points": cost "x" is not a whole number of at least 1`},
		{`{}`, `taskrl: rule "points": cost: payload has no field "units" and the rule has no default_cost`},
	} {
		info, err := client.Enqueue(asynq.NewTask("job", []byte(tc.payload)), asynq.Queue("q"), asynq.MaxRetry(5))
		if err != nil {
			t.Fatal(err)
		}
		archived := false
		for i := 0; i < 100 && !archived; i++ {
			ti, err := insp.GetTaskInfo("q", info.ID)
			if err == nil && ti.State == asynq.TaskStateArchived {
				archived = true
				if !strings.HasPrefix(ti.LastErr, tc.reason) || ti.Retried != 0 {
					t.Errorf("%s archived with %q after %d retries, want %q and none", tc.payload, ti.LastErr, ti.Retried, tc.reason)
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !archived {
			t.Fatalf("%s not archived", tc.payload)
		}
	}
	// Nothing was charged: the whole burst is there for one task.
	if _, err := client.Enqueue(asynq.NewTask("job", []byte(`{"units": 30}`)), asynq.Queue("q")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		mu.Lock()
		n := len(ran)
		mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the task of cost 30 did not run at once: ran %v", ran)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSettleOutsideATask: Settle outside a task the middleware runs under
// a rule with a cost, or with a negative cost, is an error and records
// nothing.
func TestSettleOutsideATask(t *testing.T) {
	if err := Settle(context.Background(), 1); !errors.Is(err, ErrNoCost) {
		t.Errorf("outside a task: %v", err)
	}
	headers := map[string]string{"a": "X-Cost", "b": "X-Other"}
	if err := SettleFromHeaders(context.Background(), headers, func(string) string { return "1" }); !errors.Is(err, ErrNoCost) {
		t.Errorf("from headers outside a task: %v", err)
	}
	st := &settlement{costs: []int{3, 0}, rules: []string{"a", "b"}, actual: []int{-1, -1}}
	ctx := context.WithValue(context.Background(), settleKey{}, st)
	if err := Settle(ctx, -1); err == nil || errors.Is(err, ErrNoCost) {
		t.Errorf("negative: %v", err)
	}
	if err := SettleFromHeaders(ctx, headers, func(string) string { return "abc" }); err == nil || fmt.Sprint(st.actual) != "[-1 -1]" {
		t.Errorf("an invalid header: %v, actual %v", err, st.actual)
	}
	if err := SettleFromHeaders(ctx, nil, func(string) string { return "1" }); err != nil || fmt.Sprint(st.actual) != "[-1 -1]" {
		t.Errorf("no headers named: %v, actual %v", err, st.actual)
	}
	if err := SettleFromHeaders(ctx, headers, func(h string) string { return map[string]string{"X-Cost": " 1 ", "X-Other": "5"}[h] }); err != nil || fmt.Sprint(st.actual) != "[1 -1]" {
		t.Errorf("X-Cost: 1: %v, actual %v", err, st.actual)
	}
	if err := Settle(ctx, 2); err != nil || fmt.Sprint(st.actual) != "[2 -1]" {
		t.Errorf("Settle(2): %v, actual %v (the rule without a cost stays)", err, st.actual)
	}
	st.done = true
	if err := Settle(ctx, 1); !errors.Is(err, ErrNoCost) {
		t.Errorf("after the handler returned: %v", err)
	}
}

// TestSettleReachesRedis: under a rule of 1 per 100ms with a burst of 10
// and cost "{{.units}}", tasks of 5 units (2 of them fill the burst) run
// one per 500ms; when each settles at 1, the 4 units given back let the
// next tasks run sooner. With one worker running tasks one by one, 8 tasks
// take at least 6·500ms = 3s when nothing is settled (the two first run at
// once), and when each settles at 1, each task's net charge is 1 unit:
// the burst holds the whole run, which takes well under a second.
func TestSettleReachesRedis(t *testing.T) {
	for _, settle := range []bool{false, true} {
		t.Run(fmt.Sprint("settle=", settle), func(t *testing.T) {
			srv := redistest.StartServer(t)
			c := srv.Client(t)
			m := newMiddleware(t, c, policy.Rule{Name: "points", Match: policy.Match{Type: "job"}, Cost: "{{.units}}", Limit: quotas.GCRA(gcra.Limit{Rate: 10, Period: time.Second, Burst: 10})},
				policy.Rule{Name: "calls", Match: policy.Match{Type: "job"}, Limit: quotas.GCRA(gcra.Limit{Rate: 100, Period: time.Second, Burst: 100})})
			var mu sync.Mutex
			var at []time.Time
			runWorkers(t, c, m, 1, 1, "q", func(ctx context.Context, _ *asynq.Task) error {
				mu.Lock()
				at = append(at, time.Now())
				mu.Unlock()
				if settle {
					return Settle(ctx, 1)
				}
				return nil
			})
			client := asynq.NewClientFromRedisClient(c)
			for i := 0; i < 8; i++ {
				if _, err := client.Enqueue(asynq.NewTask("job", []byte(`{"units": 5}`)), asynq.Queue("q")); err != nil {
					t.Fatal(err)
				}
			}
			deadline := time.Now().Add(15 * time.Second)
			for {
				mu.Lock()
				n := len(at)
				mu.Unlock()
				if n == 8 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d of 8 ran", n)
				}
				time.Sleep(20 * time.Millisecond)
			}
			mu.Lock()
			span := at[7].Sub(at[0])
			mu.Unlock()
			t.Logf("8 tasks of cost 5 ran in %v", span)
			// Without settling: 6 more tasks of 5 units at 10 units/s after
			// the first two filled the burst: 3s, less the scheduling
			// slack of a booked copy (25ms each at most).
			if !settle && span < 3*time.Second-200*time.Millisecond {
				t.Errorf("unsettled: 8 tasks in %v, the limits allow no less than 3s", span)
			}
			// Settled at 1: the run needs 8 units net, inside the burst of
			// 10; a second is far more than the worker needs.
			if settle && span > time.Second {
				t.Errorf("settled at 1: 8 tasks in %v, want under 1s", span)
			}
		})
	}
}

// TestCostSpacing: the sweep estimates a backlog's tasks one interval
// apart times their cost (a task of 3 units under 30/s every 100ms, not
// every 33ms), and tasks of other costs are other backlogs.
func TestCostSpacing(t *testing.T) {
	p := mustPolicy(t, policy.Rule{Name: "points", Match: policy.Match{Type: "job"}, Cost: "{{.units}}", Limit: quotas.GCRA(gcra.Limit{Rate: 30, Period: time.Second, Burst: 30})},
		policy.Rule{Name: "window", Match: policy.Match{Type: "job"}, Limit: quotas.FixedWindow{Limit: 600, Every: time.Minute}})
	m, err := New(Config{Policy: p, Client: redistest.Client(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	b := p.Bind("job", "q")
	sp, err := m.split(b)
	if err != nil {
		t.Fatal(err)
	}
	// The window's 100ms per task binds at cost 1; the rate's 3·33.3ms at 3.
	for _, tc := range []struct {
		units int
		want  time.Duration
	}{{1, 100 * time.Millisecond}, {3, 100 * time.Millisecond}, {6, 200 * time.Millisecond}} {
		rq, err := b.Request([]byte(fmt.Sprintf(`{"units": %d}`, tc.units)))
		if err != nil {
			t.Fatal(err)
		}
		costs := pick(rq.Costs, sp.rateIdx)
		if got := sp.costSpacing(costs); got.Round(time.Millisecond) != tc.want {
			t.Errorf("units %d: spacing %v, want %v", tc.units, got, tc.want)
		}
	}
	one, _ := b.Request([]byte(`{"units": 1}`))
	three, _ := b.Request([]byte(`{"units": 3}`))
	if sp.signature(one.Keys, pick(one.Costs, sp.rateIdx)) != sp.signature(one.Keys, nil) {
		t.Error("a task of cost 1 is another backlog than one without costs")
	}
	if sp.signature(three.Keys, pick(three.Costs, sp.rateIdx)) == sp.signature(one.Keys, pick(one.Costs, sp.rateIdx)) {
		t.Error("tasks of cost 3 and 1 are one backlog")
	}
}
