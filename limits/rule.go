package limits

import (
	"fmt"
	"time"
)

// Rule is a named limit. The name appears in keys, decisions and metrics.
type Rule struct {
	// Name identifies the rule: 1-64 characters from [A-Za-z0-9_.-], unique
	// within a set.
	Name string
	// Limit is the rule's limit; required.
	Limit Limit
	// Fair, for a GCRA rule, shares the rule's capacity max-min fairly
	// among the flows (Request.Fair, e.g. business ids) with work waiting:
	// a flow alone gets all of it; of N flows waiting, each gets one
	// interval in N, and a flow that booked ahead while it was alone gives
	// up those bookings to the others as they come: a Reserve takes over
	// such a booking of the set's first fair rule, with the owner's charges
	// on the rules the two share (see quotas.Limiter.Held). Default false. Each
	// flow has a virtual finish time in one sorted set per rule key, and
	// every request is a booking of its own: about 10 µs more Redis time
	// per decision than a plain rule (BENCHMARKS.md).
	//
	// Fair, for a Concurrency rule (not an adaptive one), hands its slots to the flows waiting
	// for them in turn, by weight: a flow of weight w holding h slots
	// comes before the flows holding more per weight ((h+1)/w lower). A
	// request finding slots free takes one unless at least as many other
	// waiting flows come before its flow; one the rule refuses makes its
	// flow wait, for 1 s after its last refusal, so a slot kept for a flow
	// whose requests stopped asking stays free at most that long. A
	// refusal with no slot free and no Block in force says whether the
	// request's flow is the next of several waiting
	// (quotas.RuleStatus.Next): its requests had better ask again soon.
	// Critical requests are not held back. One flow with many requests
	// therefore cannot hold every slot while others ask: each flow asking
	// converges on Max times its weight's share. A fair concurrency rule
	// cannot prefetch (its slots are never kept).
	Fair bool
	// Prefetch, for a rule that is not fair: a GCRA rule, a FixedWindow,
	// CalendarWindow or SlidingWindow, lets a quotas.Limiter take the
	// rule's units ahead in batches (token leasing) and hand them out in
	// its process, each within Prefetch of the moment the batch was
	// taken, so that a busy process needs a script call for a batch, not
	// for every request (see quotas.Limiter.Allow); a set prefetches when
	// all its rules do.
	//
	// A GCRA batch is charged Prefetch ahead in the rule's schedule and
	// must still fit the burst from its moment, so each unit, handed out
	// within Prefetch, is as if admitted when it is handed out: what is
	// handed out never exceeds Burst plus one per T elapsed in any span,
	// and every other request decides with the whole Burst. While batches
	// are taken, the schedule runs up to Prefetch ahead of now: a burst
	// arriving then finds up to ceil(Prefetch/T) units fewer (Ahead), and a
	// batch holds at most Burst less that; Burst must exceed it. A fixed or calendar window's units are counted in
	// the window of the batch and handed out only before that window ends,
	// so no window ever admits more than its Limit. A SlidingWindow decides every request
	// with Every lengthened by Prefetch (RuleStatus reports the count in
	// that span): the units of a batch logged at its moment and handed
	// out up to Prefetch later then never put more than Limit in any span
	// of Every. A window's batch takes at most WindowBatch(Limit) units,
	// and the units a process did not hand out are given back when they
	// expire.
	//
	// For a Concurrency rule, Prefetch is how long a slot released in a
	// process is kept there, under a holder of the process's own and its
	// lease, for the process's next request instead of being given back
	// at once: a busy process then takes and releases its slots without a
	// call. Every slot handed out is held in Redis, so the rule never
	// admits more than Max. A slot is kept only if the rule was far from
	// its limit when the slot was taken, and handed out again only within
	// a second (at most a twelfth of its lease) of that: a Block, or the
	// rule nearing its limit, holds in every process within that time. A
	// process that dies holds its slots until their leases end, and a
	// request redelivered meanwhile takes another rather than replacing
	// its own (Request.Holder). A set keeps slots when all its rules are
	// Concurrency rules with Prefetch.
	//
	// 0 (the default) takes nothing ahead; at most MaxPrefetch.
	Prefetch time.Duration
	// Aging, for a fair GCRA rule, orders its requests by priority
	// (Request.Priorities: levels 1, first, to 5, last; 3 by default): a
	// level is a head start of Aging in the rule's fair queue, a request
	// of level p tagged (p'−p)·Aging ahead of one of level p' whose flow
	// used as much of its share. It therefore takes over the booking of a
	// request of a later level that has not started (as a flow below its
	// share does at a fair rule) unless that request has waited the
	// difference: a higher level goes first while its flows ask for no
	// more than their share and the head start; one that keeps asking for
	// more uses the head start up and then shares the rate by weight with
	// the later levels, which are held back but never starved. Within a
	// level, flows share as Fair says. Each level of a flow has a virtual
	// finish of its own, so one flow's backlog of a late level does not
	// hold back its requests of an earlier one, and a request never takes
	// over a booking of its own flow and level (they keep their order).
	//
	// For a fair Concurrency rule, Aging orders the flows waiting for a
	// slot by level first (each level of a flow a flow of its own): the
	// slots that free go to the waiting flows of the first level (all of
	// them while one waits), and among those as Fair says. A flow ranks
	// one level earlier per Aging it has waited, at level 1 at most:
	// waited since it last got a slot or began to wait, or, if longer,
	// as long as its request says (Request.Waited: a task rescheduled
	// before). So a later level gets a slot at least every (p−1)·Aging
	// while earlier ones keep every slot busy, and its tasks that have
	// waited (p−1)·Aging share the slots with level 1 by the slots each
	// holds: held back, never starved.
	//
	// 0 (the default): priorities are ignored; otherwise between
	// MinAging and MaxAging.
	Aging time.Duration
}

