// Command vendorquota shows taskrl enforcing a third-party API's quota from
// every worker at once, and the whole fleet backing off when the vendor
// still answers 429:
//
//	go run ./examples/vendorquota
//
// The vendor (a local stand-in) allows 20 calls/s (burst 5) and 2 calls/s
// per customer business; it also has a daily quota that resets at midnight
// in Los Angeles. The policy stays under all three, with one rule each:
//
//   - vendor-peak: GCRA 18/s, burst 3;
//   - vendor-daily: a calendar window, cron "0 0 * * *" in
//     America/Los_Angeles; 10,000 a day in real life, 250 here so that the
//     run reaches it: the tasks beyond it are rescheduled to the first
//     moment of the next day in Los Angeles, neither dropped nor archived;
//   - per-business: GCRA 1.8/s per business_id in the payload.
//
// Three workers (asynq servers with the middleware) serve 300 tasks. A
// third of the way through, the vendor sheds load on its own for 2 seconds
// and answers 429 with Retry-After to every call. The handler turns the
// first 429 into taskrl.Throttled: the middleware blocks the vendor rules
// for every worker until the Retry-After has passed, so the fleet stops
// calling instead of each worker learning it separately. The report counts
// the calls that reached the vendor during those 2 seconds (close to 0),
// the daily quota used and the tasks waiting for tomorrow's quota.
//
// Redis is the real one at REDIS_URL when set, otherwise an embedded
// miniredis. Flags shrink the run (-tasks, -daily, -businesses). It exits 0
// when every task ran exactly once or is waiting for tomorrow's quota, none
// was archived or failed, and the vendor answered no 429 beyond the forced
// ones.
//
// The wiring (the policy, the middleware on each worker, the handler
// returning taskrl.Throttled) is the quickstart's, written out in full in
// examples/quickstart; here the helpers of examples/internal/examplekit do it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"time"
	_ "time/tzdata" // America/Los_Angeles on machines without a zone database

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/examples/internal/examplekit"
	"github.com/taskrl/taskrl/internal/testkit/fakeapi"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/taskrl"
)

const (
	taskType = "vendor:sync"
	zone     = "America/Los_Angeles"
	// outage is how long the vendor sheds load.
	outage = 2 * time.Second
)

// policyTemplate is the policy file; %d is the daily quota.
const policyTemplate = `rules:
  - name: vendor-peak
    match: {type: "vendor:sync"}
    gcra: {rate: 18, per: 1s, burst: 3}
  - name: vendor-daily
    match: {type: "vendor:sync"}
    quota: {limit: %d, cron: "0 0 * * *", tz: "America/Los_Angeles"}
  - name: per-business
    match: {type: "vendor:sync"}
    key: "{{.business_id}}"
    gcra: {rate: 1.8, per: 1s, burst: 1}
`

// vendorLimits are what the vendor enforces with 429s. (Its daily quota is
// enforced by its billing; the stand-in's windows are aligned to the Unix
// epoch, not to midnight in Los Angeles, so it leaves that one to the
// policy.)
var vendorLimits = fakeapi.Limits{
	Global:      fakeapi.Limit{Rate: 20, Period: time.Second, Burst: 5},
	PerBusiness: fakeapi.Limit{Rate: 2, Period: time.Second, Burst: 2},
	Latency:     20 * time.Millisecond,
}

type config struct {
	Tasks, Daily, Businesses int
	// RedisURL is the real Redis to use; "" starts an embedded one.
	RedisURL string
	// Timeout bounds the run. Default 1m.
	Timeout time.Duration
}

func main() {
	cfg := config{RedisURL: os.Getenv(examplekit.EnvVar)}
	flag.IntVar(&cfg.Tasks, "tasks", 300, "tasks to run")
	flag.IntVar(&cfg.Daily, "daily", 250, "the daily quota (the vendor's is 10,000 in real life)")
	flag.IntVar(&cfg.Businesses, "businesses", 15, "businesses the tasks are spread over")
	flag.DurationVar(&cfg.Timeout, "timeout", time.Minute, "give up after this long")
	flag.Parse()
	examplekit.Main("vendorquota", run, cfg)
}

type payload struct {
	BusinessID string `json:"business_id"`
	N          int    `json:"n"` // 1-based task number
}

// result is what a run measured, for the tests.
type result struct {
	Done, Tomorrow  int // tasks that ran; tasks waiting for tomorrow's quota
	DuringOutage    int // calls that reached the vendor while it shed load
	Forced, Other   int // 429s: forced, and any other
	Throttled       int // 429s the handlers turned into taskrl.Throttled
	DailyCharged    int // the daily quota the policy charged
	NextReset       time.Time
	TomorrowAtReset bool // every waiting task is due at or after NextReset
}

