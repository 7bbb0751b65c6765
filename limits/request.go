package limits

import "time"

// Request says whom a decision of a set of rules is for: the entity each
// rule limits, the units charged, the holder of concurrency slots, and the
// flows fair rules share their capacity among.
type Request struct {
	// Keys holds, per rule of the set in order, the entity the rule limits
	// (a business id, a customer); "" means the rule's one global key. Nil
	// means every rule is global. Any bytes are allowed.
	Keys []string
	// Cost is the units charged to every rule except concurrency rules,
	// which take one slot per holder. Zero means 1.
	Cost int
	// Costs holds, per rule of the set in order, the units charged to that
	// rule, in place of Cost; 0 means Cost. Concurrency rules ignore it.
	// Nil means Cost for every rule. A cost above a GCRA rule's burst or a
	// window's limit is never admitted: the Decision is denied with
	// RetryAfter quotas.Never and Rule naming the rule.
	Costs []int
	// Holder identifies who takes concurrency slots (an asynq task id). A
	// holder that acquires again replaces its own lease, so a redelivered
	// task never holds two slots, except under rules that keep their
	// slots (Rule.Prefetch), which take them under a holder of the
	// process's own. Required when the set has a concurrency rule. Any
	// bytes are allowed.
	Holder string
	// Critical lets the request use the slots concurrency rules reserve
	// for critical work, and puts it first in line at fair rules: it may
	// take over the booking of any request that is not critical.
	Critical bool
	// Fair holds, per rule of the set in order, the flow a fair rule
	// (Rule.Fair) shares its capacity among: a business id, a customer.
	// Other rules ignore it. Nil means every fair rule's flow is "". Any
	// bytes are allowed.
	Fair []string
	// Weights holds, per rule of the set in order, the weight of the
	// request's flow at a fair rule: of the flows with work waiting, each
	// gets its weight over the sum of theirs (weights 3, 2 and 1 of a
	// fair 12/s: 6, 4 and 2/s). 0 means 1; at most MaxWeight. Other rules
	// ignore it. Nil means 1 for every rule.
	Weights []int
	// Priorities holds, per rule of the set in order, the request's
	// priority at a fair rule with Rule.Aging: 1 (first) to
	// MaxPriority (last); 0 means DefaultPriority. Other rules ignore it.
	// Nil means DefaultPriority for every rule.
	Priorities []int
	// Waited is how long the request has waited for the rules already
	// (a task rescheduled before): at a Concurrency rule with Rule.Aging
	// its flow has waited at least that long, so the wait of a task that
	// asks now and then counts in full. 0 (the default): none. Other
	// rules ignore it.
	Waited time.Duration
}

// DefaultPriority is the priority of a request that names none, and
// MaxPriority the last level (Request.Priorities).
const (
	DefaultPriority = 3
	MaxPriority     = 5
)

// MaxWeight is the largest Request.Weights: a fair rule keeps a flow's
// weight as that many entries of its finish, so a decision costs Redis
// time in proportion to it.
const MaxWeight = 100
