// Command quickstart shows taskrl holding a strict third-party API's limits
// across several asynq workers, with zero setup:
//
//	go run ./examples/quickstart
//
// It starts, all in this process:
//   - Redis: the real one at REDIS_URL when that is set, otherwise an
//     embedded Redis-compatible server (miniredis);
//   - a stand-in for a strict vendor API that publishes 20 calls/s (burst 5),
//     2 calls/s per business (burst 2) and 170 calls per 10-second window,
//     and answers 429 Too Many Requests the moment any of them is exceeded;
//   - a policy just under those limits, written as the YAML policy file a
//     worker reads (printed at start);
//   - three asynq servers ("workers"), each with its own taskrl middleware,
//     whose handler calls the vendor with Idempotency-Key = the asynq task ID
//     and turns a 429 into taskrl.Throttled;
//   - a fan-out campaign: 600 tasks over 20 businesses, half of them with
//     asynq.MaxRetry(0), all enqueued at once.
//
// Every second it prints a row: tasks admitted in that second against the
// limit, the vendor's 2xx answers, the policy window's quota left, tasks
// held in a worker or rescheduled to a booked slot (from a taskrl.Observer),
// the 429s the vendor answered and progress. At the end it prints a summary
// and exits 0 only if every task ran exactly once, none was archived or
// failed and the vendor never answered 429.
//
// The wiring to copy into a worker of your own is all in this file: the
// policy parsed with policy.Parse, the worker loop in run
// (taskrl.New, mw.ServerConfig, mux.Use(mw.Handler)) and
// vendorHandler. The package examples/internal/examplekit only supplies the
// demonstration's scaffolding: the Redis, the vendor's stand-in, stopping
// the workers and cleaning up, and the verdict.
//
// Flags shrink the run (-tasks, -businesses, -workers). Against a real
// Redis it uses its own queue and key prefix, and deletes them at the end.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/examples/internal/examplekit"
	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/fakeapi"
	"github.com/taskrl/taskrl/internal/testkit/ideal"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/taskrl"
)

// taskType is the task the campaign fans out: one vendor call each.
const taskType = "vendor:sync"

// vendorLimits are what the vendor publishes and enforces.
var vendorLimits = fakeapi.Limits{
	Global:      fakeapi.Limit{Rate: 20, Period: time.Second, Burst: 5},
	PerBusiness: fakeapi.Limit{Rate: 2, Period: time.Second, Burst: 2},
	Quota:       fakeapi.Quota{Limit: 170, Every: 10 * time.Second},
	Latency:     20 * time.Millisecond,
}

// policyYAML is the policy, in the format of the worker's policy file:
// every limit a little under the vendor's.
const policyYAML = `# The vendor allows 20 calls/s (burst 5), 2/s per business and 170 per
# 10 s window. Stay just under every limit, for all workers together:
rules:
  - name: vendor-peak
    match: {type: "vendor:sync"}
    gcra: {rate: 18, per: 1s, burst: 3}
  - name: vendor-window
    match: {type: "vendor:sync"}
    quota: {limit: 160, every: 10s}        # fixed window aligned to the epoch
  - name: per-business
    match: {type: "vendor:sync"}
    key: "{{.business_id}}"                # one limit per business in the payload
    gcra: {rate: 1.8, per: 1s, burst: 1}
  - name: business-concurrency
    match: {type: "vendor:sync"}
    key: "{{.business_id}}"
    concurrency: {max: 2, lease: 30s}
`

// The policy's numbers, for the table and the ideal schedule.
var (
	peak      = gcra.Limit{Rate: 18, Period: time.Second, Burst: 3}
	perBiz    = gcra.Limit{Rate: 1.8, Period: time.Second, Burst: 1}
	window    = 160
	windowLen = 10 * time.Second
)

// config is what the flags set.
type config struct {
	Tasks, Businesses, Workers int
	// RedisURL is the real Redis to use; "" starts an embedded one.
	RedisURL string
	// Timeout bounds the whole campaign. Default 2m.
	Timeout time.Duration
	// Policy is the policy file's text. Default policyYAML.
	Policy string
}

func main() {
	cfg := config{RedisURL: os.Getenv(examplekit.EnvVar)}
	flag.IntVar(&cfg.Tasks, "tasks", 600, "tasks in the campaign")
	flag.IntVar(&cfg.Businesses, "businesses", 20, "businesses the tasks are spread over (b1..bN)")
	flag.IntVar(&cfg.Workers, "workers", 3, "asynq servers (workers), each with its own middleware")
	flag.DurationVar(&cfg.Timeout, "timeout", 2*time.Minute, "give up after this long")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart: FAILED:", err)
		os.Exit(1)
	}
}

