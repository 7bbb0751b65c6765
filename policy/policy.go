package policy

import (
	"cmp"
	"fmt"
	"math"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/taskrl/taskrl/limits"
)

// Rule is one named limit bound to tasks. A policy is a list of rules; a
// task is governed by every rule whose Match it satisfies, all decided
// together as one quotas.Set.
type Rule struct {
	// Name identifies the rule in keys, decisions, metrics and errors: 1-64
	// characters from [A-Za-z0-9_.-], unique within the policy. Required.
	Name string
	// Match selects the tasks the rule applies to; at least one of
	// Match.Type and Match.Queue must be set.
	Match Match
	// Key is a template over the task's JSON payload that names the entity
	// the rule limits, e.g. "{{.business_id}}", "{{.account.id}}" or
	// "tenant-{{.tenant}}-{{.region}}". Only field references and literal
	// text are allowed. "" (the default) means one global key for the rule.
	Key string
	// DefaultKey is the whole key used when the payload lacks a field that
	// Key references. "" (the default) means such a task is refused with a
	// *MissingFieldError. It requires a Key that references a field.
	DefaultKey string
	// Fair, a template like Key (e.g. "{{.business_id}}"), shares a GCRA
	// rule's capacity fairly among its values with work waiting
	// (limits.Rule.Fair): a value alone gets all of it, and of N values
	// waiting each gets an equal share, however many tasks one of them
	// enqueued first. A payload without the field counts as the value "".
	// "" (the default) means first come, first served. A concurrency rule
	// can be fair too: its free slots go in turn to the values with tasks
	// waiting for one, so one value's backlog cannot hold every slot while
	// others wait (limits.Rule.Fair). Only a gcra or concurrency rule can
	// be fair.
	Fair string
	// FairWeight, with Fair, weights the values' shares: of the values
	// with work waiting, each gets its weight over the sum of theirs
	// (weights 3, 2 and 1 of a fair 12/s: 6, 4 and 2/s). A template over
	// the task's payload like Key (e.g. "{{.weight}}") or a literal whole
	// number; a weight that is missing or not a whole number is 1, one
	// above limits.MaxWeight (100) is 100. "" (the default): every value
	// weighs 1. Policy file: fair: {key: "{{.business_id}}", weight:
	// "{{.weight}}"}.
	FairWeight string
	// Shadow makes the rule decide without enforcing, to try a new limit
	// on live traffic: every task it governs is decided against the rule's
	// own state and reported (WouldAdmit or WouldWait, with the wait it
	// would have imposed), then runs as if the rule did not exist. Its
	// state counts the tasks it would have admitted, so that its verdicts
	// follow the traffic as the enforced rule would see it; nothing is
	// charged to any other rule. false (the default) enforces the rule.
	// Policy file: mode: shadow (or enforce).
	Shadow bool
	// Soft lets the rule exceed its limit by this share, soft throttling:
	// 0.1 makes a GCRA rate of 10/s 11/s (the burst unchanged) and a fixed
	// or sliding window of 100 a minute 110 (whole units, rounded down);
	// overrides of the rule's keys are raised alike. The excess is never
	// used by a task that would not otherwise wait: below the limit nothing
	// waits, above it the rule admits up to the raised limit and no more.
	// For limits that are guidelines rather than walls. 0 (the default):
	// none; at most 10. Only GCRA, fixed and sliding window rules can be
	// soft. Policy file: soft: 10% (or 0.1).
	Soft float64
	// Borrow lets a keyed gcra rule go above its rate while a fair rule
	// above it has capacity to spare: dynamic throttling. A business held
	// to 2/s with borrow: 2x runs at up to 4/s while the vendor's shared
	// rate has room, and gives the excess back as soon as other businesses
	// have work. The rule is decided at its rate times Borrow (its burst
	// unchanged; overrides of its keys alike); what gives the capacity back
	// is the shared rule's fair sharing (Rule.Fair), which books every
	// value with work waiting an equal share of the shared rate and takes
	// bookings over from a value ahead of its share: a key therefore gets
	// its own rate whenever the shared rate is at least the sum of the
	// rates of the keys with work, and more only while there is room.
	// The policy must have, for every task the rule governs, an enforced
	// fair gcra rule governing it too (the shared limit); New refuses
	// a borrowing rule without one. 0 (the default): no borrowing; above 1
	// a factor, at most 100; math.Inf(1) borrows up to the shared rule's
	// rate (New turns it into that factor). Only a keyed gcra rule
	// that is not fair. Policy file: borrow: 2x (or 2), borrow: true.
	Borrow float64
	// Prefetch lets every worker take a gcra rule's units ahead, in
	// batches, and hand them to its tasks within Prefetch of taking them
	// (token leasing): a busy worker then needs a Redis call per batch,
	// not per task: for rules of hundreds or thousands of tasks a second,
	// not for a rule that binds (it then decides task by task). A batch
	// is charged Prefetch ahead in the rule's schedule (a rate of
	// 10,000/s with prefetch 5ms: 50 units), so that the units handed out
	// late never let the remote side see more than its burst, and holds
	// at most the burst less that; tasks decided one by one keep the
	// whole burst; batches are only taken while the rule has room (see
	// limits.Rule.Prefetch), and overrides of the rule's keys are decided
	// without. 0 (the default): none; at most 100ms, below the burst's
	// worth of the rate. A gcra rule that is not fair, or a quota rule
	// (fixed or calendar window), whose batches are handed out only
	// before their window ends and whose unused units go back to it.
	// On a concurrency rule, Prefetch is how long a worker keeps a slot
	// its task released, for its next task (see limits.Rule.Prefetch). A
	// quota rule of at least 128 without a cost, and a concurrency rule of
	// a max of at least 32, prefetch by themselves (10ms) in the
	// middleware, as does a gcra rule that is not fair, has no cost and
	// whose burst covers four times a batch's charge ahead (10ms or less,
	// down to 1ms, and at least 4 of its intervals: 400/s or more);
	// NoPrefetch turns that off. Policy file: prefetch: 5ms, prefetch: off.
	Prefetch time.Duration
	// Cost is how many units of the rule's limit one task takes: a
	// template over the task's JSON payload like Key whose value is a
	// whole number of at least 1 (e.g. "{{.units}}": a payload field
	// "units": 3, or "3"), or a literal whole number ("3"). "" (the
	// default) means 1. A GCRA rate then admits rate/cost tasks a second
	// and burst/cost at once; a window counts cost per task. A task whose
	// cost is not a whole number of at least 1, is missing without a
	// DefaultCost, or exceeds what the rule admits at once (a GCRA or
	// adaptive burst, a window's limit, or an override's for the task's
	// key) is archived (asynq.SkipRetry) with a *CostError naming the
	// rule, the cost and the limit, and nothing is charged. A handler may
	// report the real cost afterwards with Settle (or SettleFromHeaders).
	// Not for concurrency
	// rules, nor with Prefetch. Policy file: cost: "{{.units}}".
	Cost string
	// DefaultCost is the cost used when the payload lacks a field Cost
	// references. 0 (the default) means such a task is archived with a
	// *CostError. It requires a Cost that references a field. Policy
	// file: default_cost: 1.
	DefaultCost int
	// Tiers name other limits of a keyed rule, its plans: a key on plan
	// "pro" is decided at Tiers["pro"] instead of Limit (raised by Soft and
	// Borrow alike), and, like an override, its state is kept apart (a
	// GCRA key names its interval). Each is of the same kind as Limit;
	// names are 1-64 characters of [A-Za-z0-9_.-]. A key's plan comes
	// from an override (Override.Tier; live: worker limits tier RULE KEY
	// PLAN), else from the payload (Tier); a plan Tiers lacks, or none,
	// means Limit. Nil (the default): no plans. Policy file: tiers: {free:
	// {gcra: {...}}, pro: {gcra: {...}}}.
	Tiers map[string]limits.Limit
	// Tier is a template over the task's payload like Key (e.g.
	// "{{.plan}}") rendering the key's plan, one of Tiers; a payload
	// without the field, or with a plan Tiers lacks, is decided at Limit.
	// "" (the default): plans come from overrides only. It requires Tiers.
	Tier string
	// Priority orders the tasks waiting for a gcra rule's rate or a
	// concurrency rule's slots: a template over the task's payload like
	// Key (e.g. "{{.priority}}") or a literal, rendering a level from 1
	// (first) to 5 (last). A task whose payload gives no level (the field
	// missing, or not a whole number from 1 to 5) takes its queue's
	// (PriorityQueues), else 3. At a gcra rule, a task of level p goes
	// before those of later levels waiting for the rule (it takes over the
	// booking of one that has not started, as a fair rule's flows do):
	// each level is a head start of Aging in the rule's fair queue, so a
	// level that keeps asking for more than its share uses it up and the
	// later levels are held back, never starved. At a concurrency rule,
	// the slots that free go to the first level waiting, and a task ranks
	// one level earlier per Aging it (or its level, since its last slot)
	// has waited: a level p gets a slot at least every (p−1)·Aging, and
	// its tasks that waited that long share with level 1. See
	// limits.Rule.Aging. Within a level, the rule's fair values share as
	// Fair says. The rule decides as a fair rule (for a gcra rule each
	// task a booking of its own; no prefetch) with one value when it has
	// no Fair. Priorities order the bookings of the first fair or
	// prioritized gcra rule among a task's rules. "" (the default) and no
	// PriorityQueues: every task is level 3. Not on other kinds (an
	// adaptive concurrency rule included). Policy file: priority:
	// "{{.priority}}", or priority: {level: "{{.priority}}", queues:
	// {emails: 1, newsletters: 5}, aging: 10s}.
	Priority string
	// PriorityQueues gives the level of the tasks of an asynq queue
	// whose payload gives none (Priority): queue name -> 1 to 5. Nil (the
	// default): none.
	PriorityQueues map[string]int
	// Aging is how much longer a task one level later must have waited
	// to keep its booking from a task of the earlier level, or, at a
	// concurrency rule, to rank with it (limits.Rule.Aging),
	// with Priority or PriorityQueues. 0 (the
	// default) means DefaultAging; between limits.MinAging and
	// limits.MaxAging.
	Aging time.Duration
	// Limit is the rule's limit, exactly one of limits.GCRA,
	// limits.Adaptive, limits.FixedWindow, limits.CalendarWindow,
	// limits.SlidingWindow or limits.Concurrency (a pointer to one is
	// accepted and copied). Required.
	Limit limits.Limit
}

