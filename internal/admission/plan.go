package admission

import "time"

// The middleware admits a task in steps (taskrl/admit.go): a booked task
// arrives, its rate rules are decided, it is checked for an upstream block
// after a wait, its concurrency slots are taken. At each step Plan says
// what to do from what is known then; it does no I/O and reads no clock, so
// every branch is tested on explicit times (plan_test.go), and the
// simulator (cmd/internal/simulate) follows the very same branches. The
// caller carries the action out.

// Stage is the step of a task's admission that Plan decides.
type Stage int

const (
	// Booked: a task arrives with a slot booked for it (Step.Booked).
	Booked Stage = iota
	// Rates: the task's rate and window rules were decided
	// (Step.Decision, or Step.Err when Redis failed).
	Rates
	// Blocked: the task waited for its turn; Step.Blocked is the end of an
	// upstream block on its rules (zero: none).
	Blocked
	// Slots: the task's concurrency slots were tried (Step.Decision or
	// Step.Err); Step.HoldEnd is when waiting in the worker ends.
	Slots
)

// Never is Decision.RetryAfter for a task that can never pass a rule
// (quotas.Never; a test in taskrl checks that they are equal).
const Never time.Duration = -1

// Decision is what Plan reads of a limiter's decision (quotas.Decision).
type Decision struct {
	Allowed           bool
	Delay, RetryAfter time.Duration // RetryAfter Never: never admissible
	Now               time.Time     // the server's clock when decided
	Rule              string        // the rule that denied, or made it wait
	// Next: a fair concurrency rule denied with no slot free, the task's
	// flow the next to get one of several flows waiting (Slots): it looks
	// again sooner.
	Next bool
}

// Step is what is known at one stage of a task's admission.
type Step struct {
	Stage    Stage
	Now      time.Time     // the server's clock, estimated
	Left     time.Duration // until the task's context deadline (NoDeadline: none)
	Waited   time.Duration // rescheduled for so far (the throttle budget)
	Booked   time.Time     // Booked: the task's slot
	Stale    bool          // Booked: booked under other limits
	Decision Decision      // Rates, Slots
	Err      error         // Rates, Slots: Redis failed
	Blocked  time.Time     // Blocked: end of an upstream block
	Rule     string        // Blocked: the blocked rule
	Charged  bool          // Slots: the rate rules hold a charge
	HoldEnd  time.Time     // Slots: the worker stops waiting then
	Lease    time.Duration // Slots: the longest lease of the slots
	// Crowded (Slots): a fair concurrency rule serves another flow
	// before the task's, and enough other tasks of its flow wait for a
	// slot in this process's workers: the task is rescheduled at once for
	// Crowded, leaving the worker to the tasks of other flows behind it in
	// asynq's queue. Zero: not crowded.
	Crowded time.Duration
}

// NoDeadline is Step.Left for a task without a deadline.
const NoDeadline = time.Duration(1<<63 - 1)

// Verb is what Plan tells the caller to do.
type Verb int

const (
	// Run the task now (after waiting Action.Wait in the worker).
	Run Verb = iota
	// Wait Action.Wait in the worker, then go on with the next step.
	Wait
	// Reschedule the task after Action.Wait; booked at Action.Booked when
	// set, keeping the charge's receipt.
	Reschedule
	// Refuse: archive the task (Action.Reason).
	Refuse
	// Decide the task's rate rules afresh.
	Decide
	// Retry the same step after a back-off (Redis failed, fail closed).
	Retry
	// Unlimited: run the task without limits (Redis failed, fail open).
	Unlimited
	// Local: run after waiting for a turn (or a slot) in this process
	// alone (Redis failed, fail local).
	Local
)

// Action is Plan's answer.
type Action struct {
	Verb   Verb
	Wait   time.Duration
	Booked time.Time // Reschedule: the task's slot, charged already
	Refund bool      // give back the current charge first
	Rule   string    // the rule that made the task wait, for the event
	Reason string    // Refuse: why
}

// Mode is what a task does when Redis cannot be reached (the policy's
// failure mode).
type Mode int

const (
	// FailClosed: the task waits for Redis.
	FailClosed Mode = iota
	// FailOpen: the task runs without limits.
	FailOpen
	// FailLocal: the task is limited in this process alone.
	FailLocal
)

