package taskrl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/admission"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func mustPolicy(t testing.TB, rules ...policy.Rule) *policy.Policy {
	t.Helper()
	p, err := policy.New(rules...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestUnmatchedTasksCostNothing: a task no rule matches reaches the handler
// without a single Redis command.
func TestUnmatchedTasksCostNothing(t *testing.T) {
	c := redistest.Client(t)
	h := &redistest.Counter{}
	c.AddHook(h)
	p := mustPolicy(t, policy.Rule{Name: "vendor", Match: policy.Match{Type: "vendor:*"}, Limit: quotas.GCRA(gcra.PerSecond(1))})
	m, err := New(Config{Policy: p, Client: c, Prefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	handler := m.Handler(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran++; return nil }))
	h.Take()
	for i := 0; i < 100; i++ {
		if err := handler.ProcessTask(context.Background(), asynq.NewTask("email:send", nil)); err != nil {
			t.Fatal(err)
		}
	}
	if ran != 100 || h.RoundTrips() != 0 {
		t.Fatalf("ran %d, %d Redis commands", ran, h.RoundTrips())
	}
}

// runWorkers starts n asynq servers in this process on c with the
// middleware, serving handler for queue, and stops them when the test ends.
// They look at their queue every 100ms when idle (asynq's default is 1s),
// so that the tests' timings measure the middleware, not asynq's polling;
// the pacer's lead is 250ms then.
func runWorkers(t *testing.T, c redis.UniversalClient, m *Middleware, n, concurrency int, queue string, handler asynq.HandlerFunc) {
	t.Cleanup(func() { m.Close() }) // after the servers' shutdown
	for i := 0; i < n; i++ {
		srv := asynq.NewServerFromRedisClient(c, m.ServerConfig(asynq.Config{
			TaskCheckInterval: 100 * time.Millisecond,
			Concurrency:       concurrency,
			Queues:            map[string]int{queue: 1},
			LogLevel:          asynq.ErrorLevel,
			RetryDelayFunc:    func(int, error, *asynq.Task) time.Duration { return 10 * time.Millisecond },
		}))
		mux := asynq.NewServeMux()
		mux.Use(m.Handler)
		mux.Handle("job", handler)
		if err := srv.Start(mux); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
	}
}

// TestThrottledTasksAreNeverArchived: 40 tasks with MaxRetry(0) under a 10/s
// limit on 2 workers. Every task runs exactly once, executions in any second
// never exceed the limit plus burst, and asynq archives or fails none.
func TestThrottledTasksAreNeverArchived(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	limit := gcra.Limit{Rate: 10, Period: time.Second, Burst: 2}
	p := mustPolicy(t, policy.Rule{Name: "rate", Match: policy.Match{Type: "job"}, Limit: quotas.GCRA(limit)})
	var obsMu sync.Mutex
	outcomes := map[Outcome]int{}
	withRules, keyed := 0, 0
	m, err := New(Config{Policy: p, Client: c, Observer: ObserverFunc(func(e Event) {
		obsMu.Lock()
		defer obsMu.Unlock()
		outcomes[e.Outcome]++
		if e.Outcome == Admitted && slices.Equal(e.Keys, []RuleKey{{Rule: "rate"}}) {
			keyed++ // booked copies too: the live charts count them
		}
		if len(e.Rules) == 1 && e.Rules[0].Name == "rate" && e.TaskType == "job" && e.Queue == "q" {
			withRules++
		}
	})})
	if err != nil {
		t.Fatal(err)
	}
	const tasks = 40
	var mu sync.Mutex
	runs := map[string]int{}
	var times []time.Time
	done := make(chan struct{})
	runWorkers(t, c, m, 2, 10, "q", func(ctx context.Context, task *asynq.Task) error {
		mu.Lock()
		defer mu.Unlock()
		runs[string(task.Payload())]++
		times = append(times, time.Now())
		if len(times) == tasks {
			close(done)
		}
		return nil
	})
	enqueueJobs(t, c, tasks, asynq.MaxRetry(0))
	start := time.Now()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("only %d of %d tasks ran", len(times), tasks)
	}
	elapsed := time.Since(start)
	time.Sleep(500 * time.Millisecond) // would a duplicate run?
	mu.Lock()
	defer mu.Unlock()
	for i := 0; i < tasks; i++ {
		if n := runs[fmt.Sprint(i)]; n != 1 {
			t.Errorf("task %d ran %d times", i, n)
		}
	}
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	for i := range times {
		n := 0
		for j := i; j < len(times) && times[j].Sub(times[i]) < time.Second; j++ {
			n++
		}
		// Handler timestamps are the workers' clock and include scheduling
		// noise; allow one extra.
		if n > 10+2+1 {
			t.Fatalf("%d executions within one second from %v", n, times[i].Sub(start))
		}
	}
	info, err := asynq.NewInspectorFromRedisClient(c).GetQueueInfo("q")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d tasks in %v (ideal %v); queue: processed %d, failed %d, archived %d, retry %d", tasks, elapsed, time.Duration(tasks-limit.Burst)*limit.Interval(), info.Processed, info.Failed, info.Archived, info.Retry)
	if info.Archived != 0 || info.Failed != 0 || info.Retry != 0 {
		t.Fatalf("archived %d, failed %d, retry %d", info.Archived, info.Failed, info.Retry)
	}
	// One decision per task, reported with the rule's state: admitted (at
	// once or after a wait) or booked and rescheduled; and one admitted
	// event per run, a booked copy's without rule state. A booked copy
	// that comes back after its slot has passed decides again (admission.LateBooking),
	// which a loaded machine does now and then: a few of those, no more.
	obsMu.Lock()
	defer obsMu.Unlock()
	if outcomes[Admitted] != tasks || outcomes[Rescheduled] == 0 || withRules < tasks || withRules > tasks+tasks/10 || keyed != tasks {
		t.Fatalf("observed %v, %d with rule state, %d admitted naming the rule", outcomes, withRules, keyed)
	}
}