// payload is a task's JSON payload.
type payload struct {
	BusinessID string `json:"business_id"`
	N          int    `json:"n"`
}

// counters are what the handlers and the observer count; safe for
// concurrent use.
type counters struct {
	ran, done, throttled        atomic.Int64 // handler runs, 2xx, 429s seen
	admitted, held, rescheduled atomic.Int64 // from the Observer
	refused, redisErrs          atomic.Int64
	// total is the campaign's size; allDone is closed when that many
	// tasks are done.
	total   int64
	allDone chan struct{}

	mu       sync.Mutex
	byWindow map[int64]int // policy window start (Unix s) -> tasks charged to it
}

// Observe implements taskrl.Observer.
func (c *counters) Observe(e taskrl.Event) {
	switch e.Outcome {
	case taskrl.Admitted:
		if len(e.Rules) == 0 {
			break // a booked task runs in its slot: counted as rescheduled
		}
		if e.Wait > 0 {
			c.held.Add(1)
		} else {
			c.admitted.Add(1)
		}
	case taskrl.Rescheduled:
		c.rescheduled.Add(1)
	case taskrl.Refused:
		c.refused.Add(1)
	case taskrl.RedisError:
		c.redisErrs.Add(1)
	}
}

// charge counts a task that runs against the policy window it was charged
// to: its booked slot (taskrl.Booked) if the middleware booked one,
// otherwise now.
func (c *counters) charge(ctx context.Context) {
	at := time.Now()
	if slot, ok := taskrl.Booked(ctx); ok {
		at = slot
	}
	c.mu.Lock()
	c.byWindow[windowStart(at)]++
	c.mu.Unlock()
}

// windowLeft is the policy window's quota left at now.
func (c *counters) windowLeft(now time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return max(0, window-c.byWindow[windowStart(now)])
}

func windowStart(t time.Time) int64 {
	s := int64(windowLen / time.Second)
	return t.Unix() / s * s
}

// vendorHandler calls the vendor for one task. The Idempotency-Key is the
// asynq task ID, which a task keeps however often taskrl makes it wait, so
// the vendor can tell a repeated call; a 429 becomes taskrl.Throttled, which
// backs every worker off and reschedules the task without spending a retry.
func vendorHandler(client *http.Client, url string, c *counters) asynq.HandlerFunc {
	return func(ctx context.Context, t *asynq.Task) error {
		c.ran.Add(1)
		c.charge(ctx)
		var p payload
		if err := json.Unmarshal(t.Payload(), &p); err != nil {
			return fmt.Errorf("bad payload: %v: %w", err, asynq.SkipRetry)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/sync", strings.NewReader(string(t.Payload())))
		if err != nil {
			return fmt.Errorf("%v: %w", err, asynq.SkipRetry)
		}
		id, _ := asynq.GetTaskID(ctx)
		req.Header.Set("Idempotency-Key", id)
		req.Header.Set("X-Business-ID", p.BusinessID)
		resp, err := client.Do(req)
		if err != nil {
			return err // a network error: asynq retries
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		switch {
		case resp.StatusCode == http.StatusTooManyRequests:
			c.throttled.Add(1)
			return taskrl.Throttled(retryAfter(resp.Header.Get("Retry-After")), fmt.Errorf("vendor: %s", resp.Status))
		case resp.StatusCode/100 == 2:
			if c.done.Add(1) == c.total {
				close(c.allDone)
			}
			return nil
		default:
			return fmt.Errorf("vendor: %s", resp.Status)
		}
	}
}

// retryAfter parses a Retry-After header: seconds or an HTTP date; 0 when
// missing or garbled (taskrl then waits 1s).
func retryAfter(v string) time.Duration {
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(t))
	}
	return 0
}