// PriorityAging returns the aging of a rule with priorities (Priority
// or PriorityQueues set): its Aging, or DefaultAging; 0 for a rule
// without.
func (r Rule) PriorityAging() time.Duration {
	if r.Priority == "" && r.PriorityQueues == nil {
		return 0
	}
	return cmp.Or(r.Aging, DefaultAging)
}

// Raised returns l raised by the rule's Soft share and Borrow factor: the
// limit the rule enforces where its limit, or a key's override, is l.
// Without either, and for kinds that cannot be raised, it returns l.
func (r Rule) Raised(l limits.Limit) limits.Limit {
	k := 1 + r.Soft
	if g, ok := l.(limits.GCRA); ok {
		if r.Borrow > 1 && !math.IsInf(r.Borrow, 1) {
			k *= r.Borrow
		}
		g.Rate *= k
		return g
	}
	if r.Soft <= 0 {
		return l
	}
	units := func(n int) int { return int(math.Floor(float64(n)*k + 1e-9)) }
	switch l := l.(type) {
	case limits.FixedWindow:
		l.Limit = units(l.Limit)
		return l
	case limits.SlidingWindow:
		l.Limit = units(l.Limit)
		return l
	}
	return l
}

// NoPrefetch, as a Rule's Prefetch, keeps a rule from prefetching by
// itself (policy file: prefetch: off).
const NoPrefetch time.Duration = -1