// MinAging and MaxAging bound Rule.Aging.
const (
	MinAging = time.Millisecond
	MaxAging = time.Hour
)

// Validate reports what is wrong with rules, as a *RuleError, or nil:
// each rule's checks (Rule.Validate) in order, then that its name is
// unique among them. It is what quotas.NewSet checks of its rules.
func Validate(rules ...Rule) error {
	seen := map[string]bool{}
	for i, r := range rules {
		if err := r.check(seen); err != nil {
			if err.Field == "Rule.Name" && !seen[r.Name] {
				err.index = i + 1 // an invalid name does not identify the rule
			}
			return err
		}
		seen[r.Name] = true
	}
	return nil
}

// Validate reports what is wrong with r, as a *RuleError, or nil: every
// check Validate makes of a rule but that its name is unique.
func (r Rule) Validate() error {
	if err := r.check(nil); err != nil {
		return err
	}
	return nil
}

// check validates r, whose name must not be in seen.
func (r Rule) check(seen map[string]bool) *RuleError {
	fail := func(e *RuleError) *RuleError {
		e.Rule = r.Name
		return e
	}
	if e := checkName(r.Name); e != nil {
		return fail(e)
	}
	if seen[r.Name] {
		return fail(&RuleError{Field: "Rule.Name", Reason: "duplicate name", msg: "duplicate name"})
	}
	if r.Limit == nil {
		return fail(&RuleError{Field: "Rule.Limit", Reason: "missing", msg: "no limit"})
	}
	if e := r.Limit.check(); e != nil {
		return fail(e)
	}
	g, plain := r.Limit.(GCRA)
	_, fixed := r.Limit.(FixedWindow)
	_, calendar := r.Limit.(CalendarWindow)
	_, sliding := r.Limit.(SlidingWindow)
	cc, slots := r.Limit.(Concurrency)
	if r.Fair && (!plain && !slots || cc.Adaptive) {
		msg := fmt.Sprintf("only a GCRA or Concurrency rule can be fair, not a %s", r.Limit)
		return fail(&RuleError{Field: "Rule.Fair", Reason: msg, msg: msg})
	}
	if r.Aging != 0 {
		msg := ""
		switch {
		case !plain && !slots || cc.Adaptive:
			msg = fmt.Sprintf("is only for a fair GCRA or Concurrency rule, not a %s", r.Limit)
		case !r.Fair:
			msg = "is only for a fair rule (Rule.Fair)"
		case r.Aging < MinAging || r.Aging > MaxAging:
			msg = fmt.Sprintf("must be between %v and %v, got %v", MinAging, MaxAging, r.Aging)
		}
		if msg != "" {
			return fail(&RuleError{Field: "Rule.Aging", Reason: msg, msg: "aging " + msg})
		}
	}
	if r.Prefetch != 0 {
		bad := func(format string, args ...any) *RuleError {
			msg := fmt.Sprintf(format, args...)
			return fail(&RuleError{Field: "Rule.Prefetch", Reason: msg, msg: "prefetch " + msg})
		}
		switch {
		case !(plain || fixed || calendar || sliding || slots):
			return bad("is only for a GCRA rule, a window or concurrency, not %s", r.Limit)
		case r.Fair:
			return bad("is not for a fair rule: each request of a fair rule is decided in turn with the other flows'")
		case cc.Adaptive:
			return bad("is not for an adaptive concurrency rule: each slot's call teaches it")
		case r.Prefetch < time.Microsecond || r.Prefetch > MaxPrefetch:
			return bad("must be between 1µs and %v, got %v", MaxPrefetch, r.Prefetch)
		}
		if ahead := Ahead(g, r.Prefetch); plain && ahead >= int64(g.Burst) {
			return bad("%v takes %d units of %s ahead: the burst must be above that", r.Prefetch, ahead, r.Limit)
		}
	}
	return nil
}

