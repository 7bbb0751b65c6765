package quotas

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/calendar"
)

// Limit is one rule's limit: GCRA, Adaptive, FixedWindow, CalendarWindow,
// SlidingWindow or Concurrency. The set of kinds is closed.
type Limit interface {
	// String describes the limit, e.g. "190 per 10s (fixed window)".
	String() string
	compile() (compiled, *RuleError)
}

// GCRA is a GCRA rate limit (see package gcra): Rate per Period, Burst at
// once from idle. Convert a gcra.Limit with GCRA(l).
//
// In a Set, every admitted or booked request of cost n occupies an interval
// of n emission intervals T of the rule's virtual time, starting no earlier
// than the request's moment and ending no later than Burst intervals after
// it; intervals never overlap. Requests admitted in order occupy virtual
// time end to end, which is package gcra's arithmetic exactly; a request
// booked ahead of the others takes an interval at its own moment (starting
// on a multiple of T when Burst leaves room, so that no sliver too short
// for a request is left between bookings) and leaves the time before it
// free. In any span of real time the requests in it occupy disjoint
// intervals within the span plus Burst intervals, so at most Burst plus
// one per T elapsed pass, whatever order they were booked in. A key holds
// the TAT (the end of the time occupied without a gap) and, while there
// are any, a sorted set of the bookings beyond it (MEMORY USAGE: about 50
// bytes a booking up to 128 of them, 130 beyond, where Redis changes the
// set's encoding).
type GCRA gcra.Limit

// FixedWindow admits at most Limit units per window of length Every; windows
// are aligned to the Unix epoch (a 10s window runs from :00 to :10 server
// time). Cheap (one small hash per key), but up to 2×Limit can pass around a
// window boundary.
type FixedWindow struct {
	// Limit is the units allowed per window, at least 1.
	Limit int
	// Every is the window length, at least 1ms.
	Every time.Duration
}

// CalendarWindow admits at most Limit units per calendar window: from one
// tick of the cron spec Cron in time zone TZ to the next, e.g. a daily quota
// resetting at midnight in the vendor's zone: {Limit: 10000, Cron: "0 0 * * *",
// TZ: "America/Los_Angeles"}. DST changes make such a day 23 or 25 hours long.
type CalendarWindow struct {
	// Limit is the units allowed per window, at least 1.
	Limit int
	// Cron is a standard 5-field cron spec or a descriptor such as "@daily".
	Cron string
	// TZ is an IANA time zone name; "" means UTC.
	TZ string
}

// SlidingWindow admits at most Limit units in any interval of length Every.
// A request is measured against the windows that contain its own moment,
// so a booking far ahead takes no room now. It keeps an exact log, one
// sorted-set entry per admitted unit (measured:
// about 30 bytes each up to 128 entries, about 100 bytes beyond, where Redis
// switches encoding; see BENCHMARKS.md), so it never admits more than Limit
// in any window, at a memory cost proportional to Limit. A weighted
// two-counter approximation would cost O(1) but can exceed Limit, so it is
// not offered.
type SlidingWindow struct {
	// Limit is the units allowed in any window, at least 1.
	Limit int
	// Every is the window length, at least 1ms.
	Every time.Duration
}

// Concurrency admits at most Max holders at once. A holder keeps its slot
// until it releases it or its lease runs out (a crashed holder is reclaimed
// after Lease); Renew extends a lease. Reserved slots are kept for requests
// marked Critical: ordinary requests may use only Max-Reserved slots (a load
// shedder that always leaves room for critical work). Its two keys (holders
// and fencing tokens) live until the last lease ends, at most a quarter Lease
// longer, so that most acquires leave their TTLs alone.
type Concurrency struct {
	// Max is the number of slots, at least 1.
	Max int
	// Lease is how long a slot is held without renewal, at least 1s.
	Lease time.Duration
	// Reserved slots are usable only by critical requests; 0 (the default)
	// to Max-1.
	Reserved int
}

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
	// on the rules the two share (see Limiter.Held). Default false. Each
	// flow has a virtual finish time in one sorted set per rule key, and
	// every request is a booking of its own: about 10 µs more Redis time
	// per decision than a plain rule (BENCHMARKS.md).
	Fair bool
	// Prefetch, for a GCRA rule that is not fair, lets a Limiter take the
	// rule's units ahead in batches (token leasing) and hand them out in
	// its process, each within Prefetch of the moment the batch was
	// taken, so that a busy process needs a script call for a batch, not
	// for every request (see Limiter.Allow). A unit handed out up to
	// Prefetch after its moment could push a span of real time over the
	// limit by Prefetch's worth of units, so the rule decides every
	// request with Burst lowered by ceil(Prefetch/T) (RuleStatus reports
	// that burst): what is handed out never exceeds Burst plus one per T
	// elapsed in any span. 0 (the default) takes nothing ahead; at most
	// 100ms, and Burst must exceed ceil(Prefetch/T).
	Prefetch time.Duration
}