// Match selects tasks by type and queue. A task matches when both set
// fields match; the zero Match matches nothing and is refused by New.
type Match struct {
	// Type is a task type pattern in path.Match syntax: "http:call",
	// "http:*", "email:[ab]*". As in path.Match, '*' does not match '/'.
	// "" (the default) matches any type.
	Type string
	// Queue is a queue name, matched exactly. "" (the default) matches any
	// queue.
	Queue string
}

// matches reports whether m selects a task of type taskType on queue.
func (m Match) matches(taskType, queue string) bool {
	if m.Queue != "" && m.Queue != queue {
		return false
	}
	if m.Type == "" {
		return true
	}
	ok, _ := path.Match(m.Type, taskType) // the pattern was checked when the policy was built
	return ok
}

// FailureMode says what the worker does with a task when Redis cannot be
// reached to decide on it.
type FailureMode string

const (
	// FailOpen runs the task without a decision: limits are not enforced
	// while Redis is down.
	FailOpen FailureMode = "open"
	// FailClosed holds the task in the worker until Redis is back; nothing
	// runs unchecked. It is the default.
	FailClosed FailureMode = "closed"
	// FailLocal decides with a per-process in-memory fallback while Redis
	// is down, so each process enforces the limits on its own.
	FailLocal FailureMode = "local"
)