// enqueueJobs enqueues n "job" tasks with payloads "0" to "n-1" in queue
// "q".
func enqueueJobs(t *testing.T, c redis.UniversalClient, n int, opts ...asynq.Option) {
	t.Helper()
	client := asynq.NewClientFromRedisClient(c)
	for i := 0; i < n; i++ {
		if _, err := client.Enqueue(asynq.NewTask("job", []byte(strconv.Itoa(i))), append([]asynq.Option{asynq.Queue("q")}, opts...)...); err != nil {
			t.Fatal(err)
		}
	}
}

func newMiddleware(t *testing.T, c redis.UniversalClient, rules ...policy.Rule) *Middleware {
	t.Helper()
	m, err := New(Config{Policy: mustPolicy(t, rules...), Client: c})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestSpentRetriesAreNotArchived: a task fails twice, spending its
// MaxRetry(2), and is then throttled: it is rescheduled, not archived, and
// runs to success.
func TestSpentRetriesAreNotArchived(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	m := newMiddleware(t, c, policy.Rule{Name: "rate", Match: policy.Match{Type: "job"}, Limit: quotas.GCRA(gcra.Limit{Rate: 1, Period: 3 * time.Second, Burst: 3})})
	var attempts atomic.Int32
	done := make(chan struct{})
	runWorkers(t, c, m, 1, 4, "q", func(ctx context.Context, task *asynq.Task) error {
		switch attempts.Add(1) {
		case 1, 2:
			return fmt.Errorf("vendor down")
		default:
			close(done)
			return nil
		}
	})
	client := asynq.NewClientFromRedisClient(c)
	if _, err := client.Enqueue(asynq.NewTask("job", nil), asynq.Queue("q"), asynq.MaxRetry(2)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("task did not succeed; %d attempts", attempts.Load())
	}
	info, _ := asynq.NewInspectorFromRedisClient(c).GetQueueInfo("q")
	if info.Archived != 0 || attempts.Load() != 3 {
		t.Fatalf("archived %d, attempts %d", info.Archived, attempts.Load())
	}
}

// TestMissingFieldArchivesWithReason: a task whose payload lacks the key
// field is archived, with the rule and field in its last error.
func TestMissingFieldArchivesWithReason(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	m := newMiddleware(t, c, policy.Rule{Name: "per-business", Match: policy.Match{Type: "job"}, Key: "{{.business_id}}", Limit: quotas.GCRA(gcra.PerSecond(10))})
	runWorkers(t, c, m, 1, 2, "q", func(context.Context, *asynq.Task) error { return nil })
	client := asynq.NewClientFromRedisClient(c)
	info, err := client.Enqueue(asynq.NewTask("job", []byte(`{"other":1}`)), asynq.Queue("q"))
	if err != nil {
		t.Fatal(err)
	}
	insp := asynq.NewInspectorFromRedisClient(c)
	for i := 0; i < 100; i++ {
		ti, err := insp.GetTaskInfo("q", info.ID)
		if err == nil && ti.State == asynq.TaskStateArchived {
			if !strings.Contains(ti.LastErr, `rule "per-business"`) || !strings.Contains(ti.LastErr, "business_id") {
				t.Fatalf("archived with %q", ti.LastErr)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("task not archived")
}

// TestConcurrencySlots: at most 2 tasks of one business run at once, counted
// by the handler itself; slots are released after a panic too.
func TestConcurrencySlots(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	m := newMiddleware(t, c, policy.Rule{Name: "slots", Match: policy.Match{Type: "job"}, Key: "{{.b}}", Limit: quotas.Concurrency{Max: 2, Lease: 30 * time.Second}})
	var running, most, finished atomic.Int32
	const tasks = 12
	done := make(chan struct{})
	runWorkers(t, c, m, 2, 6, "q", func(ctx context.Context, task *asynq.Task) error {
		n := running.Add(1)
		for {
			old := most.Load()
			if n <= old || most.CompareAndSwap(old, n) {
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
		running.Add(-1)
		if finished.Add(1) == tasks {
			close(done)
		}
		if finished.Load()%4 == 0 {
			panic("handler bug") // asynq recovers it; the slot must come back
		}
		return nil
	})
	client := asynq.NewClientFromRedisClient(c)
	for i := 0; i < tasks; i++ {
		if _, err := client.Enqueue(asynq.NewTask("job", []byte(`{"b":"b7"}`)), asynq.Queue("q"), asynq.MaxRetry(0)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("finished %d of %d", finished.Load(), tasks)
	}
	if most.Load() > 2 {
		t.Fatalf("%d tasks of one business ran at once, max 2", most.Load())
	}
	time.Sleep(200 * time.Millisecond)
	set := bindSet(t, mustPolicy(t, policy.Rule{Name: "slots", Match: policy.Match{Type: "job"}, Key: "{{.b}}", Limit: quotas.Concurrency{Max: 2, Lease: 30 * time.Second}}).Bind("job", "q"))
	st, err := m.limiter.Status(context.Background(), set, quotas.Request{Keys: []string{"b7"}})
	if err != nil || st.Rules[0].Used != 0 {
		t.Fatalf("slots still held after all tasks: %+v %v", st.Rules, err)
	}
}

// TestInteractiveBesideBulk: a minute's backlog of throttled tasks (600 at
// 10/s) shares a queue and its workers with tasks no rule matches. Those
// start within 1.7 s, what plain asynq gives a task enqueued while its
// servers sleep between looks (up to 1.5 times its default 1 s
// TaskCheckInterval), and the backlog still runs at its limit.
func TestInteractiveBesideBulk(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	limit := gcra.Limit{Rate: 10, Period: time.Second, Burst: 1}
	m := newMiddleware(t, c, policy.Rule{Name: "bulk", Match: policy.Match{Type: "bulk"}, Limit: quotas.GCRA(limit)})
	var mu sync.Mutex
	var bulkRuns []time.Time
	pingLatency := map[string]time.Duration{}
	handler := func(ctx context.Context, task *asynq.Task) error {
		mu.Lock()
		defer mu.Unlock()
		if task.Type() == "bulk" {
			bulkRuns = append(bulkRuns, time.Now())
			return nil
		}
		var sent int64
		fmt.Sscan(string(task.Payload()), &sent)
		pingLatency[string(task.Payload())] = time.Since(time.UnixMicro(sent))
		return nil
	}
	for i := 0; i < 2; i++ {
		s := asynq.NewServerFromRedisClient(c, m.ServerConfig(asynq.Config{Concurrency: 10, Queues: map[string]int{"default": 1}, LogLevel: asynq.ErrorLevel}))
		mux := asynq.NewServeMux()
		mux.Use(m.Handler)
		mux.HandleFunc("bulk", handler)
		mux.HandleFunc("ping", handler)
		if err := s.Start(mux); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Shutdown)
	}
	t.Cleanup(func() { m.Close() })
	client := asynq.NewClientFromRedisClient(c)
	for i := 0; i < 600; i++ {
		if _, err := client.Enqueue(asynq.NewTask("bulk", []byte(strconv.Itoa(i)))); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	for i := 0; i < 8; i++ {
		time.Sleep(500 * time.Millisecond)
		if _, err := client.Enqueue(asynq.NewTask("ping", []byte(strconv.FormatInt(time.Now().UnixMicro(), 10)))); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	mu.Lock()
	defer mu.Unlock()
	var worst time.Duration
	for _, l := range pingLatency {
		worst = max(worst, l)
	}
	inWindow := 0
	for _, r := range bulkRuns {
		if d := r.Sub(start); d >= time.Second && d < 4*time.Second {
			inWindow++
		}
	}
	t.Logf("%d pings, slowest started after %v; bulk ran %d times in 3 s (limit %v)", len(pingLatency), worst, inWindow, limit)
	if len(pingLatency) != 8 || worst > 1700*time.Millisecond {
		t.Fatalf("pings: %d started, slowest after %v", len(pingLatency), worst)
	}
	if inWindow < 3*10-2 || inWindow > 3*10+limit.Burst {
		t.Fatalf("bulk ran %d times in 3 s at 10/s", inWindow)
	}
}

// TestUpstreamThrottle: one call answers 429 with "retry after 1.5s": every
// worker backs off the rule's key until then, the throttled task runs again
// afterwards, exactly once more, and nothing is archived.
func TestUpstreamThrottle(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	rules := []policy.Rule{
		{Name: "vendor", Match: policy.Match{Type: "job"}, Limit: quotas.GCRA(gcra.Limit{Rate: 20, Period: time.Second, Burst: 2})},
		{Name: "daily", Match: policy.Match{Type: "job"}, Limit: quotas.CalendarWindow{Limit: 1000, Cron: "0 0 * * *", TZ: "America/Los_Angeles"}},
	}
	m := newMiddleware(t, c, rules...)
	const tasks = 40
	var mu sync.Mutex
	var throttledAt time.Time
	runs := map[string][]time.Time{}
	done := make(chan struct{})
	finished := 0
	runWorkers(t, c, m, 2, 5, "q", func(ctx context.Context, task *asynq.Task) error {
		mu.Lock()
		defer mu.Unlock()
		p := string(task.Payload())
		runs[p] = append(runs[p], time.Now())
		if p == "5" && len(runs[p]) == 1 {
			throttledAt = time.Now()
			return Throttled(1500*time.Millisecond, fmt.Errorf("429 Too Many Requests"))
		}
		if finished++; finished == tasks {
			close(done)
		}
		return nil
	})
	enqueueJobs(t, c, tasks, asynq.MaxRetry(0))
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("finished %d of %d", finished, tasks)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(runs["5"]) != 2 {
		t.Fatalf("throttled task ran %d times, want 2", len(runs["5"]))
	}
	// Nothing ran on any worker while the vendor asked to wait (allow the
	// executions that were already starting, within 20ms of the 429).
	for p, ts := range runs {
		for _, at := range ts {
			if d := at.Sub(throttledAt); d > 20*time.Millisecond && d < 1450*time.Millisecond {
				t.Fatalf("task %s ran %v after the 429", p, d)
			}
		}
	}
	info, _ := asynq.NewInspectorFromRedisClient(c).GetQueueInfo("q")
	if info.Archived != 0 || info.Failed != 0 {
		t.Fatalf("archived %d, failed %d", info.Archived, info.Failed)
	}
	// The daily quota counts the calls that happened: not the one the
	// vendor refused, nor the slots booked for tasks the back-off moved.
	checkUsed(t, m, rules, []string{"", ""}, 1, tasks)
}

// checkUsed fails t unless rule i of the "job" tasks' rules, at keys, has
// exactly want units used.
func checkUsed(t *testing.T, m *Middleware, rules []policy.Rule, keys []string, i, want int) {
	t.Helper()
	st, err := m.limiter.Status(context.Background(), bindSet(t, mustPolicy(t, rules...).Bind("job", "q")), quotas.Request{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rule %s: %d used for %d tasks that ran", rules[i].Name, st.Rules[i].Used, want)
	if st.Rules[i].Used != want {
		t.Fatalf("rule %s: %d used for %d tasks that ran", rules[i].Name, st.Rules[i].Used, want)
	}
}

// TestRedisOutage runs a matched task through the middleware while its
// Redis is stopped, in each mode of the policy: open runs it at once; local
// runs it at the rule's rate in this process; closed waits for Redis and
// runs it once Redis is back. No mode loses the task or panics.
func TestRedisOutage(t *testing.T) {
	rule := policy.Rule{Name: "rate", Match: policy.Match{Type: "job"}, Limit: quotas.GCRA(gcra.Limit{Rate: 5, Period: time.Second, Burst: 1})}
	for _, mode := range []policy.FailureMode{policy.FailOpen, policy.FailLocal, policy.FailClosed} {
		t.Run(string(mode), func(t *testing.T) {
			srv := redistest.StartServer(t, "--appendonly", "yes")
			c := srv.Client(t)
			p, err := mustPolicy(t, rule).WithFailureMode(mode)
			if err != nil {
				t.Fatal(err)
			}
			m, err := New(Config{Policy: p, Client: c, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			var ran atomic.Int32
			h := m.Handler(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran.Add(1); return nil }))
			srv.Stop(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			switch mode {
			case policy.FailOpen:
				// The first task pays the client's dial retries; the next
				// ones, within a second, do not try Redis again.
				var first time.Duration
				for i := 0; i < 5; i++ {
					if err := h.ProcessTask(ctx, asynq.NewTask("job", nil)); err != nil {
						t.Fatal(err)
					}
					if i == 0 {
						first = time.Since(start)
					}
				}
				if rest := time.Since(start) - first; ran.Load() != 5 || rest > 100*time.Millisecond {
					t.Fatalf("ran %d; first took %v, the other four %v", ran.Load(), first, rest)
				}
			case policy.FailLocal:
				for i := 0; i < 6; i++ {
					if err := h.ProcessTask(ctx, asynq.NewTask("job", nil)); err != nil {
						t.Fatal(err)
					}
				}
				// 5/s burst 1: the sixth task starts a second after the first.
				if ran.Load() != 6 || time.Since(start) < 900*time.Millisecond {
					t.Fatalf("ran %d in %v", ran.Load(), time.Since(start))
				}
			case policy.FailClosed:
				errc := make(chan error, 1)
				go func() { errc <- h.ProcessTask(ctx, asynq.NewTask("job", nil)) }()
				time.Sleep(700 * time.Millisecond)
				if ran.Load() != 0 {
					t.Fatal("ran while Redis was down")
				}
				srv.Start(t)
				if err := <-errc; err != nil || ran.Load() != 1 {
					t.Fatalf("after restart: ran %d, err %v", ran.Load(), err)
				}
				t.Logf("waited %v for Redis", time.Since(start))
			}
		})
	}
}

// TestThrottleBudget: under 2/s burst 1 with a 1.2s budget, of 6 tasks
// enqueued at once those that can start within the budget run (within it)
// and the rest are archived with the budget named.
func TestThrottleBudget(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	p := mustPolicy(t, policy.Rule{Name: "rate", Match: policy.Match{Type: "job"}, Limit: quotas.GCRA(gcra.Limit{Rate: 2, Period: time.Second, Burst: 1})})
	const budget = 1200 * time.Millisecond
	m, err := New(Config{Policy: p, Client: c, ThrottleBudget: budget})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var starts []time.Duration
	var enqueued time.Time
	runWorkers(t, c, m, 1, 10, "q", func(context.Context, *asynq.Task) error {
		mu.Lock()
		defer mu.Unlock()
		starts = append(starts, time.Since(enqueued))
		return nil
	})
	client := asynq.NewClientFromRedisClient(c)
	mu.Lock()
	enqueued = time.Now()
	mu.Unlock()
	for i := 0; i < 6; i++ {
		if _, err := client.Enqueue(asynq.NewTask("job", []byte(strconv.Itoa(i))), asynq.Queue("q"), asynq.MaxRetry(3)); err != nil {
			t.Fatal(err)
		}
	}
	insp := asynq.NewInspectorFromRedisClient(c)
	var archived []*asynq.TaskInfo
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		archived, _ = insp.ListArchivedTasks("q")
		mu.Lock()
		n := len(starts)
		mu.Unlock()
		if info, _ := insp.GetQueueInfo("q"); n+len(archived) == 6 && info.Scheduled == 0 {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("ran at %v; archived %d", starts, len(archived))
	if len(starts)+len(archived) != 6 || len(archived) < 2 || len(starts) < 3 {
		t.Fatalf("ran %d, archived %d", len(starts), len(archived))
	}
	for _, s := range starts {
		if s > budget+300*time.Millisecond {
			t.Fatalf("a task started %v after it was enqueued, budget %v", s, budget)
		}
	}
	for _, a := range archived {
		if !strings.Contains(a.LastErr, "throttle budget 1.2s spent") {
			t.Fatalf("archived with %q", a.LastErr)
		}
	}
}

// TestWindowResets: a fixed window of 5 per 2 s is exhausted by the first
// tasks; the rest are rescheduled to the following windows and run right
// after each reset (the pacer moves them at the window's start), 5 per
// window, none archived.
func TestWindowResets(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	window := quotas.FixedWindow{Limit: 5, Every: 2 * time.Second}
	m := newMiddleware(t, c, policy.Rule{Name: "window", Match: policy.Match{Type: "job"}, Limit: window})
	var mu sync.Mutex
	var runs []time.Time
	done := make(chan struct{})
	const tasks = 12
	runWorkers(t, c, m, 1, 10, "q", func(context.Context, *asynq.Task) error {
		mu.Lock()
		defer mu.Unlock()
		if runs = append(runs, time.Now()); len(runs) == tasks {
			close(done)
		}
		return nil
	})
	enqueueJobs(t, c, tasks, asynq.MaxRetry(0))
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%d of %d ran", len(runs), tasks)
	}
	mu.Lock()
	defer mu.Unlock()
	// Server and workers share this machine's clock: count per window.
	per := map[int64]int{}
	first := runs[0].UnixMicro() / window.Every.Microseconds()
	var late time.Duration // of the rescheduled tasks, after their window opened
	for _, r := range runs {
		w := r.UnixMicro() / window.Every.Microseconds()
		per[w]++
		if w != first {
			late = max(late, time.Duration(r.UnixMicro()-w*window.Every.Microseconds())*time.Microsecond)
		}
	}
	for w, n := range per {
		if n > window.Limit {
			t.Fatalf("window %d ran %d tasks, limit %d", w, n, window.Limit)
		}
	}
	info, _ := asynq.NewInspectorFromRedisClient(c).GetQueueInfo("q")
	t.Logf("runs per window %v; rescheduled tasks started at most %v after their window opened; archived %d", per, late, info.Archived)
	if len(per) < 3 || info.Archived != 0 || late > 500*time.Millisecond {
		t.Fatalf("windows %v, archived %d", per, info.Archived)
	}
}

// TestSlotRenewedWhileRunning: the heartbeat renews a running task's slot
// every third of its lease, so it outlives its lease while the task runs,
// and it lapses once the heartbeat stops. (Policies refuse leases under
// asynq's 30 s; the heartbeat is driven here with a 1 s lease to keep the
// test short.)
func TestSlotRenewedWhileRunning(t *testing.T) {
	c := redistest.Client(t)
	m, err := New(Config{Policy: &policy.Policy{}, Client: c, Prefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	set, err := quotas.NewSet(quotas.Rule{Name: "slots", Limit: quotas.Concurrency{Max: 1, Lease: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := quotas.Request{Keys: []string{"b1"}, Holder: "task-1"}
	d, err := m.limiter.Allow(ctx, set, req)
	if err != nil || !d.Allowed {
		t.Fatalf("first slot: %+v %v", d, err)
	}
	renewing := m.renew.add(d.Leases)
	held := func() int {
		st, err := m.limiter.Status(ctx, set, quotas.Request{Keys: []string{"b1"}})
		if err != nil {
			t.Fatal(err)
		}
		return st.Rules[0].Used
	}
	time.Sleep(2500 * time.Millisecond) // 2.5 leases
	if n := held(); n != 1 {
		t.Fatalf("after 2.5 leases with the heartbeat on: %d slots held, want 1", n)
	}
	if d, err := m.limiter.Allow(ctx, set, quotas.Request{Keys: []string{"b1"}, Holder: "task-2"}); err != nil || d.Allowed {
		t.Fatalf("a second holder got the renewed slot: %+v %v", d, err)
	}
	m.renew.remove(renewing)
	time.Sleep(1500 * time.Millisecond) // the lease lapses
	if n := held(); n != 0 {
		t.Fatalf("a lease after the heartbeat stopped: %d slots held, want 0", n)
	}
}

// TestRenewalsBatched: the slots of eight running tasks are renewed
// together, one call (a round trip) per third of their lease, not one call
// per task, and they outlive their lease.
func TestRenewalsBatched(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.Client(t).Options().Addr})
	defer c.Close()
	var count redistest.Counter
	m, err := New(Config{Policy: &policy.Policy{}, Client: c, Prefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	set, err := quotas.NewSet(quotas.Rule{Name: "slots", Limit: quotas.Concurrency{Max: 1, Lease: 1200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var held []*heldLeases
	for i := range 8 {
		d, err := m.limiter.Allow(ctx, set, quotas.Request{Keys: []string{fmt.Sprint("b", i)}, Holder: fmt.Sprint("task-", i)})
		if err != nil || !d.Allowed {
			t.Fatalf("slot %d: %+v %v", i, d, err)
		}
		held = append(held, m.renew.add(d.Leases))
	}
	c.AddHook(&count)
	time.Sleep(2 * time.Second) // 1.7 leases: 5 renewals of each
	cmds, pipes := count.Take()
	for i := range 8 {
		if d, err := m.limiter.Allow(ctx, set, quotas.Request{Keys: []string{fmt.Sprint("b", i)}, Holder: "other"}); err != nil || d.Allowed {
			t.Fatalf("slot %d after 1.7 leases: %+v %v; want still held", i, d, err)
		}
	}
	for _, h := range held {
		m.renew.remove(h)
	}
	t.Logf("2 s of 8 slots renewed every 400 ms: %d pipelines, %d single commands", pipes, cmds)
	if rounds := pipes + cmds; rounds < 4 || rounds > 8 {
		t.Errorf("%d pipelines and %d commands; want one call per renewal round (5, a few more at most), not a call per slot (40)", pipes, cmds)
	}
}

// TestBusySlotsKeepTheirCharge: tasks whose rate charge is made but whose
// concurrency slot stays busy longer than MaxHold are rescheduled with
// that charge as their booking: each runs once, never two at once, and the
// daily quota ends up charged exactly once per task.
func TestBusySlotsKeepTheirCharge(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	rules := []policy.Rule{
		{Name: "rate", Match: policy.Match{Type: "job"}, Limit: quotas.GCRA(gcra.Limit{Rate: 100, Period: time.Second, Burst: 10})},
		{Name: "daily", Match: policy.Match{Type: "job"}, Limit: quotas.CalendarWindow{Limit: 1000, Cron: "0 0 * * *", TZ: "Europe/London"}},
		{Name: "slot", Match: policy.Match{Type: "job"}, Key: "{{.b}}", Limit: quotas.Concurrency{Max: 1, Lease: 30 * time.Second}},
	}
	m := newMiddleware(t, c, rules...)
	const tasks = 4
	var running, most, finished atomic.Int32
	var mu sync.Mutex
	runs := map[string]int{}
	done := make(chan struct{})
	runWorkers(t, c, m, 1, 4, "q", func(ctx context.Context, task *asynq.Task) error {
		n := running.Add(1)
		for old := most.Load(); n > old && !most.CompareAndSwap(old, n); old = most.Load() {
		}
		time.Sleep(700 * time.Millisecond) // longer than MaxHold
		running.Add(-1)
		mu.Lock()
		runs[string(task.Payload())]++
		mu.Unlock()
		if finished.Add(1) == tasks {
			close(done)
		}
		return nil
	})
	client := asynq.NewClientFromRedisClient(c)
	for i := 0; i < tasks; i++ {
		if _, err := client.Enqueue(asynq.NewTask("job", []byte(fmt.Sprintf(`{"b":"b1","i":%d}`, i))), asynq.Queue("q"), asynq.MaxRetry(0)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("finished %d of %d", finished.Load(), tasks)
	}
	mu.Lock()
	defer mu.Unlock()
	for p, n := range runs {
		if n != 1 {
			t.Errorf("task %s ran %d times", p, n)
		}
	}
	if most.Load() > 1 {
		t.Errorf("%d tasks of one business ran at once, max 1", most.Load())
	}
	checkUsed(t, m, rules, []string{"", "", "b1"}, 1, tasks)
}

// TestUnmatchedThrottledIsRescheduled: a task no rule matches whose remote
// side answers 429 is rescheduled like any other, so with MaxRetry(0) it is
// not archived, and runs again after the Retry-After.
func TestUnmatchedThrottledIsRescheduled(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	m := newMiddleware(t, c, policy.Rule{Name: "other", Match: policy.Match{Type: "other"}, Limit: quotas.GCRA(gcra.Limit{Rate: 1, Period: time.Second, Burst: 1})})
	var runs []time.Time
	var mu sync.Mutex
	done := make(chan struct{})
	runWorkers(t, c, m, 1, 2, "q", func(ctx context.Context, task *asynq.Task) error {
		mu.Lock()
		defer mu.Unlock()
		runs = append(runs, time.Now())
		if len(runs) == 1 {
			return Throttled(700*time.Millisecond, fmt.Errorf("429"))
		}
		close(done)
		return nil
	})
	enqueueJobs(t, c, 1, asynq.MaxRetry(0))
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the throttled task did not run again")
	}
	mu.Lock()
	defer mu.Unlock()
	if gap := runs[1].Sub(runs[0]); gap < 700*time.Millisecond {
		t.Errorf("ran again %v after a 700ms Retry-After", gap)
	}
	info, _ := asynq.NewInspectorFromRedisClient(c).GetQueueInfo("q")
	if info.Archived != 0 || info.Failed != 0 {
		t.Errorf("archived %d, failed %d", info.Archived, info.Failed)
	}
}

// TestThrottleScope: a 429 for one business, under a throttle scope that
// names only the per-business rule, holds back that business alone; without
// the scope it holds back every business behind the shared vendor rule.
func TestThrottleScope(t *testing.T) {
	rules := []policy.Rule{
		{Name: "vendor", Match: policy.Match{Type: "job"}, Limit: quotas.GCRA(gcra.Limit{Rate: 100, Period: time.Second, Burst: 10})},
		{Name: "per-business", Match: policy.Match{Type: "job"}, Key: "{{.b}}", Limit: quotas.GCRA(gcra.Limit{Rate: 20, Period: time.Second, Burst: 2})},
	}
	const retryAfter = 2 * time.Second
	for _, scope := range [][]string{{"per-business"}, nil} {
		t.Run(fmt.Sprint(scope), func(t *testing.T) {
			c := redistest.StartServer(t).Client(t)
			p, err := mustPolicy(t, rules...).WithThrottle(scope...)
			if err != nil {
				t.Fatal(err)
			}
			m, err := New(Config{Policy: p, Client: c, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var throttledAt time.Time
			earliest, latest := map[string]time.Duration{}, map[string]time.Duration{} // starts after the 429
			throttled := make(chan struct{})
			runWorkers(t, c, m, 1, 4, "q", func(ctx context.Context, task *asynq.Task) error {
				mu.Lock()
				defer mu.Unlock()
				if throttledAt.IsZero() {
					throttledAt = time.Now()
					close(throttled)
					return Throttled(retryAfter, fmt.Errorf("429 for business a"))
				}
				var pl struct{ B string }
				_ = json.Unmarshal(task.Payload(), &pl)
				at := time.Since(throttledAt)
				if e, ok := earliest[pl.B]; !ok || at < e {
					earliest[pl.B] = at
				}
				latest[pl.B] = max(latest[pl.B], at)
				return nil
			})
			client := asynq.NewClientFromRedisClient(c)
			enqueue := func(b string) {
				if _, err := client.Enqueue(asynq.NewTask("job", []byte(`{"b":"`+b+`"}`)), asynq.Queue("q"), asynq.MaxRetry(0)); err != nil {
					t.Fatal(err)
				}
			}
			enqueue("a")
			<-throttled
			for i := 0; i < 5; i++ {
				enqueue("a")
				enqueue("b")
			}
			time.Sleep(retryAfter + time.Second)
			mu.Lock()
			defer mu.Unlock()
			t.Logf("scope %v: after the 429, business a started from %v, business b until %v", scope, earliest["a"], latest["b"])
			if a, ok := earliest["a"]; !ok || a < retryAfter-100*time.Millisecond {
				t.Errorf("business a ran %v after its 429, before the %v it asked for (ran: %v)", a, retryAfter, ok)
			}
			switch b := latest["b"]; {
			case b == 0:
				t.Fatal("business b never ran")
			case scope != nil && b > time.Second:
				t.Errorf("business b waited %v behind business a's 429", b)
			case scope == nil && b < retryAfter-100*time.Millisecond:
				t.Errorf("without a scope, business b ran %v after a 429 that blocks the vendor rule", b)
			}
		})
	}
}

// TestPause: a handler whose call succeeded but spent the remote quota
// pauses its rules on every worker until the reset, without running again;
// a context the middleware does not govern cannot pause anything.
func TestPause(t *testing.T) {
	c := redistest.StartServer(t).Client(t)
	m := newMiddleware(t, c, policy.Rule{Name: "vendor", Match: policy.Match{Type: "job"}, Limit: quotas.GCRA(gcra.Limit{Rate: 100, Period: time.Second, Burst: 10})})
	const pause = 1500 * time.Millisecond
	var mu sync.Mutex
	var pausedAt time.Time
	runs := map[string]int{}
	var after []time.Duration
	runWorkers(t, c, m, 2, 4, "q", func(ctx context.Context, task *asynq.Task) error {
		mu.Lock()
		defer mu.Unlock()
		runs[string(task.Payload())]++
		if pausedAt.IsZero() {
			pausedAt = time.Now()
			if !Pause(ctx, pause) {
				t.Error("Pause in a governed task's context returned false")
			}
			return nil
		}
		after = append(after, time.Since(pausedAt))
		return nil
	})
	if Pause(context.Background(), pause) {
		t.Error("Pause outside a task returned true")
	}
	if _, err := asynq.NewClientFromRedisClient(c).Enqueue(asynq.NewTask("job", []byte("first")), asynq.Queue("q"), asynq.MaxRetry(0)); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		p := !pausedAt.IsZero()
		mu.Unlock()
		if p {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the first task did not run")
		}
	}
	time.Sleep(50 * time.Millisecond) // the block is written when the handler returns
	enqueueJobs(t, c, 10, asynq.MaxRetry(0))
	time.Sleep(pause + time.Second)
	mu.Lock()
	defer mu.Unlock()
	if len(after) != 10 {
		t.Fatalf("%d of 10 tasks ran after the pause", len(after))
	}
	slices.Sort(after)
	t.Logf("after a %v pause, the next tasks started %v to %v later", pause, after[0], after[len(after)-1])
	if after[0] < pause-50*time.Millisecond {
		t.Errorf("a task started %v after a %v pause", after[0], pause)
	}
	if len(runs) != 11 {
		t.Errorf("%d distinct tasks ran, want 11", len(runs))
	}
	for p, n := range runs {
		if n != 1 {
			t.Errorf("task %s ran %d times", p, n)
		}
	}
	info, _ := asynq.NewInspectorFromRedisClient(c).GetQueueInfo("q")
	if info.Archived != 0 || info.Failed != 0 {
		t.Fatalf("archived %d, failed %d", info.Archived, info.Failed)
	}
}

// TestThrottleBlocksWindowsAndSlots: a 429 holds back, on every worker,
// tasks whose only rules are a window or a concurrency rule: new decisions
// wait for the block as they do behind a GCRA rule.
func TestThrottleBlocksWindowsAndSlots(t *testing.T) {
	for _, rule := range []policy.Rule{
		{Name: "hourly", Match: policy.Match{Type: "job"}, Limit: quotas.FixedWindow{Limit: 1000, Every: time.Hour}},
		{Name: "slots", Match: policy.Match{Type: "job"}, Limit: quotas.Concurrency{Max: 5, Lease: time.Minute}},
	} {
		t.Run(rule.Name, func(t *testing.T) {
			c := redistest.StartServer(t).Client(t)
			m := newMiddleware(t, c, rule)
			const retryAfter = 1500 * time.Millisecond
			var mu sync.Mutex
			var throttledAt time.Time
			var after []time.Duration
			runWorkers(t, c, m, 2, 4, "q", func(ctx context.Context, task *asynq.Task) error {
				mu.Lock()
				defer mu.Unlock()
				if throttledAt.IsZero() {
					throttledAt = time.Now()
					return Throttled(retryAfter, errors.New("429"))
				}
				if string(task.Payload()) != "first" {
					after = append(after, time.Since(throttledAt))
				}
				return nil
			})
			if _, err := asynq.NewClientFromRedisClient(c).Enqueue(asynq.NewTask("job", []byte("first")), asynq.Queue("q"), asynq.MaxRetry(0)); err != nil {
				t.Fatal(err)
			}
			for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				mu.Lock()
				p := !throttledAt.IsZero()
				mu.Unlock()
				if p {
					break
				}
				if time.Now().After(end) {
					t.Fatal("the first task did not run")
				}
			}
			time.Sleep(50 * time.Millisecond) // the block is written as the handler returns
			enqueueJobs(t, c, 10, asynq.MaxRetry(0))
			time.Sleep(retryAfter + 1500*time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			if len(after) != 10 {
				t.Fatalf("%d of 10 tasks ran", len(after))
			}
			slices.Sort(after)
			t.Logf("%s: after a %v 429, the next tasks started %v to %v later", rule.Name, retryAfter, after[0], after[len(after)-1])
			if after[0] < retryAfter-50*time.Millisecond {
				t.Errorf("a task started %v after a %v 429", after[0], retryAfter)
			}
		})
	}
}

// TestWaitedRunsOnce: a task delivered a second time after the same wait
// (as after a Redis failover that lost the pacer's move to pending) ends
// without running: the first delivery marked it. A task that did not
// wait runs every time.
func TestWaitedRunsOnce(t *testing.T) {
	c := redistest.StartServer(t).Client(t)
	m := newMiddleware(t, c, policy.Rule{Name: "peak", Match: policy.Match{Type: "job"}, Limit: quotas.GCRA(gcra.Limit{Rate: 1000, Period: time.Second, Burst: 100})})
	var mu sync.Mutex
	runs := map[string]int{}
	runWorkers(t, c, m, 1, 4, "q", func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		defer mu.Unlock()
		runs[id]++
		return nil
	})
	client := asynq.NewClientFromRedisClient(c)
	insp := asynq.NewInspectorFromRedisClient(c)
	deliver := func(id string, headers map[string]string) {
		t.Helper()
		if _, err := client.Enqueue(asynq.NewTaskWithHeaders("job", nil, headers), asynq.Queue("q"), asynq.TaskID(id)); err != nil {
			t.Fatal(err)
		}
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if _, err := insp.GetTaskInfo("q", id); errors.Is(err, asynq.ErrTaskNotFound) {
				return // done and deleted: the ID may be enqueued again
			}
			if time.Now().After(end) {
				t.Fatalf("task %s did not finish", id)
			}
		}
	}
	for i := 0; i < 2; i++ {
		deliver("x", map[string]string{HeaderRound: "1"})
		deliver("plain", nil)
	}
	mu.Lock()
	defer mu.Unlock()
	if runs["x"] != 1 || runs["plain"] != 2 {
		t.Fatalf("runs %v: want the waited task once and the other twice", runs)
	}
}

// TestAdmissionAgrees checks what admission.Plan assumes of this package
// and of quotas: the value of a denial that never passes, and the failure
// modes.
func TestAdmissionAgrees(t *testing.T) {
	if admission.Never != quotas.Never {
		t.Errorf("admission.Never %v, quotas.Never %v", admission.Never, quotas.Never)
	}
	d := quotas.Decision{Rule: "r", RetryAfter: quotas.Never, Now: time.Unix(5, 0)}
	if a := admission.Plan(admission.Limits{}, admission.Step{Stage: admission.Rates, Decision: outcome(d), Left: admission.NoDeadline}); a.Verb != admission.Refuse || a.Rule != "r" {
		t.Errorf("a never-passing decision plans %+v, want a refusal naming rule r", a)
	}
	for f, want := range map[policy.FailureMode]admission.Mode{policy.FailClosed: admission.FailClosed, policy.FailOpen: admission.FailOpen, policy.FailLocal: admission.FailLocal, "": admission.FailClosed} {
		if got := failMode(f); got != want {
			t.Errorf("failMode(%q) = %v, want %v", f, got, want)
		}
	}
}

// bindSet is b's rules as one quotas.Set.
func bindSet(t testing.TB, b *policy.Binding) *quotas.Set {
	t.Helper()
	s, err := quotas.NewSet(b.Rules()...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