// Limits is the part of the middleware's configuration that Plan reads.
type Limits struct {
	MaxHold, Budget time.Duration // Config.MaxHold, Config.ThrottleBudget (0: none)
	Mode            Mode
	// Early is how far before its slot a booked task may arrive and wait
	// for it (EarlyBooking).
	Early time.Duration
}

// Plan returns what to do at step s under limits c.
func Plan(c Limits, s Step) Action {
	switch s.Stage {
	case Booked:
		return planBooked(c, s)
	case Rates:
		return planRates(c, s)
	case Blocked:
		if s.Blocked.After(s.Now) {
			// The remote side throttled while the task waited: its charge
			// goes back and it runs when the block ends.
			return Action{Verb: Reschedule, Wait: s.Blocked.Sub(s.Now), Refund: true, Rule: s.Rule}
		}
		return Action{Verb: Run}
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
func planBooked(c Limits, s Step) Action {
	w := s.Booked.Sub(s.Now)
	switch {
	case s.Stale:
		return Action{Verb: Decide}
	case w < -LateBooking:
		return Action{Verb: Decide, Refund: true}
	case w > c.Early || s.Left <= w:
		return Action{Verb: Reschedule, Wait: w, Booked: s.Booked}
	default:
		return Action{Verb: Run, Wait: max(w, 0)}
	}
}

// planRates acts on a rate decision: run now, wait in the worker up to
// MaxHold, book a later slot and reschedule to it, or, beyond the horizon,
// reschedule unbooked to decide again then.
func planRates(c Limits, s Step) Action {
	if s.Err != nil {
		return redisDown(c.Mode)
	}
	d := s.Decision
	if w := max(d.Delay, d.RetryAfter); c.Budget > 0 && s.Waited+w > c.Budget {
		return Action{Verb: Refuse, Refund: true, Rule: d.Rule, Wait: w,
			Reason: "throttle budget " + c.Budget.String() + " spent (waited " + s.Waited.String() + ", would wait " + w.String() + " more)"}
	}
	switch {
	case d.Allowed && (d.Delay == 0 || d.Delay <= c.MaxHold && d.Delay < s.Left):
		return Action{Verb: Run, Wait: d.Delay}
	case d.Allowed:
		return Action{Verb: Reschedule, Wait: d.Delay, Booked: d.Now.Add(d.Delay)}
	case d.RetryAfter == Never:
		return Action{Verb: Refuse, Rule: d.Rule, Reason: "task can never pass rule " + `"` + d.Rule + `"`}
	default:
		return Action{Verb: Reschedule, Wait: d.RetryAfter, Rule: d.Rule}
	}
}

// planSlots acts on the concurrency slots: run when they are the task's,
// wait for them in the worker briefly, or reschedule in SlotRetry keeping
// the rate charge as the task's booking then. A wait longer than any lease
// is a block (an upstream throttle): the task is rescheduled to its end. A
// task whose flow is next at a fair rule looks again every NextPoll: the
// slot that frees is kept for it.
func planSlots(c Limits, s Step) Action {
	if s.Err != nil {
		return redisDown(c.Mode)
	}
	d := s.Decision
	if d.Allowed {
		return Action{Verb: Run}
	}
	if s.Crowded > 0 {
		a := Action{Verb: Reschedule, Wait: s.Crowded, Rule: d.Rule}
		if s.Charged {
			a.Booked = s.Now.Add(a.Wait)
		}
		return a
	}
	poll := 100 * time.Millisecond
	if d.Next {
		poll = NextPoll
	}
	w := min(d.RetryAfter, poll)
	if s.Now.Add(w).After(s.HoldEnd) {
		a := Action{Verb: Reschedule, Wait: SlotRetry, Rule: d.Rule}
		if d.RetryAfter > s.Lease {
			a.Wait = d.RetryAfter
		}
		if s.Charged {
			a.Booked = s.Now.Add(a.Wait)
		}
		return a
	}
	return Action{Verb: Wait, Wait: w, Rule: d.Rule}
}

func redisDown(mode Mode) Action {
	switch mode {
	case FailOpen:
		return Action{Verb: Unlimited}
	case FailLocal:
		return Action{Verb: Local}
	}
	return Action{Verb: Retry}
}
