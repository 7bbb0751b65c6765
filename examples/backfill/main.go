// Command backfill shows taskrl throttling a bulk backfill to what an
// internal service can take, without starving the interactive tasks that
// share the same workers:
//
//	go run ./examples/backfill
//
// 500 backfill tasks are enqueued at once on queue "bulk"; each calls an
// internal service (a local stand-in that answers 429 beyond 55 calls/s).
// One policy rule limits the queue:
//
//	rules:
//	  - name: backfill
//	    match: {queue: bulk}
//	    gcra: {rate: 50, per: 1s, burst: 5}
//
// Meanwhile interactive tasks arrive on queue "default" at 10 a second;
// no rule matches them, so the middleware lets them through without a Redis
// call. Both queues are served by the same two workers (asynq servers, 10
// goroutines each). A backfill task whose turn is more than half a second
// away is rescheduled to its booked slot instead of holding a goroutine, so
// the backlog never occupies the workers and interactive tasks start at
// once.
//
// Every second it prints the backfill rate and the interactive tasks' start
// latency (enqueue to handler); at the end the backfill's rate against the
// limit and the interactive latency's p50/p99/max. It exits 0 when every
// backfill task ran exactly once, the service never answered 429, nothing
// was archived or failed and no interactive task waited more than 2s.
//
// Redis is the real one at REDIS_URL when set, otherwise an embedded
// miniredis; queue names and keys get a per-run suffix and are deleted at
// the end. -tasks shrinks the run.
//
// The wiring (the policy, the middleware on each worker, a handler
// returning taskrl.Throttled on a 429) is the quickstart's, written out in
// full in examples/quickstart; here the helpers of examples/internal/examplekit do
// it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/examples/internal/examplekit"
	"github.com/taskrl/taskrl/internal/testkit/fakeapi"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/taskrl"
)

const (
	typeBackfill    = "backfill:row"
	typeInteractive = "user:action"
	// rate is the backfill limit, per second.
	rate = 50
	// interactiveEvery is how often an interactive task arrives.
	interactiveEvery = 100 * time.Millisecond
	// starved is the start latency the verdict does not accept.
	starved = 2 * time.Second
)

// serviceLimits protect the internal service: a little above the policy.
var serviceLimits = fakeapi.Limits{
	Global:  fakeapi.Limit{Rate: 55, Period: time.Second, Burst: 10},
	Latency: 10 * time.Millisecond,
}

type config struct {
	Tasks int
	// RedisURL is the real Redis to use; "" starts an embedded one.
	RedisURL string
	// Timeout bounds the run. Default 1m.
	Timeout time.Duration
}

// result is what a run measured, for the tests.
type result struct {
	Backfilled      int
	Rate            float64 // backfill calls per second, first to last
	Interactive     int
	P50, P99, Worst time.Duration
}

func main() {
	cfg := config{RedisURL: os.Getenv(examplekit.EnvVar)}
	flag.IntVar(&cfg.Tasks, "tasks", 500, "backfill tasks")
	flag.DurationVar(&cfg.Timeout, "timeout", time.Minute, "give up after this long")
	flag.Parse()
	examplekit.Main("backfill", run, cfg)
}

// row is a backfill task's payload.
type row struct {
	ID int `json:"id"`
}

// action is an interactive task's payload.
type action struct {
	EnqueuedAt int64 `json:"enqueued_at"` // Unix nanoseconds
}

// latencies collects interactive start latencies; safe for concurrent use.
type latencies struct {
	mu  sync.Mutex
	all []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.all = append(l.all, d)
	l.mu.Unlock()
}

// since returns the latencies recorded from index i on, and the new index.
func (l *latencies) since(i int) ([]time.Duration, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Duration(nil), l.all[i:]...), len(l.all)
}

