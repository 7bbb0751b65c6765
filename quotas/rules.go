package quotas

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"sync"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/calendar"
	"github.com/taskrl/taskrl/limits"
)

// The rule vocabulary is package limits'; these names are the same types.
type (
	// Limit is one rule's limit (limits.Limit).
	Limit = limits.Limit
	// GCRA is a GCRA rate limit (limits.GCRA); convert a gcra.Limit with
	// GCRA(l).
	GCRA = limits.GCRA
	// Adaptive is a GCRA limit whose rate is learned (limits.Adaptive).
	Adaptive = limits.Adaptive
	// FixedWindow is Limit units per epoch-aligned window (limits.FixedWindow).
	FixedWindow = limits.FixedWindow
	// CalendarWindow is Limit units per cron-defined window
	// (limits.CalendarWindow).
	CalendarWindow = limits.CalendarWindow
	// SlidingWindow is Limit units in any interval, an exact log
	// (limits.SlidingWindow).
	SlidingWindow = limits.SlidingWindow
	// Concurrency is at most Max holders at once (limits.Concurrency).
	Concurrency = limits.Concurrency
	// Rule is a named limit (limits.Rule).
	Rule = limits.Rule
	// RuleError says what is wrong with a rule (limits.RuleError).
	RuleError = limits.RuleError
	// Request says whom a decision is for (limits.Request).
	Request = limits.Request
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
	amin      int64 // an adaptive concurrency rule's Min; 0: not adaptive
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
	aging int64      // a fair rule's Rule.Aging, µs: its requests ordered by priority
	// cfair: a Concurrency rule whose slots go to the waiting flows in
	// turn (rules.lua, cc_wait).
	cfair bool
	// prefetch is Rule.Prefetch, µs.
	prefetch int64
	learn    *learnParams // an Adaptive rule: a GCRA whose em is learned
}

// withArgs fills c.args from its parameters.
func (c compiled) withArgs() compiled {
	switch c.kind {
	case kindGCRA:
		// fair: 0, 1, or a fair rule's aging in µs (at least 1000).
		fair := int64(b2i(c.fair))
		if c.aging > 0 {
			fair = c.aging
		}
		c.args = []any{kindGCRA, c.em, c.burst, fair}
		if p := c.learn; p != nil {
			c.args = []any{kindAdaptive, p.min, p.max, p.start, p.per, c.burst}
		}
	case kindFixed, kindSliding:
		c.args = []any{c.kind, c.limit, c.every}
	case kindCalendar:
		c.ticks = &tickCache{}
	case kindConcurrency:
		// fair: 0, 1, or a fair rule's aging in µs (at least 1000).
		fair := int64(b2i(c.cfair))
		if c.aging > 0 {
			fair = c.aging
		}
		c.args = []any{kindConcurrency, c.max, c.reserved, c.lease, fair, c.amin}
	}
	return c
}

