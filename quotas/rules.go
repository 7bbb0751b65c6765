package quotas

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/calendar"
)

// Limit is one rule's limit: GCRA, FixedWindow, CalendarWindow,
// SlidingWindow or Concurrency. The set of kinds is closed.
type Limit interface {
	// String describes the limit, e.g. "190 per 10s (fixed window)".
	String() string
	compile() (compiled, error)
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
}

const (
	kindGCRA = iota + 1
	kindFixed
	kindCalendar
	kindSliding
	kindConcurrency
)

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
	// the holders set and the tokens hash.
	tails []string
	ticks *tickCache // calendar
	fair  bool       // GCRA shared fairly among flows
}

// withArgs fills c.args from its parameters.
func (c compiled) withArgs() compiled {
	switch c.kind {
	case kindGCRA:
		c.args = []any{kindGCRA, c.em, c.burst, b2i(c.fair)}
	case kindFixed, kindSliding:
		c.args = []any{c.kind, c.limit, c.every}
	case kindCalendar:
		c.ticks = &tickCache{}
	case kindConcurrency:
		c.args = []any{kindConcurrency, c.max, c.reserved, c.lease}
	}
	return c
}

var errLimit = errors.New("invalid limit")

// String describes the limit, e.g. for logs and errors.
func (g GCRA) String() string { return gcra.Limit(g).String() + " (GCRA)" }
func (g GCRA) compile() (compiled, error) {
	l := gcra.Limit(g)
	if err := l.Validate(); err != nil {
		return compiled{}, err
	}
	return compiled{kind: kindGCRA, suffix: "gcra", em: l.Interval().Microseconds(), burst: int64(l.Burst)}, nil
}

// String describes the limit, e.g. for logs and errors.
func (w FixedWindow) String() string {
	return fmt.Sprintf("%d per %v (fixed window)", w.Limit, w.Every)
}
func (w FixedWindow) compile() (compiled, error) {
	if err := checkWindow(w.Limit, w.Every); err != nil {
		return compiled{}, err
	}
	return compiled{kind: kindFixed, suffix: "fixed:" + strconv.FormatInt(w.Every.Microseconds(), 10), limit: int64(w.Limit), every: w.Every.Microseconds()}, nil
}

// String describes the limit, e.g. for logs and errors.
func (w SlidingWindow) String() string {
	return fmt.Sprintf("%d per %v (sliding window)", w.Limit, w.Every)
}
func (w SlidingWindow) compile() (compiled, error) {
	if err := checkWindow(w.Limit, w.Every); err != nil {
		return compiled{}, err
	}
	if w.Limit > maxSliding {
		return compiled{}, fmt.Errorf("%w: sliding window limit %d exceeds %d (the log keeps one entry per unit; use a fixed or calendar window)", errLimit, w.Limit, maxSliding)
	}
	return compiled{kind: kindSliding, suffix: "sliding:" + strconv.FormatInt(w.Every.Microseconds(), 10), limit: int64(w.Limit), every: w.Every.Microseconds()}, nil
}

// maxSliding bounds a sliding window's log.
const maxSliding = 100_000

func checkWindow(limit int, every time.Duration) error {
	if limit < 1 {
		return fmt.Errorf("%w: limit must be at least 1, got %d", errLimit, limit)
	}
	if every < time.Millisecond {
		return fmt.Errorf("%w: window must be at least 1ms, got %v", errLimit, every)
	}
	if every > 100*365*24*time.Hour {
		return fmt.Errorf("%w: window must be at most 100 years, got %v", errLimit, every)
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
func (w CalendarWindow) compile() (compiled, error) {
	if w.Limit < 1 {
		return compiled{}, fmt.Errorf("%w: limit must be at least 1, got %d", errLimit, w.Limit)
	}
	s, err := calendar.Parse(w.Cron, w.TZ)
	if err != nil {
		return compiled{}, err
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
func (c Concurrency) compile() (compiled, error) {
	switch {
	case c.Max < 1:
		return compiled{}, fmt.Errorf("%w: max must be at least 1, got %d", errLimit, c.Max)
	case c.Lease < time.Second:
		return compiled{}, fmt.Errorf("%w: lease must be at least 1s, got %v", errLimit, c.Lease)
	case c.Lease > 7*24*time.Hour:
		return compiled{}, fmt.Errorf("%w: lease must be at most 7 days, got %v", errLimit, c.Lease)
	case c.Reserved < 0 || c.Reserved >= c.Max:
		return compiled{}, fmt.Errorf("%w: reserved must be between 0 and max-1 (%d), got %d", errLimit, c.Max-1, c.Reserved)
	}
	return compiled{kind: kindConcurrency, max: int64(c.Max), reserved: int64(c.Reserved), lease: c.Lease.Microseconds()}, nil
}

// Set is a validated, immutable list of rules decided together. Build it
// with NewSet. A Set is safe for concurrent use.
type Set struct {
	rules []Rule
	comp  []compiled
	named bool // GCRA and sliding rules name their charges with a nonce per request
	fair  bool // a rule is fair
}

// NewSet validates rules and returns a Set. The error names the rule and
// what is wrong with it.
func NewSet(rules ...Rule) (*Set, error) {
	if len(rules) == 0 {
		return nil, errors.New("quotas: a set needs at least one rule")
	}
	s := &Set{rules: append([]Rule(nil), rules...)}
	seen := map[string]bool{}
	for i, r := range rules {
		if err := checkName(r.Name); err != nil {
			return nil, fmt.Errorf("quotas: rule %d: %w", i+1, err)
		}
		if seen[r.Name] {
			return nil, fmt.Errorf("quotas: rule %q: duplicate name", r.Name)
		}
		seen[r.Name] = true
		if r.Limit == nil {
			return nil, fmt.Errorf("quotas: rule %q: no limit", r.Name)
		}
		c, err := r.Limit.compile()
		if err != nil {
			return nil, fmt.Errorf("quotas: rule %q: %w", r.Name, err)
		}
		if r.Fair && c.kind != kindGCRA {
			return nil, fmt.Errorf("quotas: rule %q: only a GCRA rule can be fair, not a %s", r.Name, r.Limit)
		}
		c.fair = r.Fair
		c = c.withArgs()
		switch c.kind {
		case kindConcurrency:
			c.tails = []string{":" + r.Name + ":holders", ":" + r.Name + ":tokens"}
		case kindGCRA:
			c.tails = []string{":" + r.Name + ":gcra", ":" + r.Name + ":gcra:booked"}
			if c.fair {
				c.tails = append(c.tails, ":"+r.Name+":gcra:flows")
			}
		default:
			c.tails = []string{":" + r.Name + ":" + c.suffix}
		}
		s.comp = append(s.comp, c)
		s.named = s.named || c.kind == kindSliding || c.kind == kindGCRA
		s.fair = s.fair || c.fair
	}
	return s, nil
}

// Rules returns a copy of the set's rules.
func (s *Set) Rules() []Rule { return append([]Rule(nil), s.rules...) }

func checkName(name string) error {
	if name == "" || len(name) > 64 {
		return fmt.Errorf("name %q must be 1-64 characters", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return fmt.Errorf("name %q contains %q; allowed are letters, digits, '_', '.' and '-'", name, c)
		}
	}
	return nil
}
