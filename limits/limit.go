package limits

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/taskrl/taskrl/internal/calendar"
	"github.com/taskrl/taskrl/internal/units"
)

// Limit is one rule's limit: GCRA, Adaptive, FixedWindow, CalendarWindow,
// SlidingWindow or Concurrency. The set of kinds is closed.
type Limit interface {
	// String describes the limit, e.g. "190 per 10s (fixed window)".
	String() string
	// check validates the limit.
	check() *RuleError
}

// GCRA is a GCRA rate limit (the arithmetic of package gcra): Rate per
// Period, Burst at once from idle. Convert a gcra.Limit with GCRA(l); its
// fields mean what gcra.Limit's do.
//
// In a set of rules decided together (quotas.Set), every admitted or booked
// request of cost n occupies an interval of n emission intervals T of the
// rule's virtual time, starting no earlier than the request's moment and
// ending no later than Burst intervals after it; intervals never overlap.
// Requests admitted in order occupy virtual time end to end, which is
// package gcra's arithmetic exactly; a request booked ahead of the others
// takes an interval at its own moment (starting on a multiple of T when
// Burst leaves room, so that no sliver too short for a request is left
// between bookings) and leaves the time before it free. In any span of real
// time the requests in it occupy disjoint intervals within the span plus
// Burst intervals, so at most Burst plus one per T elapsed pass, whatever
// order they were booked in. A key holds the TAT (the end of the time
// occupied without a gap) and, while there are any, a sorted set of the
// bookings beyond it (MEMORY USAGE: about 50 bytes a booking up to 128 of
// them, 130 beyond, where Redis changes the set's encoding).
type GCRA struct {
	// Rate is the number of events per Period. Fractions are allowed
	// (Rate 1.8, Period 1s); it must be positive and finite.
	Rate float64
	// Period is the window Rate is counted over. It must be positive.
	Period time.Duration
	// Burst is how many events may happen at once from idle, at least 1.
	// A single request may cost at most Burst.
	Burst int
}

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
	// Limit is the units allowed in any window, at least 1; at most
	// MaxSliding.
	Limit int
	// Every is the window length, at least 1ms.
	Every time.Duration
}

// MaxSliding bounds a SlidingWindow's Limit: its log keeps one entry per
// unit.
const MaxSliding = 100_000

// Concurrency admits at most Max holders at once. A holder keeps its slot
// until it releases it or its lease runs out (a crashed holder is reclaimed
// after Lease); renewal extends a lease. Reserved slots are kept for
// requests marked Critical: ordinary requests may use only Max-Reserved
// slots (a load shedder that always leaves room for critical work). Its two
// keys (holders and fencing tokens) live until the last lease ends, at most
// a quarter Lease longer, so that most acquires leave their TTLs alone.
//
// With Adaptive the number of slots L is learned for the whole fleet,
// between Min and Max, from the latency of the calls the slots were taken
// for, reported when a slot is released (quotas.Lease.Outcome). L is one
// value in the rule's state per entity, kept a day after the last call
// that reported, so a fleet that restarts goes on from what was learned,
// and a change of Min or Max keeps it within the new bounds. It starts at
// Min. The rule is Vegas-style, on the ratio of the recent latency to the
// latency without load:
//
//   - the no-load latency is the lowest the calls show: it falls a tenth of
//     the way to each faster call, and rises a tenth of the way to each
//     slower one only while L is at Min and the calls are still slow (the
//     service itself became slower);
//   - the recent ratio averages each call's latency over the no-load one,
//     each call weighing a fifth;
//   - while the ratio is at most 1.2 and at least half of L is in use, L
//     grows: by 1 per call until its first decrease (slow start), then by
//     k/(4L) per call, k being 1 up to the L of the last decrease and 1
//     more for each slot above it (a quarter slot per L calls near the
//     limit found last, faster the further above it);
//   - when the ratio reaches 1.5, L falls to max(0.5, min(0.9, 1.3/ratio))
//     of itself, and when a call reports overload (the remote side
//     throttled it) to 0.7 of itself, by at least one slot and never below
//     Min. Calls that started before the fall had taken effect (one recent
//     latency after it) decrease it no further: the answers to the calls
//     in flight together are one congestion event.
//
// Calls of one adaptive rule should be alike (one endpoint, key it by
// endpoint): it learns one no-load latency for all of them.
type Concurrency struct {
	// Max is the number of slots, at least 1; with Adaptive, the most the
	// learned number reaches, at most MaxAdaptiveSlots.
	Max int
	// Lease is how long a slot is held without renewal, at least 1s.
	Lease time.Duration
	// Reserved slots are usable only by critical requests; 0 (the default)
	// to Max-1. Not with Adaptive.
	Reserved int
	// Adaptive learns the number of slots; false (the default): Max.
	Adaptive bool
	// Min is the fewest slots an adaptive limit learns, 1 to Max; 0 (the
	// default) without Adaptive.
	Min int
}

// String describes the limit, e.g. "18/1s burst 3 (GCRA)".
func (g GCRA) String() string { return g.rate() + " (GCRA)" }

// Interval returns the emission interval Period/Rate as the limiters
// enforce it: whole microseconds, rounded up when Period/Rate is not a
// whole number of them, so that the enforced rate never exceeds Rate. It
// returns 0 for an invalid limit.
func (g GCRA) Interval() time.Duration {
	t, reason := units.Interval(g.Rate, g.Period, g.Burst)
	if reason != "" {
		return 0
	}
	return time.Duration(t) * time.Microsecond
}