// maxBindings bounds the number of (task type, queue) pairs a Policy
// caches; beyond it Bind still works but computes the binding each time.
const maxBindings = 4096

// Policy is a validated, compiled list of rules. Build it with New,
// Parse or LoadFile. A Policy is immutable and safe for
// concurrent use by multiple goroutines. The zero Policy (and a nil
// *Policy) has no rules: Bind returns nil for every task, and
// FailureMode returns FailClosed.
type Policy struct {
	rules     []*crule
	mode      FailureMode
	critical  []Match
	throttle  []string // rules an upstream throttle blocks; nil: a task's rate rules
	overrides []Override
	shed      *Shed // nil: no shed section

	mu      sync.RWMutex
	bound   map[bindKey]*Binding // nil values: no rule matches
	subsets map[string]*Binding  // by the indices of the rules bound
}

type bindKey struct{ taskType, queue string }

// crule is a validated rule with its compiled key, fair and cost templates.
type crule struct {
	Rule
	tmpl  *keyTemplate // nil when Key == ""
	ftmpl *keyTemplate // nil when Fair == ""
	wtmpl *keyTemplate // nil when FairWeight == ""
	ctmpl *keyTemplate // nil when Cost == "" or a literal
	ttmpl *keyTemplate // nil when Tier == ""
	ptmpl *keyTemplate // nil when Priority == "" or a literal
	level int          // a literal Priority; 0 when Priority is a template or ""
	cost  int          // a literal Cost; 0 when Cost is a template or ""
}

// New validates rules and returns a Policy that fails closed when
// Redis is unavailable (see WithFailureMode). Errors name the rule, the
// field (with the names of the YAML format: gcra.rate, quota.every,
// match.type, ...) and what is wrong, e.g.
//
//	policy: rule "per-business": gcra.rate: must be a positive number, got -1
//
// All rules are reported, one line each; on any error the Policy is nil.
func New(rules ...Rule) (*Policy, error) {
	p, errs := buildPolicy(rules, nil, nil, FailClosed)
	if err := errs.err(); err != nil {
		return nil, err
	}
	return p, nil
}

// with returns a copy of p (which may be nil) with an empty binding cache.
func (p *Policy) with() *Policy {
	if p == nil {
		return &Policy{}
	}
	return &Policy{rules: p.rules, mode: p.mode, critical: p.critical, throttle: p.throttle, overrides: p.overrides, shed: p.shed}
}