// compiled is a validated limit in the units the script takes.
type compiled struct {
	kind   int
	suffix string // ends the rule's key; windows name their length, so
	// that two definitions of one rule name never read each other's state
	em, burst int64 // GCRA
	limit     int64 // windows
	every     int64 // fixed, sliding: µs
	sched     *calendar.Schedule
	max       int64 // concurrency
	reserved  int64
	lease     int64 // µs
	// args are the rule's script arguments that never change, boxed once.
	args []any
	// tails end the rule's keys: ":" NAME ":" SUFFIX, or for concurrency
	// the holders set and the tokens hash; then, for a sliding window,
	// ":" NAME ":block", the end of a Block (a GCRA block moves its TAT; a
	// fixed or calendar window keeps it in its hash, concurrency in its
	// tokens hash).
	tails []string
	ticks *tickCache // calendar
	fair  bool       // GCRA shared fairly among flows
	// prefetch is a GCRA rule's Rule.Prefetch, µs (burst is lowered by it).
	prefetch int64
	learn    *learnParams // an Adaptive rule: a GCRA whose em is learned
}

// withArgs fills c.args from its parameters.
func (c compiled) withArgs() compiled {
	switch c.kind {
	case kindGCRA:
		c.args = []any{kindGCRA, c.em, c.burst, b2i(c.fair)}
		if p := c.learn; p != nil {
			c.args = []any{kindAdaptive, p.min, p.max, p.start, p.per, c.burst}
		}
	case kindFixed, kindSliding:
		c.args = []any{c.kind, c.limit, c.every}
	case kindCalendar:
		c.ticks = &tickCache{}
	case kindConcurrency:
		c.args = []any{kindConcurrency, c.max, c.reserved, c.lease}
	}
	return c
}

// RuleError says what is wrong with a rule: its name, its limit, or its
// fairness. NewSet and Rule.Validate return every fault of a rule as a
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
	// be fair) or "Rule.Prefetch" (out of range, or on a limit that cannot
	// prefetch). "" when no one field is at fault: a GCRA whose fields are
	// each valid but not together (Period/Rate below a microsecond, or
	// Burst intervals longer than 35 years).
	Field string
	// Reason says what is wrong, in words that can follow the field's
	// name: "must be at least 1, got 0", `unknown time zone "Mars/Base"`.
	Reason string

	index int    // the rule's position in NewSet's arguments, from 1, when its name is invalid
	msg   string // Error's text after the rule: the message as it has always read
	err   error  // the cause: a *gcra.LimitError, or the calendar's error
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

// Unwrap returns the error of package gcra or of the cron parser that the
// RuleError reports, if any (a *gcra.LimitError for a GCRA limit).
func (e *RuleError) Unwrap() error { return e.err }

// badLimit returns the error for a field of a limit; the message reads
// "invalid limit: WORD REASON".
func badLimit(field, word, format string, args ...any) *RuleError {
	reason := fmt.Sprintf(format, args...)
	return &RuleError{Field: field, Reason: reason, msg: "invalid limit: " + word + " " + reason}
}

// String describes the limit, e.g. for logs and errors.
func (g GCRA) String() string { return gcra.Limit(g).String() + " (GCRA)" }
func (g GCRA) compile() (compiled, *RuleError) {
	l := gcra.Limit(g)
	if err := l.Validate(); err != nil {
		// Name the field in the order gcra.Limit.Validate checks them.
		e := &RuleError{msg: err.Error(), err: err}
		switch {
		case !(g.Rate > 0) || math.IsInf(g.Rate, 1):
			e.Field, e.Reason = "Rate", fmt.Sprintf("must be a positive number, got %v", g.Rate)
		case g.Period <= 0:
			e.Field, e.Reason = "Period", fmt.Sprintf("must be positive, got %v", g.Period)
		case g.Burst < 1:
			e.Field, e.Reason = "Burst", fmt.Sprintf("must be at least 1, got %d", g.Burst)
		default:
			e.Reason = err.Error()
			var le *gcra.LimitError
			if errors.As(err, &le) {
				e.Reason = le.Reason
			}
			e.Reason += ", got " + g.String()
		}
		return compiled{}, e
	}
	// The interval and burst are part of the key: a rule whose limit
	// changes (a reloaded policy, an override) starts a schedule of its own
	// rather than reading one made at another rate, whose backlog would
	// hold the new rate back until it had passed.
	em := l.Interval().Microseconds()
	return compiled{kind: kindGCRA, suffix: "gcra:" + strconv.FormatInt(em, 10) + ":" + strconv.Itoa(l.Burst), em: em, burst: int64(l.Burst)}, nil
}

