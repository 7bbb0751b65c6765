package admission

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestPlan walks every branch of the middleware's decisions on explicit
// times: no Redis, no sleeping.
func TestPlan(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	// Copies arrive up to the pace lead early (1.6 s at asynq's default
	// TaskCheckInterval) and wait for their slot: up to 1.85 s.
	c := Limits{MaxHold: 500 * ms, Mode: FailClosed, Early: EarlyBooking(PaceLead(0), 500*ms)}
	budget := c
	budget.Budget = 10 * time.Second
	mode := func(m Mode) Limits { l := c; l.Mode = m; return l }
	allowed := func(delay time.Duration) Decision {
		return Decision{Allowed: true, Delay: delay, Now: now}
	}
	denied := func(after time.Duration) Decision {
		return Decision{Rule: "peak", RetryAfter: after, Now: now}
	}
	down := errors.New("connection refused")
	for _, tc := range []struct {
		name string
		c    Limits
		s    Step
		want Action
	}{
		// A fresh decision of the rate rules.
		{"turn now", c, Step{Stage: Rates, Decision: allowed(0)}, Action{Verb: Run}},
		{"hold in the worker", c, Step{Stage: Rates, Decision: allowed(300 * ms)}, Action{Verb: Run, Wait: 300 * ms}},
		{"hold up to MaxHold", c, Step{Stage: Rates, Decision: allowed(500 * ms)}, Action{Verb: Run, Wait: 500 * ms}},
		{"reschedule with booking", c, Step{Stage: Rates, Decision: allowed(501 * ms)},
			Action{Verb: Reschedule, Wait: 501 * ms, Booked: now.Add(501 * ms)}},
		{"deadline before the turn: book instead of hold", c, Step{Stage: Rates, Decision: allowed(300 * ms), Left: 200 * ms},
			Action{Verb: Reschedule, Wait: 300 * ms, Booked: now.Add(300 * ms)}},
		{"beyond the horizon: unbooked, decide again", c, Step{Stage: Rates, Decision: denied(2 * time.Hour)},
			Action{Verb: Reschedule, Wait: 2 * time.Hour, Rule: "peak"}},
		{"never admissible", c, Step{Stage: Rates, Decision: denied(Never)},
			Action{Verb: Refuse, Rule: "peak", Reason: `task can never pass rule "peak"`}},
		{"throttle budget spent by a booking", budget, Step{Stage: Rates, Decision: allowed(4 * time.Second), Waited: 7 * time.Second},
			Action{Verb: Refuse, Refund: true, Wait: 4 * time.Second, Reason: "throttle budget 10s spent (waited 7s, would wait 4s more)"}},
		{"throttle budget spent by a denial", budget, Step{Stage: Rates, Decision: denied(11 * time.Second)},
			Action{Verb: Refuse, Refund: true, Rule: "peak", Wait: 11 * time.Second, Reason: "throttle budget 10s spent (waited 0s, would wait 11s more)"}},
		{"throttle budget not yet spent", budget, Step{Stage: Rates, Decision: allowed(3 * time.Second), Waited: 7 * time.Second},
			Action{Verb: Reschedule, Wait: 3 * time.Second, Booked: now.Add(3 * time.Second)}},
		{"Redis unavailable, fail closed", c, Step{Stage: Rates, Err: down}, Action{Verb: Retry}},
		{"Redis unavailable, fail open", mode(FailOpen), Step{Stage: Rates, Err: down}, Action{Verb: Unlimited}},
		{"Redis unavailable, fail local", mode(FailLocal), Step{Stage: Rates, Err: down}, Action{Verb: Local}},

		// A copy arrives with a slot booked for it.
		{"booked: on time", c, Step{Stage: Booked, Booked: now}, Action{Verb: Run}},
		{"booked: early, wait", c, Step{Stage: Booked, Booked: now.Add(800 * ms)}, Action{Verb: Run, Wait: 800 * ms}},
		{"booked: a pace lead early, wait", c, Step{Stage: Booked, Booked: now.Add(1600 * ms)}, Action{Verb: Run, Wait: 1600 * ms}},
		{"booked: slightly late", c, Step{Stage: Booked, Booked: now.Add(-20 * ms)}, Action{Verb: Run}},
		{"booked: late, decide again", c, Step{Stage: Booked, Booked: now.Add(-30 * ms)}, Action{Verb: Decide, Refund: true}},
		{"booked: under other limits, decide again without a refund", c, Step{Stage: Booked, Booked: now.Add(800 * ms), Stale: true}, Action{Verb: Decide}},
		{"booked: far too early, reschedule still booked", c, Step{Stage: Booked, Booked: now.Add(1900 * ms)},
			Action{Verb: Reschedule, Wait: 1900 * ms, Booked: now.Add(1900 * ms)}},
		{"booked: deadline before the slot", c, Step{Stage: Booked, Booked: now.Add(300 * ms), Left: 300 * ms},
			Action{Verb: Reschedule, Wait: 300 * ms, Booked: now.Add(300 * ms)}},

		// After a wait: an upstream 429 blocked the rules meanwhile.
		{"upstream block", c, Step{Stage: Blocked, Blocked: now.Add(4 * time.Second), Rule: "peak"},
			Action{Verb: Reschedule, Wait: 4 * time.Second, Refund: true, Rule: "peak"}},
		{"upstream block over", c, Step{Stage: Blocked, Blocked: now.Add(-time.Second), Rule: "peak"}, Action{Verb: Run}},
		{"no block", c, Step{Stage: Blocked}, Action{Verb: Run}},

		// Concurrency slots.
		{"slot free", c, Step{Stage: Slots, Decision: Decision{Allowed: true}, HoldEnd: now.Add(500 * ms)}, Action{Verb: Run}},
		{"busy slot: wait briefly", c, Step{Stage: Slots, Decision: Decision{Rule: "conc", RetryAfter: 30 * time.Second}, HoldEnd: now.Add(500 * ms)},
			Action{Verb: Wait, Wait: 100 * ms, Rule: "conc"}},
		{"busy slot past MaxHold, rate charged: keep it as the booking", c,
			Step{Stage: Slots, Decision: Decision{Rule: "conc", RetryAfter: 30 * time.Second}, HoldEnd: now.Add(50 * ms), Lease: time.Minute, Charged: true},
			Action{Verb: Reschedule, Wait: time.Second, Booked: now.Add(time.Second), Rule: "conc"}},
		{"busy slot past MaxHold, nothing charged", c,
			Step{Stage: Slots, Decision: Decision{Rule: "conc", RetryAfter: 30 * time.Second}, HoldEnd: now.Add(50 * ms), Lease: time.Minute},
			Action{Verb: Reschedule, Wait: time.Second, Rule: "conc"}},
		{"a fair rule's next slot is the task's flow's: look again soon", c,
			Step{Stage: Slots, Decision: Decision{Rule: "conc", RetryAfter: 20 * time.Second, Next: true}, HoldEnd: now.Add(2 * time.Second), Lease: time.Minute},
			Action{Verb: Wait, Wait: NextPoll, Rule: "conc"}},
		{"a fair rule serves other flows first, enough of the task's flow wait: reschedule at once", c,
			Step{Stage: Slots, Decision: Decision{Rule: "conc", RetryAfter: 20 * time.Second}, HoldEnd: now.Add(2 * time.Second), Lease: time.Minute, Crowded: 700 * ms},
			Action{Verb: Reschedule, Wait: 700 * ms, Rule: "conc"}},
		{"crowded out, rate charged: keep it as the booking", c,
			Step{Stage: Slots, Decision: Decision{Rule: "conc", RetryAfter: 20 * time.Second}, HoldEnd: now.Add(2 * time.Second), Lease: time.Minute, Crowded: 700 * ms, Charged: true},
			Action{Verb: Reschedule, Wait: 700 * ms, Booked: now.Add(700 * ms), Rule: "conc"}},
		{"slot blocked upstream past MaxHold: reschedule to the block's end", c,
			Step{Stage: Slots, Decision: Decision{Rule: "conc", RetryAfter: 10 * time.Minute}, HoldEnd: now.Add(50 * ms), Lease: time.Minute, Charged: true},
			Action{Verb: Reschedule, Wait: 10 * time.Minute, Booked: now.Add(10 * time.Minute), Rule: "conc"}},
		{"deadline passed, turn now: run", c, Step{Stage: Rates, Decision: allowed(0), Left: -time.Second}, Action{Verb: Run}},
		{"slots: Redis unavailable, fail closed", c, Step{Stage: Slots, Err: down}, Action{Verb: Retry}},
		{"slots: Redis unavailable, fail open", mode(FailOpen), Step{Stage: Slots, Err: down}, Action{Verb: Unlimited}},
		{"slots: Redis unavailable, fail local", mode(FailLocal), Step{Stage: Slots, Err: down}, Action{Verb: Local}},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			s := tc.s
			s.Now = now
			if s.Left == 0 {
				s.Left = NoDeadline
			}
			if got := Plan(tc.c, s); got != tc.want {
				t.Errorf("Plan = %+v, want %+v", got, tc.want)
			}
		})
	}
}
