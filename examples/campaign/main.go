// Command campaign shows a cron-scheduled fan-out campaign spread out by
// taskrl instead of bursting:
//
//	go run ./examples/campaign
//
// An asynq.Scheduler enqueues a "campaign:fanout" task on a cron spec; in
// production that is "0 9 * * MON" (Monday 09:00, with
// SchedulerOpts.Location set to the campaign's time zone), here "@every 5s"
// so that the example sees two ticks in 15 seconds. The fan-out handler
// enqueues one "email:summary" task per business (40 of them), with task IDs
// derived from the fan-out task's, so a retried fan-out never sends twice.
//
// Without limits the workers would hand all 40 e-mails to the provider
// within a few milliseconds. The policy spreads them out:
//
//	rules:
//	  - name: provider-peak        # the e-mail provider's limit, for all workers
//	    match: {type: "email:summary"}
//	    gcra: {rate: 10, per: 1s, burst: 2}
//	  - name: per-business         # never two summaries to one business at once
//	    match: {type: "email:summary"}
//	    key: "{{.business_id}}"
//	    gcra: {rate: 1, per: 4s}
//
// The provider is a local stand-in that answers 429 beyond 12/s (burst 3)
// or beyond one e-mail per business per 3s. After the second tick's
// e-mails are sent the example prints, per tick, when its e-mails went out,
// at what rate, and a per-second histogram; it exits 0 when every e-mail
// was sent exactly once, the provider never answered 429 and nothing was
// archived or failed.
//
// Redis is the real one at REDIS_URL when set, otherwise an embedded
// miniredis. Flags: -businesses, -every (the stand-in cron interval).
//
// The wiring (the policy, the middleware on each worker, a handler
// returning taskrl.Throttled on a 429) is the quickstart's, written out in
// full in examples/quickstart; here the helpers of examples/internal/examplekit do
// it.
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
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/examples/internal/examplekit"
	"github.com/taskrl/taskrl/internal/testkit/fakeapi"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/taskrl"
)

const (
	typeFanout = "campaign:fanout"
	typeEmail  = "email:summary"
	ticks      = 2
)

const policyYAML = `rules:
  - name: provider-peak        # the e-mail provider's limit, for all workers
    match: {type: "email:summary"}
    gcra: {rate: 10, per: 1s, burst: 2}
  - name: per-business         # never two summaries to one business at once
    match: {type: "email:summary"}
    key: "{{.business_id}}"
    gcra: {rate: 1, per: 4s}
`

// providerLimits are the e-mail provider's, enforced with 429s.
var providerLimits = fakeapi.Limits{
	Global:      fakeapi.Limit{Rate: 12, Period: time.Second, Burst: 3},
	PerBusiness: fakeapi.Limit{Rate: 1, Period: 3 * time.Second, Burst: 1},
	Latency:     20 * time.Millisecond,
}

type config struct {
	Businesses int
	// Every is the interval of the cron spec standing in for Monday 09:00.
	Every time.Duration
	// RedisURL is the real Redis to use; "" starts an embedded one.
	RedisURL string
	// Timeout bounds the run. Default 1m.
	Timeout time.Duration
}

// campaign is the fan-out task's payload.
type campaign struct {
	Name string `json:"name"`
}

// email is an e-mail task's payload.
type email struct {
	Campaign   string `json:"campaign"`
	BusinessID string `json:"business_id"`
}

// tickReport is one tick's spread, for the tests.
type tickReport struct {
	Emails      int
	First, Last time.Time // provider 2xx arrival times
	Busiest     int       // most e-mails in one second
}

func main() {
	cfg := config{RedisURL: os.Getenv(examplekit.EnvVar)}
	flag.IntVar(&cfg.Businesses, "businesses", 40, "businesses: one e-mail each per tick")
	flag.DurationVar(&cfg.Every, "every", 5*time.Second, `the cron interval standing in for "0 9 * * MON"`)
	flag.DurationVar(&cfg.Timeout, "timeout", time.Minute, "give up after this long")
	flag.Parse()
	examplekit.Main("campaign", run, cfg)
}