// quantile returns the q-quantile of sorted ds (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func run(ctx context.Context, cfg config, out io.Writer) (*result, error) {
	if cfg.Tasks < 1 {
		return nil, fmt.Errorf("-tasks must be at least 1, got %d", cfg.Tasks)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Minute
	}
	env, err := examplekit.Setup("backfill", cfg.RedisURL, serviceLimits)
	if err != nil {
		return nil, err
	}
	bulk, interactive := env.NS+"-bulk", env.NS+"-default"
	defer env.Close(ctx, out, bulk, interactive)
	policyYAML := fmt.Sprintf(`rules:
  - name: backfill
    match: {queue: %s}
    gcra: {rate: %d, per: 1s, burst: 5}
`, bulk, rate)
	policy, err := policy.Parse([]byte(policyYAML))
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "Redis: %s\nInternal service: %s (answers 429 beyond 55/s)\nQueues: %s (backfill), %s (interactive)\nPolicy:\n%s\n\n",
		env.Redis, env.URL, bulk, interactive, examplekit.Indent(policyYAML))

	// Two workers serve both queues, each with its own middleware (wired as
	// in examples/quickstart). A backfill task calls the service (a 429
	// would become taskrl.Throttled); an interactive task stands for a
	// user's request and records how long it waited to start.
	var backfilled, interactiveDone atomic.Int64
	lat := &latencies{}
	backfillHandler := &examplekit.Caller{Method: http.MethodPut, URL: env.URL + "/rows", Name: "service", OK: &backfilled}
	interactiveHandler := asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		var a action
		if err := json.Unmarshal(t.Payload(), &a); err != nil {
			return fmt.Errorf("bad payload: %v: %w", err, asynq.SkipRetry)
		}
		lat.add(time.Since(time.Unix(0, a.EnqueuedAt)))
		time.Sleep(5 * time.Millisecond) // the user's request
		interactiveDone.Add(1)
		return nil
	})
	logger := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelWarn}))
	err = env.StartWorkers(examplekit.Workers{
		N:        2,
		Config:   taskrl.Config{Policy: policy, Prefix: env.Prefix, Logger: logger},
		Queues:   map[string]int{interactive: 3, bulk: 1},
		Handlers: map[string]asynq.Handler{typeBackfill: backfillHandler, typeInteractive: interactiveHandler},
	})
	if err != nil {
		return nil, err
	}

	// The backfill, enqueued at once (in the background, while the table
	// runs), and interactive traffic until the backfill is done.
	client := asynq.NewClientFromRedisClient(env.Client)
	ids := make([]string, cfg.Tasks)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-row-%d", env.NS, i+1)
	}
	ectx, stopEnqueue := context.WithCancel(ctx)
	enqueueErr := make(chan error, 1)
	enqueueDone := make(chan struct{})
	go func() {
		defer close(enqueueDone)
		for i, id := range ids {
			b, _ := json.Marshal(row{ID: i + 1})
			if _, err := client.EnqueueContext(ectx, asynq.NewTask(typeBackfill, b), asynq.Queue(bulk), asynq.TaskID(id)); err != nil {
				enqueueErr <- fmt.Errorf("enqueueing backfill task %d: %w", i+1, err)
				return
			}
		}
	}()
	fmt.Fprintf(out, "Enqueueing %d backfill tasks; interactive tasks arrive every %v.\n\n", cfg.Tasks, interactiveEvery)

	stopInteractive := make(chan struct{})
	var enqueuedInteractive atomic.Int64
	interactiveErr := make(chan error, 1)
	go func() {
		tick := time.NewTicker(interactiveEvery)
		defer tick.Stop()
		for {
			select {
			case <-stopInteractive:
				interactiveErr <- nil
				return
			case <-tick.C:
				b, _ := json.Marshal(action{EnqueuedAt: time.Now().UnixNano()})
				if _, err := client.EnqueueContext(ctx, asynq.NewTask(typeInteractive, b), asynq.Queue(interactive)); err != nil {
					interactiveErr <- fmt.Errorf("enqueueing an interactive task: %w", err)
					return
				}
				enqueuedInteractive.Add(1)
			}
		}
	}()

	fmt.Fprintf(out, "%5s %16s %12s %12s %20s\n", "sec", "backfill/limit", "service 2xx", "interactive", "its max latency")
	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	deadline := time.After(cfg.Timeout)
	var prevBackfill int64
	var prevOK, latIdx, sec int
	printRow := func(label string) {
		s := env.API.Stats()
		ls, next := lat.since(latIdx)
		latIdx = next
		b := backfilled.Load()
		fmt.Fprintf(out, "%5s %12d/%-3d %12d %12d %20v\n", label, b-prevBackfill, rate, s.OK-prevOK, len(ls), slices.Max(append(ls, 0)).Round(time.Millisecond))
		prevBackfill, prevOK = b, s.OK
	}
	var why string
	interactiveExited := false