// run runs the example, printing to out; the error says why it failed.
func run(ctx context.Context, cfg config, out io.Writer) (*result, error) {
	if cfg.Tasks < 1 || cfg.Daily < 1 || cfg.Businesses < 1 {
		return nil, fmt.Errorf("-tasks, -daily and -businesses must be at least 1, got %d, %d, %d", cfg.Tasks, cfg.Daily, cfg.Businesses)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Minute
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, err
	}
	env, err := examplekit.Setup("vendorquota", cfg.RedisURL, vendorLimits)
	if err != nil {
		return nil, err
	}
	queue := env.NS
	defer env.Close(ctx, out, queue)
	policyYAML := fmt.Sprintf(policyTemplate, cfg.Daily)
	policy, err := policy.Parse([]byte(policyYAML))
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "Redis: %s\nVendor: %s: 20/s burst 5, 2/s per business; a daily quota resetting at midnight in %s\nPolicy:\n%s\n\n",
		env.Redis, env.URL, zone, examplekit.Indent(policyYAML))

	// The observer sees every decision: the tasks the daily rule sent to
	// tomorrow, and the daily quota the policy has charged.
	var done, throttled, rescheduledDaily, dailyUsed atomic.Int64
	obs := taskrl.ObserverFunc(func(e taskrl.Event) {
		if e.Outcome == taskrl.Rescheduled && e.Rule == "vendor-daily" {
			rescheduledDaily.Add(1)
		}
		for _, r := range e.Rules {
			if r.Name == "vendor-daily" {
				for u := dailyUsed.Load(); int64(r.Used) > u && !dailyUsed.CompareAndSwap(u, int64(r.Used)); u = dailyUsed.Load() {
				}
			}
		}
	})
	// Three workers, each with its own middleware (wired as in
	// examples/quickstart). The handler calls the vendor and turns a 429
	// into taskrl.Throttled, which blocks the vendor's rules for every
	// worker until Retry-After has passed.
	vendor := &examplekit.Caller{URL: env.URL + "/v1/sync", Name: "vendor", OK: &done, Throttled: &throttled}
	logger := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelWarn}))
	err = env.StartWorkers(examplekit.Workers{
		N:        3,
		Config:   taskrl.Config{Policy: policy, Prefix: env.Prefix, Observer: obs, Logger: logger},
		Queues:   map[string]int{queue: 1},
		Handlers: map[string]asynq.Handler{taskType: vendor},
	})
	if err != nil {
		return nil, err
	}

	client := asynq.NewClientFromRedisClient(env.Client)
	for i := 1; i <= cfg.Tasks; i++ {
		b, _ := json.Marshal(payload{BusinessID: fmt.Sprintf("b%d", (i-1)%cfg.Businesses+1), N: i})
		opts := []asynq.Option{asynq.Queue(queue), asynq.TaskID(fmt.Sprintf("%s-%d", env.NS, i))}
		if i%2 == 0 {
			opts = append(opts, asynq.MaxRetry(0))
		}
		if _, err := client.EnqueueContext(ctx, asynq.NewTask(taskType, b), opts...); err != nil {
			return nil, fmt.Errorf("enqueueing task %d: %w", i, err)
		}
	}
	now := time.Now().In(loc)
	y, m, d := now.Date()
	res := &result{NextReset: time.Date(y, m, d+1, 0, 0, 0, 0, loc)}
	fmt.Fprintf(out, "Enqueued %d tasks over %d businesses (half with MaxRetry(0)); daily quota %d, next reset %s (in %v).\n\n",
		cfg.Tasks, cfg.Businesses, cfg.Daily, res.NextReset.Format("Mon 15:04 MST"), time.Until(res.NextReset).Round(time.Minute))

	// Watch, one line a second; force the vendor's outage a third of the
	// way through today's quota; stop when every task has run or waits
	// for tomorrow.
	ins := asynq.NewInspectorFromRedisClient(env.Client)
	outageAt := int64(max(1, min(cfg.Tasks, cfg.Daily)/3))
	var outageStart time.Time
	fmt.Fprintf(out, "%5s %11s %12s %18s %9s\n", "sec", "vendor 2xx", "forced 429s", "wait for tomorrow", "done")
	start := time.Now()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(cfg.Timeout)
	var prevOK, lastSec int
	var why string