// WithFailureMode returns a copy of p that uses mode when Redis is
// unavailable. It fails for a mode other than FailOpen, FailClosed and
// FailLocal.
func (p *Policy) WithFailureMode(mode FailureMode) (*Policy, error) {
	switch mode {
	case FailOpen, FailClosed, FailLocal:
	default:
		return nil, &Error{Field: "redis_unavailable", Msg: fmt.Sprintf("must be open, closed or local, got %q", mode)}
	}
	q := p.with()
	q.mode = mode
	return q, nil
}

// WithCritical returns a copy of p under which the tasks any of ms selects
// are critical (the policy file's critical list): they may use the slots a
// concurrency rule reserves (limits.Concurrency.Reserved), which other
// tasks never take. Each Match needs a type pattern or a queue, as a
// rule's; the error names the entry (critical[1].type, ...) and what is
// wrong. No Match (the default) makes no task critical.
func (p *Policy) WithCritical(ms ...Match) (*Policy, error) {
	var errs errList
	for i, m := range ms {
		if field, msg := checkMatch(m); msg != "" {
			errs.add(&Error{Field: criticalField(i, field), Msg: msg})
		}
	}
	if err := errs.err(); err != nil {
		return nil, err
	}
	q := p.with()
	q.critical = slices.Clone(ms)
	return q, nil
}

// WithThrottle returns a copy of p whose upstream throttles (taskrl.Throttled)
// block only the named rules (the policy file's throttle list): a task
// throttled upstream blocks those of its rules that are named, so that a
// per-customer 429 under throttle: [per-business] does not hold back the
// other customers behind a shared rule. A task governed by none of them
// (as every task when no rule is named, the default) teaches its adaptive
// rules (limits.Adaptive: the throttle cuts their learned rate) and blocks
// them, or without any blocks all its rate and window rules, or without
// those its concurrency rules. A named adaptive rule learns too.
// Names must be rules of p; the error names the entry (throttle[1]) and
// what is wrong.
func (p *Policy) WithThrottle(names ...string) (*Policy, error) {
	var errs errList
	for i, n := range names {
		if msg := p.checkThrottle(n); msg != "" {
			errs.add(&Error{Field: fmt.Sprintf("throttle[%d]", i+1), Msg: msg})
		}
	}
	if err := errs.err(); err != nil {
		return nil, err
	}
	q := p.with()
	q.throttle = slices.Clone(names)
	return q, nil
}

// checkThrottle says what is wrong with name in a throttle list, or "".
func (p *Policy) checkThrottle(name string) string {
	var r *crule
	if p != nil {
		for _, c := range p.rules {
			if c != nil && c.Name == name { // nil: a rule parsePolicy skipped
				r = c
			}
		}
	}
	if r == nil {
		return fmt.Sprintf("no rule is named %q", name)
	}
	return ""
}

// Throttle returns a copy of the names of the rules an upstream throttle
// blocks (see WithThrottle); nil means a task's adaptive rules, else its
// rate and window rules, else its concurrency rules.
func (p *Policy) Throttle() []string {
	if p == nil {
		return nil
	}
	return slices.Clone(p.throttle)
}

// Critical returns a copy of the matchers that make a task critical.
func (p *Policy) Critical() []Match {
	if p == nil {
		return nil
	}
	return slices.Clone(p.critical)
}

// criticalField names field ("match", "match.type", ...) of the i-th
// (0-based) critical entry as the policy file does: critical[1].type.
func criticalField(i int, field string) string {
	return fmt.Sprintf("critical[%d]", i+1) + strings.TrimPrefix(field, "match")
}

// FailureMode returns the policy's failure mode: FailClosed unless
// the policy says otherwise.
func (p *Policy) FailureMode() FailureMode {
	if p == nil || p.mode == "" {
		return FailClosed
	}
	return p.mode
}