// compile compiles a valid rule's limit into the units the script takes.
func compile(r Rule) compiled {
	var c compiled
	switch l := r.Limit.(type) {
	case GCRA:
		// The interval and burst are part of the key: a rule whose limit
		// changes (a reloaded policy, an override) starts a schedule of its
		// own rather than reading one made at another rate, whose backlog
		// would hold the new rate back until it had passed.
		em := gcra.Limit(l).Interval().Microseconds()
		c = compiled{kind: kindGCRA, suffix: "gcra:" + strconv.FormatInt(em, 10) + ":" + strconv.Itoa(l.Burst), em: em, burst: int64(l.Burst)}
		c.prefetch = r.Prefetch.Microseconds()
		c.fair, c.aging = r.Fair, r.Aging.Microseconds()
	case Adaptive:
		c = compileAdaptive(l)
	case FixedWindow:
		c = compiled{kind: kindFixed, suffix: "fixed:" + strconv.FormatInt(l.Every.Microseconds(), 10), limit: int64(l.Limit), every: l.Every.Microseconds()}
	case SlidingWindow:
		// A prefetching log spans Every+Prefetch (see Rule.Prefetch); its
		// key names that span, so it never reads another definition's.
		every := l.Every.Microseconds() + r.Prefetch.Microseconds()
		c = compiled{kind: kindSliding, suffix: "sliding:" + strconv.FormatInt(every, 10), limit: int64(l.Limit), every: every, prefetch: r.Prefetch.Microseconds()}
	case CalendarWindow:
		s, err := calendar.Parse(l.Cron, l.TZ)
		if err != nil {
			panic("quotas: internal error: a valid calendar window does not parse: " + err.Error())
		}
		h := sha256.Sum256([]byte(l.Cron + "\x00" + l.TZ))
		c = compiled{kind: kindCalendar, suffix: "calendar:" + hex.EncodeToString(h[:4]), limit: int64(l.Limit), sched: s}
	case Concurrency:
		c = compiled{kind: kindConcurrency, max: int64(l.Max), reserved: int64(l.Reserved), lease: l.Lease.Microseconds(), cfair: r.Fair, aging: r.Aging.Microseconds()}
		if l.Adaptive {
			c.amin = int64(l.Min)
		}
	}
	if c.kind == kindFixed || c.kind == kindCalendar || c.kind == kindConcurrency {
		// A window's units are handed out before its end only, and a
		// slot kept is still held: the limit stands as it is.
		c.prefetch = r.Prefetch.Microseconds()
	}
	return c
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
	// batchMax is the most units one prefetch may take: the smallest of
	// its GCRA rules' bursts less what the set's prefetch takes ahead
	// (limits.Ahead: a batch is placed that far ahead and must still fit
	// the burst, booked.lua) and limits.WindowBatch of its windows.
	batchMax int64
	// windows: a window rule (fixed, calendar, sliding) prefetches; its
	// unused units are given back.
	windows bool
	// keep is, when every rule of the set is a Concurrency rule with
	// Rule.Prefetch, the shortest, µs: how long a released slot is kept
	// (slots.go); otherwise 0. Such a set has prefetch 0, as has any set
	// with a concurrency rule.
	keep int64
	// parts caches the set's splits (split.go): *parts by the mask of
	// the keyed rules.
	parts *sync.Map
}

// NewSet validates rules and returns a Set. The error, a *RuleError unless
// rules is empty, names the rule and what is wrong with it.
func NewSet(rules ...Rule) (*Set, error) {
	if len(rules) == 0 {
		return nil, errors.New("quotas: a set needs at least one rule")
	}
	if err := limits.Validate(rules...); err != nil {
		return nil, err
	}
	s := &Set{rules: append([]Rule(nil), rules...), parts: &sync.Map{}}
	for i, r := range rules {
		c := compile(r).withArgs()
		switch c.kind {
		case kindConcurrency:
			// The tokens hash keeps a Block's end (field "~blk", cc_block).
			c.tails = []string{":" + r.Name + ":holders", ":" + r.Name + ":tokens"}
			if c.cfair {
				// The flows waiting, by rank, and until when (cc_wait).
				c.tails = append(c.tails, ":"+r.Name+":waiting", ":"+r.Name+":waits")
			}
			if c.amin > 0 {
				// The learned number of slots (cl_load).
				c.tails = append(c.tails, ":"+r.Name+":slots:learn")
			}
		case kindGCRA:
			c.tails = []string{":" + r.Name + ":" + c.suffix, ":" + r.Name + ":" + c.suffix + ":booked"}
			if c.fair {
				// The virtual finishes, and the tags of bookings taken
				// over, returned to their flows (booked.lua, Fair).
				c.tails = append(c.tails, ":"+r.Name+":gcra:flows", ":"+r.Name+":gcra:returned")
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
		if c.kind == kindFixed || c.kind == kindCalendar || c.kind == kindSliding {
			s.windows = s.windows || c.prefetch > 0
		}
	}
	for i, c := range s.comp {
		most := c.burst
		switch c.kind {
		case kindGCRA:
			if s.prefetch > 0 {
				most -= (s.prefetch + c.em - 1) / c.em
			}
		case kindFixed, kindCalendar, kindSliding:
			most = limits.WindowBatch(int(c.limit))
		}
		if i == 0 || most < s.batchMax {
			s.batchMax = most
		}
	}
	if slices.ContainsFunc(s.comp, func(c compiled) bool { return c.kind == kindConcurrency }) {
		if !slices.ContainsFunc(s.comp, func(c compiled) bool { return c.kind != kindConcurrency }) {
			s.keep = s.prefetch
		}
		s.prefetch = 0
	}
	return s, nil
}

// Rules returns a copy of the set's rules.
func (s *Set) Rules() []Rule { return append([]Rule(nil), s.rules...) }