// fanout returns the handler of the campaign task: one e-mail task per
// business, each with an ID derived from the fan-out task's, so that a
// retried fan-out enqueues nothing twice.
func fanout(client *asynq.Client, ns, queue string, businesses int) asynq.HandlerFunc {
	return func(ctx context.Context, t *asynq.Task) error {
		var c campaign
		if err := json.Unmarshal(t.Payload(), &c); err != nil {
			return fmt.Errorf("bad payload: %v: %w", err, asynq.SkipRetry)
		}
		tick, _ := asynq.GetTaskID(ctx)
		for i := 1; i <= businesses; i++ {
			b, _ := json.Marshal(email{Campaign: c.Name, BusinessID: fmt.Sprintf("b%d", i)})
			id := fmt.Sprintf("%s/%s/b%d", ns, tick, i)
			_, err := client.EnqueueContext(ctx, asynq.NewTask(typeEmail, b), asynq.Queue(queue), asynq.TaskID(id))
			if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
				return fmt.Errorf("fanning out to b%d: %w", i, err)
			}
		}
		return nil
	}
}

func run(ctx context.Context, cfg config, out io.Writer) ([]tickReport, error) {
	if cfg.Businesses < 1 {
		return nil, fmt.Errorf("-businesses must be at least 1, got %d", cfg.Businesses)
	}
	if cfg.Every < time.Second {
		return nil, fmt.Errorf("-every must be at least 1s, got %v", cfg.Every)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Minute
	}
	env, err := examplekit.Setup("campaign", cfg.RedisURL, providerLimits)
	if err != nil {
		return nil, err
	}
	queue := env.NS
	defer env.Close(ctx, out, queue)
	policy, err := policy.Parse([]byte(policyYAML))
	if err != nil {
		return nil, err
	}
	spec := fmt.Sprintf("@every %v", cfg.Every)
	fmt.Fprintf(out, "Redis: %s\nE-mail provider: %s (answers 429 beyond 12/s burst 3, or 1 per business per 3s)\nPolicy:\n%s\n\n",
		env.Redis, env.URL, examplekit.Indent(policyYAML))

	// Two workers, each with its own middleware (wired as in
	// examples/quickstart), run the fan-out and the e-mail tasks; an e-mail
	// task is one call to the provider (a 429 would become
	// taskrl.Throttled).
	var sent atomic.Int64
	fan := fanout(asynq.NewClientFromRedisClient(env.Redis.Client()), env.NS, queue, cfg.Businesses)
	send := &examplekit.Caller{URL: env.URL + "/v3/mail/send", Name: "provider", OK: &sent}
	logger := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelWarn}))
	err = env.StartWorkers(examplekit.Workers{
		N:        2,
		Config:   taskrl.Config{Policy: policy, Prefix: env.Prefix, Logger: logger},
		Queues:   map[string]int{queue: 1},
		Handlers: map[string]asynq.Handler{typeFanout: fan, typeEmail: send},
	})
	if err != nil {
		return nil, err
	}

	// The schedule. In production: Register("0 9 * * MON", ...) with
	// SchedulerOpts.Location = the campaign's time zone.
	fanouts := make(chan time.Time, ticks+1)
	scheduler := asynq.NewScheduler(env.Redis.ConnOpt(), &asynq.SchedulerOpts{
		LogLevel: asynq.WarnLevel,
		PostEnqueueFunc: func(info *asynq.TaskInfo, err error) {
			if err == nil {
				select {
				case fanouts <- time.Now():
				default:
				}
			}
		},
	})
	payload, _ := json.Marshal(campaign{Name: "weekly-summary"})
	if _, err := scheduler.Register(spec, asynq.NewTask(typeFanout, payload), asynq.Queue(queue)); err != nil {
		return nil, err
	}
	if err := scheduler.Start(); err != nil {
		return nil, fmt.Errorf("starting the scheduler: %w", err)
	}
	schedulerUp := true
	stopScheduler := func() {
		if schedulerUp {
			scheduler.Shutdown()
			schedulerUp = false
		}
	}
	defer stopScheduler()
	fmt.Fprintf(out, "Scheduled %q (standing in for \"0 9 * * MON\"): each tick fans out %d e-mails; waiting for %d ticks.\n\n", spec, cfg.Businesses, ticks)

	start := time.Now()
	var fired []time.Time
	want := int64(ticks * cfg.Businesses)
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	deadline := time.After(cfg.Timeout)
	var why string