loop:
	for {
		select {
		case <-ctx.Done():
			why = "interrupted"
			break loop
		case <-deadline:
			why = fmt.Sprintf("only %d of %d backfill tasks done after %v", backfilled.Load(), cfg.Tasks, cfg.Timeout)
			break loop
		case err := <-interactiveErr:
			why, interactiveExited = err.Error(), true
			break loop
		case err := <-enqueueErr:
			why = err.Error()
			break loop
		case <-tick.C:
			sec++
			printRow(fmt.Sprint(sec))
		case <-poll.C:
			if backfilled.Load() >= int64(cfg.Tasks) {
				if backfilled.Load() > prevBackfill {
					printRow(fmt.Sprintf("%.1f", time.Since(start).Seconds()))
				}
				break loop
			}
		}
	}
	// Stop both enqueuers before anything is cleaned up, so that no queue
	// key is written after its deletion.
	close(stopInteractive)
	if !interactiveExited {
		if err := <-interactiveErr; err != nil && why == "" {
			why = err.Error()
		}
	}
	stopEnqueue()
	<-enqueueDone
	// Let the last interactive tasks finish.
	for wait := time.Now().Add(2 * time.Second); interactiveDone.Load() < enqueuedInteractive.Load() && time.Now().Before(wait); {
		time.Sleep(20 * time.Millisecond)
	}
	env.Fleet.Stop()

	s := env.API.Stats()
	all, _ := lat.since(0)
	slices.Sort(all)
	res := &result{Backfilled: int(backfilled.Load()), Interactive: len(all), P50: quantile(all, 0.5), P99: quantile(all, 0.99)}
	if len(all) > 0 {
		res.Worst = all[len(all)-1]
	}
	var problems examplekit.Problems
	if why != "" {
		problems = append(problems, why)
	}
	if missing, twice := examplekit.Answered(env.API, ids); missing > 0 || twice > 0 {
		problems.Addf("%d backfill tasks never ran, %d ran more than once", missing, twice)
	}
	if s.Throttled > 0 {
		problems.Addf("the service answered 429 %d times", s.Throttled)
	}
	if n := enqueuedInteractive.Load(); interactiveDone.Load() != n {
		problems.Addf("%d of %d interactive tasks done", interactiveDone.Load(), n)
	}
	if res.Worst > starved {
		problems.Addf("an interactive task waited %v to start", res.Worst.Round(time.Millisecond))
	}
	ins := asynq.NewInspectorFromRedisClient(env.Client)
	for _, q := range []string{bulk, interactive} {
		problems.CheckQueue(ins, q)
	}

	fmt.Fprintln(out)
	if s.OK > 1 {
		span := s.LastOK.Sub(s.FirstOK)
		res.Rate = float64(s.OK-1) / span.Seconds()
		ideal := time.Duration(float64(max(0, s.OK-5)) / rate * float64(time.Second))
		fmt.Fprintf(out, "Backfill: %d tasks in %v (ideal %v at %d/s after a burst of 5): %.1f/s against a limit of %d/s.\n",
			s.OK, span.Round(10*time.Millisecond), ideal.Round(10*time.Millisecond), rate, res.Rate, rate)
	}
	fmt.Fprintf(out, "Service: %d calls, %d answered 429, busiest second %d (it allows 55/s burst 10).\n", s.Calls, s.Throttled, s.BusiestSecond().OK)
	fmt.Fprintf(out, "Interactive: %d tasks on the same workers; start latency p50 %v, p99 %v, max %v.\n",
		res.Interactive, res.P50.Round(time.Millisecond), res.P99.Round(time.Millisecond), res.Worst.Round(time.Millisecond))
	return res, problems.Verdict(out, "the backfill ran once each at its limit, the service saw no 429, and interactive tasks were not held up.")
}
