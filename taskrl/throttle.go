package taskrl

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/quotas"
)

// ThrottledError reports that the remote side throttled a task (HTTP 429)
// and asked to be called again after RetryAfter. A handler returns one with
// Throttled; the middleware then blocks the task's rules in the policy's
// throttle scope (by default its adaptive rules, whose learned rate it
// cuts, else its rate and window rules; see policy.Policy.WithThrottle) for every
// worker until then and reschedules the task, without spending a retry.
type ThrottledError struct {
	// RetryAfter is the wait the remote side asked for; 0 means 1s.
	RetryAfter time.Duration
	// Err is the remote side's answer, for logs. It may be nil.
	Err error
}

// Throttled returns a *ThrottledError: the remote side throttled this task
// and asked to retry after retryAfter.
func Throttled(retryAfter time.Duration, err error) error {
	return &ThrottledError{RetryAfter: retryAfter, Err: err}
}

// Error implements error.
func (e *ThrottledError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("taskrl: throttled upstream, retry after %v", e.RetryAfter)
	}
	return fmt.Sprintf("taskrl: throttled upstream, retry after %v: %v", e.RetryAfter, e.Err)
}

// Unwrap returns Err.
func (e *ThrottledError) Unwrap() error { return e.Err }

// jobKey is the context key under which a task's context carries its job.
type jobKey struct{}

// Pause holds back, on every worker, the rules of the task whose context
// is ctx (those in the policy's throttle scope, see policy.Policy.WithThrottle)
// for d from now, as a Throttled answer would, but without rescheduling
// the task: for a call that succeeded while the remote side said its quota
// is spent until then (RateLimit-Remaining: 0 with a reset), so that the
// fleet slows down before the wall rather than at it. The block starts
// when the handler returns (if it returns a Throttled error, the longer of
// the two waits holds); several calls keep the longest. It reports whether
// ctx is the context of a task some rule of the policy governs; d <= 0
// does nothing. Safe for concurrent use.
func Pause(ctx context.Context, d time.Duration) bool {
	j, ok := ctx.Value(jobKey{}).(*job)
	if !ok || j.sp == nil || j.sp.throttle == nil {
		return false
	}
	for d > 0 {
		old := j.pause.Load()
		if int64(d) <= old || j.pause.CompareAndSwap(old, int64(d)) {
			break
		}
	}
	return true
}

// paused blocks the task's throttle scope for the pause its handler asked
// for, if any.
func (j *job) paused() {
	d := time.Duration(j.pause.Load())
	if d <= 0 {
		return
	}
	if err := j.block(j.m.serverNow().Add(d)); err != nil {
		j.m.cfg.Logger.Warn("taskrl: pausing rules failed", "err", err)
		return
	}
	j.m.cfg.Logger.Info("taskrl: upstream quota spent; pausing", "task", j.id, "for", d)
	j.observe(Event{Outcome: Paused, Wait: d})
}

// backOff handles a task the remote side throttled: every worker backs off
// the task's rules in the policy's throttle scope (by default its adaptive
// rules, else its rate and window rules; none for a task no rule matches)
// until it said to retry,
// the charge of this call is refunded, and the task runs again then.
func (j *job) backOff(te *ThrottledError) error {
	wait := te.RetryAfter
	if wait <= 0 {
		wait = time.Second
	}
	wait = max(wait, time.Duration(j.pause.Load()))
	if j.sp != nil {
		// The remote side did not count the call: neither do the windows.
		if j.sp.rates != nil {
			j.refund(j.charge)
		}
		if j.sp.throttle != nil {
			if err := j.block(j.m.serverNow().Add(wait)); err != nil {
				j.m.cfg.Logger.Warn("taskrl: blocking throttled rules failed", "err", err)
			}
		}
	}
	j.m.cfg.Logger.Info("taskrl: upstream throttled; backing off", "task", j.id, "retry_after", wait, "err", te.Err)
	j.observe(Event{Outcome: UpstreamThrottled, Wait: wait})
	return j.reschedule("", wait, time.Time{}, "")
}

// block stops the task's rules in the throttle scope for every worker
// until the given time: new decisions through the limiter, and booked
// tasks through a marker per rule key that they read before their slot.
// The task's call was decided when its rate charge was (zero without
// one): an adaptive rule cuts again only for a call decided after its
// last cut (quotas.Limiter.BlockCall).
func (j *job) block(until time.Time) error {
	ctx := context.WithoutCancel(j.ctx)
	ks := pick(j.keys, j.sp.throttleIdx)
	if _, err := j.m.limiter.BlockCall(ctx, j.sp.throttle, quotas.Request{Keys: ks}, until, j.charge.Now); err != nil {
		return err
	}
	ttl := max(until.Sub(j.m.cfg.Clock.Now()), 0) + time.Second // the server's clock may lag
	_, err := j.m.cfg.LimitsClient.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, r := range j.sp.throttle.Rules() {
			p.Set(ctx, keys.Block(j.m.prefix, r.Name, ks[i]), until.UnixMicro(), ttl)
		}
		return nil
	})
	return err
}

// blockedUntil returns the latest block on the task's rate rules and the
// rule it is on, in one round trip.
func (j *job) blockedUntil() (until time.Time, rule string, err error) {
	rules := j.sp.rates.Rules()
	cmds := make([]*redis.StringCmd, len(rules))
	_, err = j.m.cfg.LimitsClient.Pipelined(j.ctx, func(p redis.Pipeliner) error {
		for i, r := range rules {
			cmds[i] = p.Get(j.ctx, keys.Block(j.m.prefix, r.Name, j.rates.Keys[i]))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return time.Time{}, "", err
	}
	for i, c := range cmds {
		if us, err := c.Int64(); err == nil && time.UnixMicro(us).After(until) {
			until, rule = time.UnixMicro(us), rules[i].Name
		}
	}
	return until, rule, nil
}