// run runs the whole demonstration and returns an error saying why the run
// failed, or nil.
func run(ctx context.Context, cfg config, out io.Writer) error {
	if cfg.Tasks < 1 || cfg.Businesses < 1 || cfg.Workers < 1 {
		return fmt.Errorf("-tasks, -businesses and -workers must be at least 1, got %d, %d, %d", cfg.Tasks, cfg.Businesses, cfg.Workers)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	// The Redis, the vendor's stand-in, and a queue and key prefix of this
	// run's own; Close stops the workers and deletes the queue and keys.
	env, err := examplekit.Setup("quickstart", cfg.RedisURL, vendorLimits)
	if err != nil {
		return err
	}
	queue := env.NS
	defer env.Close(ctx, out, queue)
	if cfg.Policy == "" {
		cfg.Policy = policyYAML
	}
	policy, err := policy.Parse([]byte(cfg.Policy))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "Redis: %s\nVendor API: %s (20/s burst 5, 2/s per business, 170 per 10s; answers 429 beyond)\n", env.Redis, env.URL)
	fmt.Fprintf(out, "Policy:\n%s\n", examplekit.Indent(cfg.Policy))

	// The workers: each an asynq server with its own taskrl middleware, as
	// in a worker process of your own.
	c := &counters{byWindow: map[int64]int{}, total: int64(cfg.Tasks), allDone: make(chan struct{})}
	httpClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	for i := 0; i < cfg.Workers; i++ {
		// Each worker has its own Redis connections, as a separate process
		// would.
		rdb := env.Redis.Client()
		mw, err := taskrl.New(taskrl.Config{Policy: policy, Client: rdb, Prefix: env.Prefix, Observer: c, Logger: logger})
		if err != nil {
			return err
		}
		srv := asynq.NewServerFromRedisClient(rdb, mw.ServerConfig(asynq.Config{
			Concurrency:     10,
			Queues:          map[string]int{queue: 1},
			LogLevel:        asynq.WarnLevel,
			ShutdownTimeout: 3 * time.Second,
		}))
		mux := asynq.NewServeMux()
		mux.Use(mw.Handler)
		mux.Handle(taskType, vendorHandler(httpClient, env.URL, c))
		if err := srv.Start(mux); err != nil {
			mw.Close()
			return fmt.Errorf("starting worker %d: %w", i+1, err)
		}
		// On the way out the fleet shuts srv down first, then closes mw
		// (srv.Shutdown(), then mw.Close(), as a worker process does).
		env.Fleet.Add(srv, mw)
	}

	// The campaign: all tasks at once, round-robin over the businesses,
	// enqueued in the background while the table runs. The task IDs are
	// ours, so the vendor's records can be checked against them.
	start := time.Now()
	ids := make([]string, cfg.Tasks)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", env.NS, i+1)
	}
	// The embedded Redis runs one command at a time (and each script in a
	// fresh Lua interpreter); one enqueuer leaves it room for the workers.
	enqueuers := 1
	if !env.Redis.Embedded() {
		enqueuers = 4
	}
	ectx, stopEnqueue := context.WithCancel(ctx)
	enqueueErr := make(chan error, 1)
	go func() {
		enqueueErr <- enqueue(ectx, asynq.NewClientFromRedisClient(env.Client), queue, ids, cfg.Businesses, enqueuers)
	}()
	enqueued := false
	fmt.Fprintf(out, "Enqueueing %d tasks for %d businesses (half with MaxRetry(0)); %d workers × 10 goroutines.\n\n",
		cfg.Tasks, cfg.Businesses, cfg.Workers)

	// The live table, one row per second.
	fmt.Fprintf(out, "%5s %11s %11s %12s %6s %12s %5s %11s\n", "sec", "ran/limit", "vendor 2xx", "window left", "held", "rescheduled", "429s", "done")
	tableStart := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	deadline := time.After(cfg.Timeout)
	var prevRan, prevOK int64
	row := func(sec float64, now time.Time) {
		ran, ok := c.ran.Load(), int64(env.API.Stats().OK)
		fmt.Fprintf(out, "%5.4g %7d/%-3.0f %11d %8d/%-3d %6d %12d %5d %5d/%d\n",
			sec, ran-prevRan, peak.Rate, ok-prevOK, c.windowLeft(now), window,
			c.held.Load(), c.rescheduled.Load(), c.throttled.Load(), c.done.Load(), cfg.Tasks)
		prevRan, prevOK = ran, ok
	}
	var why string
	for sec := 1; why == ""; {
		select {
		case <-ctx.Done():
			why = "interrupted"
		case <-deadline:
			why = fmt.Sprintf("only %d of %d tasks done after %v", c.done.Load(), cfg.Tasks, cfg.Timeout)
		case err := <-enqueueErr:
			enqueued = true
			if err == nil {
				continue
			}
			why = err.Error()
		case now := <-tick.C:
			row(float64(sec), now)
			sec++
			continue
		case <-c.allDone:
			// The last, partial second.
			now := time.Now()
			row(float64(sec-1)+now.Sub(tableStart.Add(time.Duration(sec-1)*time.Second)).Seconds(), now)
		}
		break
	}
	elapsed := time.Since(start)
	// Stop enqueueing before anything is cleaned up (a timeout or Ctrl-C
	// may come first), so that no queue key is written after its deletion.
	stopEnqueue()
	if !enqueued {
		<-enqueueErr
	}
	env.Fleet.Stop()
	return report(out, cfg, env, queue, ids, c, elapsed, why)
}