// Rules returns a copy of the policy's rules in order. Passing them to
// New builds an equivalent policy.
func (p *Policy) Rules() []Rule {
	if p == nil {
		return nil
	}
	out := make([]Rule, len(p.rules))
	for i, r := range p.rules {
		out[i] = r.Rule
	}
	return out
}

// Bind returns the rules that apply to a task of type taskType on queue,
// in policy order, or nil when no rule matches. The result is cached per
// (type, queue), so a repeated call is one read-locked map lookup with no
// allocation; (type, queue) pairs governed by the same rules share one
// *Binding. Bind is safe for concurrent use; a nil *Policy binds nothing.
func (p *Policy) Bind(taskType, queue string) *Binding {
	if p == nil {
		return nil
	}
	k := bindKey{taskType, queue}
	p.mu.RLock()
	b, ok := p.bound[k]
	p.mu.RUnlock()
	if ok {
		return b
	}
	return p.bindSlow(k)
}

func (p *Policy) bindSlow(k bindKey) *Binding {
	var idx []int
	for i, r := range p.rules {
		if r.Match.matches(k.taskType, k.queue) {
			idx = append(idx, i)
		}
	}
	critical := slices.ContainsFunc(p.critical, func(m Match) bool { return m.matches(k.taskType, k.queue) })
	var id strings.Builder
	for _, i := range idx {
		id.WriteString(strconv.Itoa(i))
		// The queue's level, where the rule gives queues one.
		if q := p.rules[i].PriorityQueues[k.queue]; q > 0 {
			id.WriteString("p" + strconv.Itoa(q))
		}
		id.WriteByte(',')
	}
	if critical {
		id.WriteByte('c')
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if b, ok := p.bound[k]; ok {
		return b
	}
	var b *Binding
	if len(idx) > 0 {
		b = p.subsets[id.String()]
		if b == nil {
			b = newBinding(p.rules, idx, p.throttle, p.overrides, k.queue)
			b.critical = critical
			if len(p.subsets) < maxBindings {
				if p.subsets == nil {
					p.subsets = map[string]*Binding{}
				}
				p.subsets[id.String()] = b
			}
		}
	}
	if len(p.bound) < maxBindings {
		if p.bound == nil {
			p.bound = map[bindKey]*Binding{}
		}
		p.bound[k] = b
	}
	return b
}

func newBinding(all []*crule, idx []int, throttle []string, overrides []Override, queue string) *Binding {
	b := &Binding{rules: make([]*crule, len(idx)), throttle: make([]bool, len(idx)), levels: make([]int, len(idx))}
	qs := make([]limits.Rule, len(idx))
	for j, i := range idx {
		r := all[i]
		b.rules[j] = r
		b.throttle[j] = slices.Contains(throttle, r.Name)
		for _, o := range overrides {
			if o.Rule == r.Name {
				if b.over == nil {
					b.over = make([]map[string]limits.Limit, len(idx))
				}
				if b.over[j] == nil {
					b.over[j] = map[string]limits.Limit{}
				}
				if o.Unlimited {
					b.over[j][o.Key] = nil // ForKeys: exempt
				} else {
					b.over[j][o.Key] = r.Raised(o.Limit)
				}
			}
		}
		// A prioritized rule is decided as a fair one, with the flow ""
		// when it has no Fair.
		aging := r.PriorityAging()
		qs[j] = limits.Rule{Name: r.Name, Limit: r.Raised(r.Limit), Fair: r.ftmpl != nil || aging > 0, Aging: aging, Prefetch: max(r.Prefetch, 0)}
		b.levels[j] = cmp.Or(r.level, r.PriorityQueues[queue])
		b.prioritized = b.prioritized || aging > 0
		b.payload = b.payload || (r.tmpl != nil && r.tmpl.fields)
		b.costs = b.costs || r.Cost != ""
		b.tiered = b.tiered || r.ttmpl != nil
	}
	b.set = qs
	return b
}