// Ahead is how many units of a valid GCRA limit g a prefetch of p takes
// ahead: ceil(p/T). A batch of a rule with Prefetch p is charged that far
// ahead, so it holds at most Burst less Ahead units.
func Ahead(g GCRA, p time.Duration) int64 {
	em := g.Interval().Microseconds()
	return (p.Microseconds() + em - 1) / max(em, 1)
}

// RuleError says what is wrong with a rule: its name, its limit, or its
// fairness. Validate, Rule.Validate and quotas.NewSet return every fault of a rule as a
// *RuleError. Its fields are for programs that map the fault to their own
// input (a configuration file's fields, a form); people read Error.
//
// A *RuleError is immutable once returned and safe to share between
// goroutines. The zero value says nothing; this package never returns it.
type RuleError struct {
	// Rule is the rule's name as given, even when the name is what is wrong.
	Rule string
	// Field names what is wrong, by its Go name. For a field of the rule's
	// limit: "Rate", "Period" or "Burst" of a GCRA; "Limit" or "Every" of
	// a FixedWindow or SlidingWindow; "Limit", "Cron" or "TZ" of a
	// CalendarWindow; "Max", "Lease" or "Reserved" of a Concurrency. For a
	// field of the Rule itself: "Rule.Name" (invalid, or a duplicate in a
	// set), "Rule.Limit" (missing), "Rule.Fair" (on a limit that cannot
	// be fair), "Rule.Prefetch" (out of range, or on a limit that cannot
	// prefetch) or "Rule.Aging" (out of range, or on a rule that is not a
	// fair GCRA or Concurrency rule). "" when no one field is at fault: a
	// GCRA whose fields are each valid but not together (Period/Rate below a microsecond, or
	// Burst intervals longer than 35 years).
	Field string
	// Reason says what is wrong, in words that can follow the field's
	// name: "must be at least 1, got 0", `unknown time zone "Mars/Base"`.
	Reason string

	index int    // the rule's position in NewSet's arguments, from 1, when its name is invalid
	msg   string // Error's text after the rule: the message as it has always read
	err   error  // the cause: the calendar's error
}

// Error returns the message, e.g.
// `quotas: rule "w": invalid limit: limit must be at least 1, got 0`.
func (e *RuleError) Error() string {
	msg := e.msg
	if msg == "" {
		msg = e.Field + ": " + e.Reason
	}
	if e.index > 0 {
		return fmt.Sprintf("quotas: rule %d: %s", e.index, msg)
	}
	return fmt.Sprintf("quotas: rule %q: %s", e.Rule, msg)
}

// Unwrap returns the error of the time zone or cron parser that the
// RuleError reports, if any.
func (e *RuleError) Unwrap() error { return e.err }

// badLimit returns the error for a field of a limit; the message reads
// "invalid limit: WORD REASON".
func badLimit(field, word, format string, args ...any) *RuleError {
	reason := fmt.Sprintf(format, args...)
	return &RuleError{Field: field, Reason: reason, msg: "invalid limit: " + word + " " + reason}
}

// WindowBatch is the most units of a prefetching FixedWindow,
// CalendarWindow or SlidingWindow of limit units that one batch takes: a 32nd of the limit,
// at least 1, so that the units a fleet holds ahead are a small part of
// the window.
func WindowBatch(limit int) int64 { return max(int64(limit)/32, 1) }

// MaxPrefetch bounds Rule.Prefetch.
const MaxPrefetch = 100 * time.Millisecond

func checkName(name string) *RuleError {
	bad := func(format string, args ...any) *RuleError {
		reason := fmt.Sprintf(format, args...)
		return &RuleError{Field: "Rule.Name", Reason: reason, msg: "name " + reason}
	}
	if name == "" || len(name) > 64 {
		return bad("%q must be 1-64 characters", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return bad("%q contains %q; allowed are letters, digits, '_', '.' and '-'", name, c)
		}
	}
	return nil
}
