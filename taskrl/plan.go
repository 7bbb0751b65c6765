package taskrl

import (
	"time"

	"github.com/taskrl/taskrl/internal/admission"
	"github.com/taskrl/taskrl/quotas"
)

// The middleware admits a task in steps (see admit.go): a booked task
// arrives, its rate rules are decided, it is checked for an upstream block
// after a wait, its concurrency slots are taken. At each step plan says
// what to do from what is known then; it does no I/O and reads no clock, so
// every branch is tested on explicit times (plan_test.go). The job carries
// the action out.

// stage is the step of a task's admission that plan decides.
type stage int

const (
	// stageBooked: a task arrives with a slot booked for it (step.booked).
	stageBooked stage = iota
	// stageRates: the task's rate and window rules were decided
	// (step.decision, or step.err when Redis failed).
	stageRates
	// stageBlocked: the task waited for its turn; step.blocked is the end
	// of an upstream block on its rules (zero: none).
	stageBlocked
	// stageSlots: the task's concurrency slots were tried (step.decision
	// or step.err); step.holdUntil is when waiting in the worker ends.
	stageSlots
)

// step is what is known at one stage of a task's admission.
type step struct {
	stage    stage
	now      time.Time       // the server's clock, estimated
	left     time.Duration   // until the task's context deadline (noDeadline: none)
	waited   time.Duration   // rescheduled for so far (ThrottleBudget)
	booked   time.Time       // stageBooked: the task's slot
	stale    bool            // stageBooked: booked under other limits
	decision quotas.Decision // stageRates, stageSlots
	err      error           // stageRates, stageSlots: Redis failed
	blocked  time.Time       // stageBlocked: end of an upstream block
	rule     string          // stageBlocked: the blocked rule
	charged  bool            // stageSlots: the rate rules hold a charge
	holdEnd  time.Time       // stageSlots: the worker stops waiting then
	lease    time.Duration   // stageSlots: the longest lease of the slots
}

// verb is what plan tells the middleware to do.
type verb int

const (
	// run the task now (after waiting action.wait in the worker).
	run verb = iota
	// wait action.wait in the worker, then go on with the next step.
	wait
	// reschedule the task after action.wait; booked at action.booked
	// when set, keeping the charge's receipt.
	reschedule
	// refuse: archive the task (action.reason).
	refuse
	// decide the task's rate rules afresh.
	decide
	// retry the same step after action.wait (Redis failed, fail closed).
	retry
	// unlimited: run the task without limits (Redis failed, fail open).
	unlimited
	// local: run after waiting for a turn (or a slot) in this process
	// alone (Redis failed, fail local).
	local
)

// action is plan's answer.
type action struct {
	verb   verb
	wait   time.Duration
	booked time.Time // reschedule: the task's slot, charged already
	refund bool      // give back the current charge first
	rule   string    // the rule that made the task wait, for the event
	reason string    // refuse: why
}

// limits is the part of Config that plan reads.
type limits struct {
	maxHold, budget time.Duration
	mode            FailureMode
	// early is how far before its slot a booked task may arrive and wait
	// for it (admission.EarlyBooking).
	early time.Duration
}

// lateBooking and slotRetry: see admission.LateBooking and SlotRetry.
const (
	lateBooking = admission.LateBooking
	slotRetry   = admission.SlotRetry
)

// plan returns what to do at step s under limits c.
func plan(c limits, s step) action {
	switch s.stage {
	case stageBooked:
		return planBooked(c, s)
	case stageRates:
		return planRates(c, s)
	case stageBlocked:
		if s.blocked.After(s.now) {
			// The remote side throttled while the task waited: its charge
			// goes back and it runs when the block ends.
			return action{verb: reschedule, wait: s.blocked.Sub(s.now), refund: true, rule: s.rule}
		}
		return action{verb: run}
	default:
		return planSlots(c, s)
	}
}

// planBooked: a booking pays for the task's run after its wait only, at its
// slot. A task that comes back well after it (the worker or Redis stalled)
// gives it back and decides again, so that late tasks do not all start at
// once; one far too early is rescheduled again, still booked.
//
// A task booked under other limits than its rules have now decides again
// without a refund: a changed GCRA limit is a new schedule (its key names
// the limit) where the old charge is not, and a window keeps the old
// charge, the safe side.
func planBooked(c limits, s step) action {
	w := s.booked.Sub(s.now)
	switch {
	case s.stale:
		return action{verb: decide}
	case w < -lateBooking:
		return action{verb: decide, refund: true}
	case w > c.early || s.left <= w:
		return action{verb: reschedule, wait: w, booked: s.booked}
	default:
		return action{verb: run, wait: max(w, 0)}
	}
}

// planRates acts on a rate decision: run now, wait in the worker up to
// MaxHold, book a later slot and reschedule to it, or, beyond the horizon,
// reschedule unbooked to decide again then.
func planRates(c limits, s step) action {
	if s.err != nil {
		return redisDown(c.mode)
	}
	d := s.decision
	if w := max(d.Delay, d.RetryAfter); c.budget > 0 && s.waited+w > c.budget {
		return action{verb: refuse, refund: true, rule: d.Rule, wait: w,
			reason: "throttle budget " + c.budget.String() + " spent (waited " + s.waited.String() + ", would wait " + w.String() + " more)"}
	}
	switch {
	case d.Allowed && (d.Delay == 0 || d.Delay <= c.maxHold && d.Delay < s.left):
		return action{verb: run, wait: d.Delay}
	case d.Allowed:
		return action{verb: reschedule, wait: d.Delay, booked: d.Now.Add(d.Delay)}
	case d.RetryAfter == quotas.Never:
		return action{verb: refuse, rule: d.Rule, reason: "task can never pass rule " + `"` + d.Rule + `"`}
	default:
		return action{verb: reschedule, wait: d.RetryAfter, rule: d.Rule}
	}
}

// planSlots acts on the concurrency slots: run when they are the task's,
// wait for them in the worker briefly, or reschedule in slotRetry keeping
// the rate charge as the task's booking then. A wait longer than any lease
// is a block (an upstream throttle): the task is rescheduled to its end.
func planSlots(c limits, s step) action {
	if s.err != nil {
		return redisDown(c.mode)
	}
	d := s.decision
	if d.Allowed {
		return action{verb: run}
	}
	w := min(d.RetryAfter, 100*time.Millisecond)
	if s.now.Add(w).After(s.holdEnd) {
		a := action{verb: reschedule, wait: slotRetry, rule: d.Rule}
		if d.RetryAfter > s.lease {
			a.wait = d.RetryAfter
		}
		if s.charged {
			a.booked = s.now.Add(a.wait)
		}
		return a
	}
	return action{verb: wait, wait: w, rule: d.Rule}
}

func redisDown(mode FailureMode) action {
	switch mode {
	case FailOpen:
		return action{verb: unlimited}
	case FailLocal:
		return action{verb: local}
	}
	return action{verb: retry}
}

// noDeadline is step.left for a task without a deadline.
const noDeadline = time.Duration(1<<63 - 1)