loop:
	for {
		select {
		case <-ctx.Done():
			why = "interrupted"
			break loop
		case <-deadline:
			why = fmt.Sprintf("%d of %d e-mails sent after %v", sent.Load(), want, cfg.Timeout)
			break loop
		case at := <-fanouts:
			fired = append(fired, at)
			fmt.Fprintf(out, "+%4.1fs  tick %d: the scheduler enqueued the fan-out\n", at.Sub(start).Seconds(), len(fired))
			if len(fired) == ticks {
				stopScheduler() // two ticks are enough
			}
		case <-poll.C:
			if sent.Load() >= want {
				break loop
			}
		}
	}
	stopScheduler()
	env.Fleet.Stop()

	// Group the provider's 2xx answers by tick: the key is
	// NAMESPACE/FANOUT-TASK-ID/BUSINESS.
	byTick := map[string][]time.Time{}
	for _, c := range env.API.Calls() {
		if c.Status != http.StatusOK {
			continue
		}
		if parts := strings.Split(c.Key, "/"); len(parts) == 3 {
			byTick[parts[1]] = append(byTick[parts[1]], c.At)
		}
	}
	var reports []tickReport
	for _, ts := range byTick {
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
		r := tickReport{Emails: len(ts), First: ts[0], Last: ts[len(ts)-1]}
		perSec := map[int64]int{}
		for _, t := range ts {
			perSec[t.Unix()]++
			r.Busiest = max(r.Busiest, perSec[t.Unix()])
		}
		reports = append(reports, r)
	}
	sort.Slice(reports, func(i, j int) bool { return reports[i].First.Before(reports[j].First) })

	s := env.API.Stats()
	var problems examplekit.Problems
	if why != "" {
		problems = append(problems, why)
	}
	if len(reports) != ticks {
		problems.Addf("e-mails of %d ticks sent, want %d", len(reports), ticks)
	}
	for i, r := range reports {
		if r.Emails != cfg.Businesses {
			problems.Addf("tick %d sent %d e-mails, want %d", i+1, r.Emails, cfg.Businesses)
		}
	}
	if s.Duplicates > 0 {
		problems.Addf("%d e-mails sent twice", s.Duplicates)
	}
	if s.Throttled > 0 {
		problems.Addf("the provider answered 429 %d times %v", s.Throttled, s.ThrottledBy)
	}
	info := problems.CheckQueue(asynq.NewInspectorFromRedisClient(env.Client), queue)

	fmt.Fprintln(out)
	for i, r := range reports {
		span := r.Last.Sub(r.First)
		rate := 0.0
		if span > 0 {
			rate = float64(r.Emails-1) / span.Seconds()
		}
		fmt.Fprintf(out, "Tick %d: %d e-mails from +%.2fs to +%.2fs after the fan-out: spread over %.2fs, %.1f/s, busiest second %d (provider allows 12/s burst 3).\n",
			i+1, r.Emails, firstAfter(fired, i, r.First), firstAfter(fired, i, r.Last), span.Seconds(), rate, r.Busiest)
	}
	fmt.Fprintln(out, "\nE-mails per second, from the first tick:")
	if len(s.PerSecond) > 0 {
		from, n := s.PerSecond[0].Start, map[time.Time]int{}
		for _, b := range s.PerSecond {
			n[b.Start] = b.OK
		}
		for at := from; !at.After(s.PerSecond[len(s.PerSecond)-1].Start); at = at.Add(time.Second) {
			fmt.Fprintf(out, "  +%2ds %3d %s\n", int(at.Sub(from).Seconds()), n[at], strings.Repeat("#", n[at]))
		}
	}
	fmt.Fprintf(out, "Provider: %d calls, %d answered 2xx, %d answered 429; asynq: %d archived, %d failed.\n", s.Calls, s.OK, s.Throttled, info.Archived, info.Failed)
	return reports, problems.Verdict(out, "each tick's e-mails went out once each, spread at the provider's pace; no 429, nothing archived or failed.")
}

// firstAfter is the seconds from tick i's fan-out to t, or from the start
// of the tick's e-mails when the fan-out time is unknown.
func firstAfter(fired []time.Time, i int, t time.Time) float64 {
	if i < len(fired) {
		return t.Sub(fired[i]).Seconds()
	}
	return 0
}
