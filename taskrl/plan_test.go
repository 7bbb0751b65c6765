package taskrl

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/taskrl/taskrl/internal/admission"
	"github.com/taskrl/taskrl/quotas"
)

// TestPlan walks every branch of the middleware's decisions on explicit
// times: no Redis, no sleeping.
func TestPlan(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	// Copies arrive up to the pace lead early (1.6 s at asynq's default
	// TaskCheckInterval) and wait for their slot: up to 1.85 s.
	c := limits{maxHold: 500 * ms, mode: FailClosed, early: admission.EarlyBooking(admission.PaceLead(0), 500*ms)}
	budget := c
	budget.budget = 10 * time.Second
	mode := func(m FailureMode) limits { l := c; l.mode = m; return l }
	allowed := func(delay time.Duration) quotas.Decision {
		return quotas.Decision{Allowed: true, Delay: delay, Now: now}
	}
	denied := func(after time.Duration) quotas.Decision {
		return quotas.Decision{Rule: "peak", RetryAfter: after, Now: now}
	}
	down := errors.New("connection refused")
	for _, tc := range []struct {
		name string
		c    limits
		s    step
		want action
	}{
		// A fresh decision of the rate rules.
		{"turn now", c, step{stage: stageRates, decision: allowed(0)}, action{verb: run}},
		{"hold in the worker", c, step{stage: stageRates, decision: allowed(300 * ms)}, action{verb: run, wait: 300 * ms}},
		{"hold up to MaxHold", c, step{stage: stageRates, decision: allowed(500 * ms)}, action{verb: run, wait: 500 * ms}},
		{"reschedule with booking", c, step{stage: stageRates, decision: allowed(501 * ms)},
			action{verb: reschedule, wait: 501 * ms, booked: now.Add(501 * ms)}},
		{"deadline before the turn: book instead of hold", c, step{stage: stageRates, decision: allowed(300 * ms), left: 200 * ms},
			action{verb: reschedule, wait: 300 * ms, booked: now.Add(300 * ms)}},
		{"beyond the horizon: unbooked, decide again", c, step{stage: stageRates, decision: denied(2 * time.Hour)},
			action{verb: reschedule, wait: 2 * time.Hour, rule: "peak"}},
		{"never admissible", c, step{stage: stageRates, decision: denied(quotas.Never)},
			action{verb: refuse, rule: "peak", reason: `task can never pass rule "peak"`}},
		{"throttle budget spent by a booking", budget, step{stage: stageRates, decision: allowed(4 * time.Second), waited: 7 * time.Second},
			action{verb: refuse, refund: true, wait: 4 * time.Second, reason: "throttle budget 10s spent (waited 7s, would wait 4s more)"}},
		{"throttle budget spent by a denial", budget, step{stage: stageRates, decision: denied(11 * time.Second)},
			action{verb: refuse, refund: true, rule: "peak", wait: 11 * time.Second, reason: "throttle budget 10s spent (waited 0s, would wait 11s more)"}},
		{"throttle budget not yet spent", budget, step{stage: stageRates, decision: allowed(3 * time.Second), waited: 7 * time.Second},
			action{verb: reschedule, wait: 3 * time.Second, booked: now.Add(3 * time.Second)}},
		{"Redis unavailable, fail closed", c, step{stage: stageRates, err: down}, action{verb: retry}},
		{"Redis unavailable, fail open", mode(FailOpen), step{stage: stageRates, err: down}, action{verb: unlimited}},
		{"Redis unavailable, fail local", mode(FailLocal), step{stage: stageRates, err: down}, action{verb: local}},

		// A copy arrives with a slot booked for it.
		{"booked: on time", c, step{stage: stageBooked, booked: now}, action{verb: run}},
		{"booked: early, wait", c, step{stage: stageBooked, booked: now.Add(800 * ms)}, action{verb: run, wait: 800 * ms}},
		{"booked: a pace lead early, wait", c, step{stage: stageBooked, booked: now.Add(1600 * ms)}, action{verb: run, wait: 1600 * ms}},
		{"booked: slightly late", c, step{stage: stageBooked, booked: now.Add(-20 * ms)}, action{verb: run}},
		{"booked: late, decide again", c, step{stage: stageBooked, booked: now.Add(-30 * ms)}, action{verb: decide, refund: true}},
		{"booked: under other limits, decide again without a refund", c, step{stage: stageBooked, booked: now.Add(800 * ms), stale: true}, action{verb: decide}},
		{"booked: far too early, reschedule still booked", c, step{stage: stageBooked, booked: now.Add(1900 * ms)},
			action{verb: reschedule, wait: 1900 * ms, booked: now.Add(1900 * ms)}},
		{"booked: deadline before the slot", c, step{stage: stageBooked, booked: now.Add(300 * ms), left: 300 * ms},
			action{verb: reschedule, wait: 300 * ms, booked: now.Add(300 * ms)}},

		// After a wait: an upstream 429 blocked the rules meanwhile.
		{"upstream block", c, step{stage: stageBlocked, blocked: now.Add(4 * time.Second), rule: "peak"},
			action{verb: reschedule, wait: 4 * time.Second, refund: true, rule: "peak"}},
		{"upstream block over", c, step{stage: stageBlocked, blocked: now.Add(-time.Second), rule: "peak"}, action{verb: run}},
		{"no block", c, step{stage: stageBlocked}, action{verb: run}},

		// Concurrency slots.
		{"slot free", c, step{stage: stageSlots, decision: quotas.Decision{Allowed: true}, holdEnd: now.Add(500 * ms)}, action{verb: run}},
		{"busy slot: wait briefly", c, step{stage: stageSlots, decision: quotas.Decision{Rule: "conc", RetryAfter: 30 * time.Second}, holdEnd: now.Add(500 * ms)},
			action{verb: wait, wait: 100 * ms, rule: "conc"}},
		{"busy slot past MaxHold, rate charged: keep it as the booking", c,
			step{stage: stageSlots, decision: quotas.Decision{Rule: "conc", RetryAfter: 30 * time.Second}, holdEnd: now.Add(50 * ms), lease: time.Minute, charged: true},
			action{verb: reschedule, wait: time.Second, booked: now.Add(time.Second), rule: "conc"}},
		{"busy slot past MaxHold, nothing charged", c,
			step{stage: stageSlots, decision: quotas.Decision{Rule: "conc", RetryAfter: 30 * time.Second}, holdEnd: now.Add(50 * ms), lease: time.Minute},
			action{verb: reschedule, wait: time.Second, rule: "conc"}},
		{"slot blocked upstream past MaxHold: reschedule to the block's end", c,
			step{stage: stageSlots, decision: quotas.Decision{Rule: "conc", RetryAfter: 10 * time.Minute}, holdEnd: now.Add(50 * ms), lease: time.Minute, charged: true},
			action{verb: reschedule, wait: 10 * time.Minute, booked: now.Add(10 * time.Minute), rule: "conc"}},
		{"deadline passed, turn now: run", c, step{stage: stageRates, decision: allowed(0), left: -time.Second}, action{verb: run}},
		{"slots: Redis unavailable, fail closed", c, step{stage: stageSlots, err: down}, action{verb: retry}},
		{"slots: Redis unavailable, fail open", mode(FailOpen), step{stage: stageSlots, err: down}, action{verb: unlimited}},
		{"slots: Redis unavailable, fail local", mode(FailLocal), step{stage: stageSlots, err: down}, action{verb: local}},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			s := tc.s
			s.now = now
			if s.left == 0 {
				s.left = noDeadline
			}
			if got := plan(tc.c, s); got != tc.want {
				t.Errorf("plan = %+v, want %+v", got, tc.want)
			}
		})
	}
}