func (g GCRA) check() *RuleError {
	_, reason := units.Interval(g.Rate, g.Period, g.Burst)
	if reason == "" {
		return nil
	}
	// Name the field in the order the checks run.
	e := &RuleError{msg: fmt.Sprintf("gcra: invalid limit %s: %s", g.rate(), reason)}
	switch {
	case !(g.Rate > 0) || math.IsInf(g.Rate, 1):
		e.Field, e.Reason = "Rate", fmt.Sprintf("must be a positive number, got %v", g.Rate)
	case g.Period <= 0:
		e.Field, e.Reason = "Period", fmt.Sprintf("must be positive, got %v", g.Period)
	case g.Burst < 1:
		e.Field, e.Reason = "Burst", fmt.Sprintf("must be at least 1, got %d", g.Burst)
	default:
		e.Reason = reason + ", got " + g.String()
	}
	return e
}

// rate is g as "RATE/PERIOD burst B", without the kind.
func (g GCRA) rate() string {
	return strconv.FormatFloat(g.Rate, 'g', -1, 64) + "/" + g.Period.String() + " burst " + strconv.Itoa(g.Burst)
}

// String describes the limit, e.g. "190 per 10s (fixed window)".
func (w FixedWindow) String() string {
	return fmt.Sprintf("%d per %v (fixed window)", w.Limit, w.Every)
}

func (w FixedWindow) check() *RuleError { return checkWindow(w.Limit, w.Every) }

// String describes the limit, e.g. "100 per 1m0s (sliding window)".
func (w SlidingWindow) String() string {
	return fmt.Sprintf("%d per %v (sliding window)", w.Limit, w.Every)
}

func (w SlidingWindow) check() *RuleError {
	if err := checkWindow(w.Limit, w.Every); err != nil {
		return err
	}
	if w.Limit > MaxSliding {
		return badLimit("Limit", "sliding window limit", "%d exceeds %d (the log keeps one entry per unit; use a fixed or calendar window)", w.Limit, MaxSliding)
	}
	return nil
}

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

// String describes the limit, e.g.
// `10000 per "0 0 * * *" in America/Los_Angeles (calendar window)`.
func (w CalendarWindow) String() string {
	tz := w.TZ
	if tz == "" {
		tz = "UTC"
	}
	return fmt.Sprintf("%d per %q in %s (calendar window)", w.Limit, w.Cron, tz)
}

func (w CalendarWindow) check() *RuleError {
	if err := checkLimit(w.Limit); err != nil {
		return err
	}
	// The zone on its own first: Parse's error could be about either.
	field := "TZ"
	_, err := calendar.LoadZone(w.TZ)
	if err == nil {
		field = "Cron"
		_, err = calendar.Parse(w.Cron, w.TZ)
	}
	if err != nil {
		return &RuleError{Field: field, Reason: err.Error(), msg: err.Error(), err: err}
	}
	return nil
}

// MaxAdaptiveSlots bounds an adaptive Concurrency's Max: its learned state
// counts millionths of a slot in doubles, exact below 2^53.
const MaxAdaptiveSlots = 1_000_000

// String describes the limit, e.g. "8 at once, lease 30s (concurrency)",
// "2-50 at once, learned, lease 30s (adaptive concurrency)".
func (c Concurrency) String() string {
	if c.Adaptive {
		return fmt.Sprintf("%d-%d at once, learned, lease %v (adaptive concurrency)", c.Min, c.Max, c.Lease)
	}
	if c.Reserved > 0 {
		return fmt.Sprintf("%d at once, lease %v, %d reserved for critical (concurrency)", c.Max, c.Lease, c.Reserved)
	}
	return fmt.Sprintf("%d at once, lease %v (concurrency)", c.Max, c.Lease)
}

func (c Concurrency) check() *RuleError {
	switch {
	case c.Max < 1:
		return badLimit("Max", "max", "must be at least 1, got %d", c.Max)
	case c.Lease < time.Second:
		return badLimit("Lease", "lease", "must be at least 1s, got %v", c.Lease)
	case c.Lease > 7*24*time.Hour:
		return badLimit("Lease", "lease", "must be at most 7 days, got %v", c.Lease)
	case c.Reserved < 0 || c.Reserved >= c.Max:
		return badLimit("Reserved", "reserved", "must be between 0 and max-1 (%d), got %d", c.Max-1, c.Reserved)
	case c.Adaptive && c.Max > MaxAdaptiveSlots:
		return badLimit("Max", "max", "must be at most %d for an adaptive limit, got %d", MaxAdaptiveSlots, c.Max)
	case c.Adaptive && (c.Min < 1 || c.Min > c.Max):
		return badLimit("Min", "min", "must be between 1 and max (%d), got %d", c.Max, c.Min)
	case c.Adaptive && c.Reserved > 0:
		return badLimit("Reserved", "reserved", "is not for an adaptive limit, got %d", c.Reserved)
	case !c.Adaptive && c.Min != 0:
		return badLimit("Min", "min", "is only for an adaptive limit, got %d", c.Min)
	}
	return nil
}

// Capacity returns the most units one request can cost under l: a GCRA or
// Adaptive burst (at least 1), a window's limit; math.MaxInt for
// Concurrency, whose slots are not units.
func Capacity(l Limit) int {
	switch l := l.(type) {
	case GCRA:
		return max(l.Burst, 1)
	case Adaptive:
		return max(l.Burst, 1)
	case FixedWindow:
		return l.Limit
	case CalendarWindow:
		return l.Limit
	case SlidingWindow:
		return l.Limit
	}
	return math.MaxInt
}