// enqueue enqueues one task per ID, the i-th for business b(i mod
// businesses + 1), every other one with MaxRetry(0), from parallel
// goroutines, each a contiguous run of the IDs: however the goroutines
// interleave, every business's tasks arrive spread over the whole fan-out.
// (Goroutine g taking every parallel-th ID instead gave each one the same
// few businesses, all of whose tasks came last when it lagged: they then
// ran at their own 1.8/s at the end, 14 % over the ideal in one run.)
func enqueue(ctx context.Context, client *asynq.Client, queue string, ids []string, businesses, parallel int) error {
	errs := make([]error, parallel)
	var wg sync.WaitGroup
	for g := 0; g < parallel; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g * len(ids) / parallel; i < (g+1)*len(ids)/parallel; i++ {
				b, _ := json.Marshal(payload{BusinessID: fmt.Sprintf("b%d", i%businesses+1), N: i + 1})
				opts := []asynq.Option{asynq.Queue(queue), asynq.TaskID(ids[i])}
				if i%2 == 1 {
					opts = append(opts, asynq.MaxRetry(0)) // never archived for waiting on a limit
				}
				if _, err := client.EnqueueContext(ctx, asynq.NewTask(taskType, b), opts...); err != nil {
					errs[g] = fmt.Errorf("enqueueing task %s: %w", ids[i], err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// report prints the summary and the verdict; the error says what went
// wrong.
func report(out io.Writer, cfg config, env *examplekit.Env, queue string, ids []string, c *counters, elapsed time.Duration, why string) error {
	s := env.API.Stats()
	var problems examplekit.Problems
	if why != "" {
		problems = append(problems, why)
	}
	// Every task reached the vendor with its own key, answered 2xx once.
	if missing, twice := examplekit.Answered(env.API, ids); missing > 0 || twice > 0 || s.OK != len(ids) {
		problems.Addf("%d tasks never ran, %d ran more than once (%d 2xx answers for %d tasks)", missing, twice, s.OK, len(ids))
	}
	if s.Throttled > 0 {
		problems.Addf("the vendor answered 429 %d times %v", s.Throttled, s.ThrottledBy)
	}
	info := problems.CheckQueue(asynq.NewInspectorFromRedisClient(env.Client), queue)

	fmt.Fprintln(out)
	if s.OK > 1 && len(problems) == 0 {
		span := s.LastOK.Sub(s.FirstOK)
		ideal := idealSpan(s.FirstOK, cfg.Tasks, cfg.Businesses)
		fmt.Fprintf(out, "Ran %d tasks in %v from the first vendor call to the last; ideal under the policy %v (%+.1f%%); %v in all.\n",
			s.OK, span.Round(10*time.Millisecond), ideal.Round(10*time.Millisecond), 100*(span.Seconds()/ideal.Seconds()-1), elapsed.Round(10*time.Millisecond))
		sustained := min(peak.Rate, float64(window)/windowLen.Seconds())
		fmt.Fprintf(out, "Achieved %.1f calls/s; the policy allows %v/s peak and %d per %v (%.0f/s sustained); the vendor %v/s.\n",
			float64(s.OK-1)/span.Seconds(), peak.Rate, window, windowLen, sustained, vendorLimits.Global.Rate)
	}
	fmt.Fprintf(out, "Vendor saw %d calls: %d answered 2xx, %d answered 429, %d duplicate keys; busiest second %d calls.\n",
		s.Calls, s.OK, s.Throttled, s.Duplicates, s.BusiestSecond().OK)
	fmt.Fprintf(out, "taskrl: %d admitted at once, %d held in a worker, %d rescheduled to a booked slot, %d refused, %d Redis errors.\n",
		c.admitted.Load(), c.held.Load(), c.rescheduled.Load(), c.refused.Load(), c.redisErrs.Load())
	fmt.Fprintf(out, "asynq: %d archived, %d failed, %d pending, %d scheduled (%d tasks had MaxRetry(0)).\n",
		info.Archived, info.Failed, info.Pending, info.Scheduled, cfg.Tasks/2)
	return problems.Verdict(out, "every task ran exactly once, none archived or failed, and the vendor never answered 429.")
}

// idealSpan is how long tasks tasks over businesses businesses take from the
// first call to the last when each runs at the earliest moment the policy's
// limits allow (package ideal, computed from the limits alone): the
// standard to measure the run against. (The concurrency rule does not bind
// at the vendor's latency.)
func idealSpan(first time.Time, tasks, businesses int) time.Duration {
	calls := make([]ideal.Call, tasks)
	for i := range calls {
		calls[i] = ideal.Call{At: first, Key: strconv.Itoa(i % businesses)}
	}
	rules := []ideal.Rule{{GCRA: ideal.Limit(peak)}, {GCRA: ideal.Limit(perBiz), Keyed: true}, {Limit: window, Every: windowLen}}
	return ideal.Last(ideal.Schedule(rules, calls)).Sub(first)
}