loop:
	for {
		select {
		case <-ctx.Done():
			why = "interrupted"
			break loop
		case <-deadline:
			why = fmt.Sprintf("only %d of %d tasks accounted for after %v", res.Done+res.Tomorrow, cfg.Tasks, cfg.Timeout)
			break loop
		case now := <-tick.C:
			if outageStart.IsZero() && done.Load() >= outageAt {
				outageStart = time.Now()
				env.API.ThrottleFor(outage)
				fmt.Fprintf(out, "      -- the vendor sheds load: 429, Retry-After 2, to every call for %v --\n", outage)
			}
			res.Done = int(done.Load())
			res.Tomorrow, res.TomorrowAtReset = waitingForTomorrow(ins, queue, res.NextReset)
			finished := res.Done+res.Tomorrow >= cfg.Tasks
			if sec := int(now.Sub(start) / time.Second); sec > lastSec || finished {
				s := env.API.Stats()
				label := strconv.Itoa(sec)
				if finished {
					label = strconv.FormatFloat(now.Sub(start).Seconds(), 'f', 1, 64)
				}
				fmt.Fprintf(out, "%5s %11d %12d %18d %5d/%d\n", label, s.OK-prevOK, s.ThrottledBy[fakeapi.ScopeForced], res.Tomorrow, res.Done, cfg.Tasks)
				prevOK, lastSec = s.OK, sec
			}
			if finished {
				break loop
			}
		}
	}
	env.Fleet.Stop()

	s := env.API.Stats()
	res.Forced = s.ThrottledBy[fakeapi.ScopeForced]
	res.Other = s.Throttled - res.Forced
	res.Throttled = int(throttled.Load())
	if !outageStart.IsZero() {
		for _, c := range env.API.Calls() {
			if !c.At.Before(outageStart) && c.At.Before(outageStart.Add(outage)) {
				res.DuringOutage++
			}
		}
	}
	var problems examplekit.Problems
	if why != "" {
		problems = append(problems, why)
	}
	if s.Duplicates > 0 {
		problems.Addf("%d keys answered 2xx more than once", s.Duplicates)
	}
	if s.OK != res.Done {
		problems.Addf("the vendor answered 2xx %d times for %d tasks done", s.OK, res.Done)
	}
	if res.Other > 0 {
		problems.Addf("the vendor answered %d 429s of its own limits %v", res.Other, s.ThrottledBy)
	}
	if res.Tomorrow > 0 && !res.TomorrowAtReset {
		problems = append(problems, "some waiting tasks are due before the daily reset")
	}
	info := problems.CheckQueue(ins, queue)

	fmt.Fprintf(out, "\nRan %d tasks today in %v; %d wait for the daily quota to reset at %s (%d rescheduled by rule vendor-daily).\n",
		res.Done, time.Since(start).Round(10*time.Millisecond), res.Tomorrow, res.NextReset.Format("Mon 15:04 MST"), rescheduledDaily.Load())
	if !outageStart.IsZero() {
		fmt.Fprintf(out, "Vendor outage (%v of forced 429s): calls that reached it meanwhile: %d; 429s turned into taskrl.Throttled: %d; the fleet backed off together.\n",
			outage, res.DuringOutage, res.Throttled)
	}
	res.DailyCharged = int(dailyUsed.Load())
	fmt.Fprintf(out, "Daily quota: the policy charged %d of %d for %d calls that went through (calls the vendor refused, and slots booked across its outage, are refunded).\n",
		res.DailyCharged, cfg.Daily, res.Done)
	fmt.Fprintf(out, "Vendor: %d calls, %d answered 2xx, %d forced 429s, %d 429s of its own limits, busiest second %d (limit 20/s burst 5).\n",
		s.Calls, s.OK, res.Forced, res.Other, s.BusiestSecond().OK)
	fmt.Fprintf(out, "asynq: %d archived, %d failed, %d scheduled.\n", info.Archived, info.Failed, info.Scheduled)
	return res, problems.Verdict(out, "every task ran once or waits for tomorrow's quota; none archived or failed; no 429 beyond the vendor's outage.")
}

// waitingForTomorrow counts the queue's scheduled tasks due at or after
// reset less a second (rescheduled until the daily quota resets), and
// reports whether all scheduled tasks due after the next minute are.
func waitingForTomorrow(ins *asynq.Inspector, queue string, reset time.Time) (n int, allAtReset bool) {
	allAtReset = true
	for page := 1; ; page++ {
		tasks, err := ins.ListScheduledTasks(queue, asynq.PageSize(1000), asynq.Page(page))
		if err != nil {
			return n, false
		}
		for _, t := range tasks {
			switch {
			case !t.NextProcessAt.Before(reset.Add(-time.Second)):
				n++
			case t.NextProcessAt.After(time.Now().Add(time.Minute)):
				allAtReset = false
			}
		}
		if len(tasks) < 1000 {
			return n, allAtReset
		}
	}
}