// String describes the limit, e.g. for logs and errors.
func (w FixedWindow) String() string {
	return fmt.Sprintf("%d per %v (fixed window)", w.Limit, w.Every)
}
func (w FixedWindow) compile() (compiled, *RuleError) {
	if err := checkWindow(w.Limit, w.Every); err != nil {
		return compiled{}, err
	}
	return compiled{kind: kindFixed, suffix: "fixed:" + strconv.FormatInt(w.Every.Microseconds(), 10), limit: int64(w.Limit), every: w.Every.Microseconds()}, nil
}

// String describes the limit, e.g. for logs and errors.
func (w SlidingWindow) String() string {
	return fmt.Sprintf("%d per %v (sliding window)", w.Limit, w.Every)
}
func (w SlidingWindow) compile() (compiled, *RuleError) {
	if err := checkWindow(w.Limit, w.Every); err != nil {
		return compiled{}, err
	}
	if w.Limit > maxSliding {
		return compiled{}, badLimit("Limit", "sliding window limit", "%d exceeds %d (the log keeps one entry per unit; use a fixed or calendar window)", w.Limit, maxSliding)
	}
	return compiled{kind: kindSliding, suffix: "sliding:" + strconv.FormatInt(w.Every.Microseconds(), 10), limit: int64(w.Limit), every: w.Every.Microseconds()}, nil
}

// maxSliding bounds a sliding window's log.
const maxSliding = 100_000

func checkWindow(limit int, every time.Duration) *RuleError {
	if err := checkLimit(limit); err != nil {
		return err
	}
	if every < time.Millisecond {
		return badLimit("Every", "window", "must be at least 1ms, got %v", every)
	}
	if every > 100*365*24*time.Hour {
		return badLimit("Every", "window", "must be at most 100 years, got %v", every)
	}
	return nil
}

// checkLimit checks a window's Limit.
func checkLimit(limit int) *RuleError {
	if limit < 1 {
		return badLimit("Limit", "limit", "must be at least 1, got %d", limit)
	}
	return nil
}

// String describes the limit, e.g. for logs and errors.
func (w CalendarWindow) String() string {
	tz := w.TZ
	if tz == "" {
		tz = "UTC"
	}
	return fmt.Sprintf("%d per %q in %s (calendar window)", w.Limit, w.Cron, tz)
}
func (w CalendarWindow) compile() (compiled, *RuleError) {
	if err := checkLimit(w.Limit); err != nil {
		return compiled{}, err
	}
	// The zone on its own first: Parse's error could be about either.
	field := "TZ"
	_, err := calendar.LoadZone(w.TZ)
	var s *calendar.Schedule
	if err == nil {
		field = "Cron"
		s, err = calendar.Parse(w.Cron, w.TZ)
	}
	if err != nil {
		return compiled{}, &RuleError{Field: field, Reason: err.Error(), msg: err.Error(), err: err}
	}
	h := sha256.Sum256([]byte(w.Cron + "\x00" + w.TZ))
	return compiled{kind: kindCalendar, suffix: "calendar:" + hex.EncodeToString(h[:4]), limit: int64(w.Limit), sched: s}, nil
}

// String describes the limit, e.g. for logs and errors.
func (c Concurrency) String() string {
	if c.Reserved > 0 {
		return fmt.Sprintf("%d at once, lease %v, %d reserved for critical (concurrency)", c.Max, c.Lease, c.Reserved)
	}
	return fmt.Sprintf("%d at once, lease %v (concurrency)", c.Max, c.Lease)
}
func (c Concurrency) compile() (compiled, *RuleError) {
	switch {
	case c.Max < 1:
		return compiled{}, badLimit("Max", "max", "must be at least 1, got %d", c.Max)
	case c.Lease < time.Second:
		return compiled{}, badLimit("Lease", "lease", "must be at least 1s, got %v", c.Lease)
	case c.Lease > 7*24*time.Hour:
		return compiled{}, badLimit("Lease", "lease", "must be at most 7 days, got %v", c.Lease)
	case c.Reserved < 0 || c.Reserved >= c.Max:
		return compiled{}, badLimit("Reserved", "reserved", "must be between 0 and max-1 (%d), got %d", c.Max-1, c.Reserved)
	}
	return compiled{kind: kindConcurrency, max: int64(c.Max), reserved: int64(c.Reserved), lease: c.Lease.Microseconds()}, nil
}

