package taskrl

import (
	"time"

	"github.com/taskrl/taskrl/quotas"
)

// Outcome says what the middleware did with a task.
type Outcome string

// Outcomes reported to an Observer.
const (
	// Admitted: the task runs now, at once or after a wait in the worker
	// (Event.Wait): by a decision made now, or in the slot booked for it
	// when it was rescheduled (then Event.Rules is empty). Every run of a
	// task a rule governs is preceded by one Admitted event.
	Admitted Outcome = "admitted"
	// Rescheduled: the task was rescheduled to run after Event.Wait,
	// booked for then when Event.Rule is empty, otherwise to decide again
	// then (Event.Rule denied it beyond Config.MaxReserve).
	Rescheduled Outcome = "rescheduled"
	// Refused: the task is archived: no wait can admit it (its cost
	// exceeds Event.Rule's burst or limit), its payload lacks a key field,
	// or waiting Event.Wait more would spend Config.ThrottleBudget.
	Refused Outcome = "refused"
	// UpstreamThrottled: the handler reported an upstream 429; the task's
	// rules are blocked for Event.Wait.
	UpstreamThrottled Outcome = "upstream_throttled"
	// Paused: the handler's call succeeded but the remote side said its
	// quota is spent (Pause); the task's rules are blocked for Event.Wait.
	Paused Outcome = "paused"
	// Unlimited: Redis was unreachable and the policy fails open.
	Unlimited Outcome = "unlimited"
	// Local: Redis was unreachable and the task waited for its turn in this
	// process (policy fail local).
	Local Outcome = "local"
	// WouldAdmit: the task's shadow rules (policy.Rule.Shadow, Config.Shadow)
	// would have admitted it now; it was not held back by them.
	WouldAdmit Outcome = "would_admit"
	// WouldWait: Event.Rule, a shadow rule, would have held the task back
	// Event.Wait (Never: refused it); it ran without waiting for it.
	WouldWait Outcome = "would_wait"
	// Deferred: the policy's shed section deferred the task under pressure:
	// rescheduled to come back after Event.Wait, nothing charged.
	Deferred Outcome = "deferred"
	// RedisError: a call to Redis failed (Event.Err); reported once per
	// failed call, beside the task's final outcome.
	RedisError Outcome = "redis_error"
	// Held: an operator paused Event.Rule, or the task's key of it
	// (PauseRule): the task was rescheduled to decide again after
	// Event.Wait, nothing charged.
	Held Outcome = "held"
	// ClockJump: the Redis server's clock moved against the worker's
	// monotonic clock by Event.Wait (positive: forward), a second or more,
	// between two decisions: a failover to a host whose clock differs, or
	// a step of the server's clock (docs/operations.md, failure modes). Not
	// about a task: reported once per jump seen by this process.
	ClockJump Outcome = "clock_jump"
	// Settled: the handler reported the task's actual cost (Settle) and
	// the difference was given back or charged to its rules with a Cost;
	// reported after the task ran, beside its Admitted.
	Settled Outcome = "settled"
)

// Event is one report to an Observer.
type Event struct {
	// TaskType and Queue identify the task.
	TaskType, Queue string
	// Outcome is what happened.
	Outcome Outcome
	// Rule is the rule that made the task wait, if one did.
	Rule string
	// Wait is how long the task waited in the worker (Admitted), was
	// rescheduled for (Rescheduled) or blocked its rules for
	// (UpstreamThrottled, Paused); for ClockJump, the jump.
	Wait time.Duration
	// Rules is the state of the task's rate and window rules after its
	// decision, when one was made: used, remaining, reset per rule.
	Rules []quotas.RuleStatus
	// Err is the Redis error of a RedisError event.
	Err error
	// Keys names, for an Admitted event, the rules the task runs under
	// (its rate, window and concurrency rules; shadow rules and those its
	// key is exempt from aside) and the key it takes of each, also when it
	// runs in a slot booked earlier (where Rules is empty); for
	// UpstreamThrottled and Paused, the rules the throttle blocks and the
	// task's keys of them. Nil for other outcomes and for a task no rule
	// governs.
	Keys []RuleKey
}

// RuleKey names a rule of the policy and one of its keys: the entity a
// keyed rule limits separately (a business id), "" for a rule without a
// key template.
type RuleKey struct {
	Rule, Key string
}

// Observer receives an Event per decision, for metrics and logs. It is
// called on worker goroutines and must be safe for concurrent use and
// quick.
type Observer interface {
	Observe(Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(Event)

// Observe calls f(e).
func (f ObserverFunc) Observe(e Event) { f(e) }