// Set is a validated, immutable list of rules decided together. Build it
// with NewSet. A Set is safe for concurrent use.
type Set struct {
	rules    []Rule
	comp     []compiled
	named    bool // GCRA and sliding rules name their charges with a nonce per request
	fair     bool // a rule is fair
	adaptive bool // a rule is Adaptive
	// prefetch is, when every rule of the set has Rule.Prefetch, the
	// shortest, µs; otherwise 0.
	prefetch int64
	// batchMax is the most units one prefetch may take: the smallest
	// burst of the set's rules.
	batchMax int64
}

// NewSet validates rules and returns a Set. The error, a *RuleError unless
// rules is empty, names the rule and what is wrong with it.
func NewSet(rules ...Rule) (*Set, error) {
	if len(rules) == 0 {
		return nil, errors.New("quotas: a set needs at least one rule")
	}
	s := &Set{rules: append([]Rule(nil), rules...)}
	seen := map[string]bool{}
	for i, r := range rules {
		c, err := r.compile(seen)
		if err != nil {
			if err.Field == "Rule.Name" && !seen[r.Name] {
				err.index = i + 1 // an invalid name does not identify the rule
			}
			return nil, err
		}
		seen[r.Name] = true
		c = c.withArgs()
		switch c.kind {
		case kindConcurrency:
			// The tokens hash keeps a Block's end (field "~blk", cc_block).
			c.tails = []string{":" + r.Name + ":holders", ":" + r.Name + ":tokens"}
		case kindGCRA:
			c.tails = []string{":" + r.Name + ":" + c.suffix, ":" + r.Name + ":" + c.suffix + ":booked"}
			if c.fair {
				c.tails = append(c.tails, ":"+r.Name+":gcra:flows")
			}
			if c.learn != nil {
				c.tails = append(c.tails, ":"+r.Name+":adaptive:learn")
			}
		case kindSliding:
			c.tails = []string{":" + r.Name + ":" + c.suffix, ":" + r.Name + ":block"}
		default:
			// A fixed or calendar window keeps its block in its hash
			// (field "~blk", win_block in rules.lua).
			c.tails = []string{":" + r.Name + ":" + c.suffix}
		}
		s.comp = append(s.comp, c)
		s.named = s.named || c.kind == kindSliding || c.kind == kindGCRA
		s.fair = s.fair || c.fair
		s.adaptive = s.adaptive || c.learn != nil
		if i == 0 || c.prefetch < s.prefetch {
			s.prefetch = c.prefetch
		}
		if i == 0 || c.burst < s.batchMax {
			s.batchMax = c.burst
		}
	}
	return s, nil
}

// Rules returns a copy of the set's rules.
func (s *Set) Rules() []Rule { return append([]Rule(nil), s.rules...) }

// Validate reports what is wrong with r, as a *RuleError, or nil: every
// check NewSet makes of a rule but that its name is unique in the set. It
// is safe for concurrent use.
func (r Rule) Validate() error {
	if _, err := r.compile(nil); err != nil {
		return err
	}
	return nil
}

// compile validates r, whose name must not be in seen, and compiles its
// limit.
func (r Rule) compile(seen map[string]bool) (compiled, *RuleError) {
	fail := func(e *RuleError) (compiled, *RuleError) {
		e.Rule = r.Name
		return compiled{}, e
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
	c, e := r.Limit.compile()
	if e != nil {
		return fail(e)
	}
	if r.Fair && (c.kind != kindGCRA || c.learn != nil) {
		msg := fmt.Sprintf("only a GCRA rule can be fair, not a %s", r.Limit)
		return fail(&RuleError{Field: "Rule.Fair", Reason: msg, msg: msg})
	}
	c.fair = r.Fair
	if r.Prefetch != 0 {
		bad := func(format string, args ...any) (compiled, *RuleError) {
			msg := fmt.Sprintf(format, args...)
			return fail(&RuleError{Field: "Rule.Prefetch", Reason: msg, msg: "prefetch " + msg})
		}
		ahead := (r.Prefetch.Microseconds() + c.em - 1) / max(c.em, 1)
		switch {
		case c.kind != kindGCRA || c.learn != nil || c.fair:
			return bad("is only for a GCRA rule that is not fair, not %s", r.Limit)
		case r.Prefetch < time.Microsecond || r.Prefetch > maxPrefetch:
			return bad("must be between 1µs and %v, got %v", maxPrefetch, r.Prefetch)
		case ahead >= c.burst:
			return bad("%v takes %d units of %s ahead: the burst must be above that", r.Prefetch, ahead, r.Limit)
		}
		c.burst -= ahead
		c.prefetch = r.Prefetch.Microseconds()
		c.suffix += ":p" + strconv.FormatInt(c.prefetch, 10)
	}
	return c, nil
}

// maxPrefetch bounds Rule.Prefetch.
const maxPrefetch = 100 * time.Millisecond

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
