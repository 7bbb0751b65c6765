package limits

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/taskrl/taskrl/internal/units"
)

// Adaptive is a GCRA limit whose rate is learned, for the whole fleet, in
// the rule's own state: it starts at Start (default Max), is lowered when
// quotas.Limiter.Block reports that the remote side throttled a call, and raised
// step by step while admitted traffic flows without one, always between
// Min and Max per Per. Burst (default 1) is the burst of the GCRA at every
// rate. The state lives in Redis beside the rule's TAT, so every worker
// sees one learned rate and it survives their restarts (a key idle for a
// day starts at Start again).
//
// The algorithm keeps a rate known to be good and probes above it. P is
// Per; em the interval of the current rate; a dwell is the longest of
// P/2, 4 em and 16 em up to 4 P (so that a vendor's burst, refilled
// while a Retry-After held the calls, seldom makes a rate above its limit
// look good); the hold the longer of 100 em and 24 P (so that a failed
// probe a hold costs at most 1 % of the calls), or of 60 em and 8 P while
// a remembered rate, see below, is more than 10 % above the current one.
//
//   - Good. A rate is good once the rule has been busy at it for a dwell
//     (the time its admitted units occupied, as the TAT shows, from the
//     first unit booked at that rate: an idle rule learns nothing) with
//     no throttle.
//   - Probe. When the rate is good and a probe is due, the rate is raised
//     by the step (25 % at first). A probe that stays good for a dwell,
//     and until it has passed 5 units more than the good rate would have,
//     or as many as a failed probe passed before its throttle if more (so
//     a remote side's burst cannot make a rate above its limit look
//     good), or for the hold (4 P while a remembered rate is more than
//     10 % above, 5 P right after a kept probe), is kept and the next is
//     due at once; after two good probes in a row the step doubles, up
//     to 100 %, and after one kept at the smallest step it is 10 % (a
//     limit that rose): a limit far above is found in a few dwells (1/s
//     to 300/s in about 45 s of traffic, most of it the first steps at
//     the lowest rates).
//   - Throttled while probing. Back to the last good rate at once, the
//     step quartered (at least 2 %); the next probe is due after a dwell
//     while the step that failed was above 4 %, after the hold once it
//     was not: at a stable limit the rule stays within a few % below it
//     and probes once a hold. A throttle that comes before the probe's
//     first unit went out (booked units go first) is the good rate's,
//     and is taken as below.
//   - Throttled not probing: the limit fell, or the rate sat so close to
//     it that the calls' jitter crossed it. A rate good for a dwell (as
//     the last good rate after a failed probe is) is cut to 0.97 of it and
//     remembered (3 % lower if it was the remembered rate already); the
//     step is 2 % and the next probe is due after the hold. Cut so once
//     already within the hold, with no probe since, it is above the limit
//     rather than at it (a burst made it look good), and is cut to 0.9.
//     A rate not yet good (after a cut), or the start until its first
//     cut or kept probe (good for a dwell or not: never measured), is cut
//     to 0.7, again after each block while it is too high, and searched
//     up from with a 20 % step after a dwell. Once the hold has passed
//     since the last cut, a probe goes straight back to the remembered
//     rate (every other probe; the others step up from the good rate),
//     and each that fails remembers 3 % less: a limit that comes back is
//     found within two holds.
//
// A throttle of a call decided before the last cut is the same
// congestion event (the answers to the calls in flight together) and
// changes nothing; one of a call decided at or after the cut, at the cut
// rate, cuts again (quotas.Limiter.BlockCall; an undated Block within a
// second of a cut is taken for the same event). The time a Block holds
// counts as idle. A cut starts the rule's time afresh
// from the block's end: what was booked at the refused rate is dropped
// (quotas.Limiter.Held reports those bookings, Refund gives nothing back
// for them).
//
// Every failed probe costs the block the remote side asks for (a second
// of the fleet's calls when its Retry-After is in whole seconds), so
// the hold trades the share of the limit used at a stable limit against
// how soon a raised limit is found; BENCHMARKS.md has the figures of a
// simulated day and of the built binaries.
//
// The zero value is not valid: Max and Per are required.
type Adaptive struct {
	// Max is the highest rate per Per; required, positive.
	Max float64
	// Min is the lowest rate per Per; 0 means Max/100, and at most Max.
	Min float64
	// Start is the rate per Per of a key with no learned state; 0 means
	// Max. Between Min and Max.
	Start float64
	// Per is the period the rates are given for, at least 1ms.
	Per time.Duration
	// Burst is how many requests pass at once from idle; 0 means 1.
	Burst int
}

// String describes the limit, e.g. "learned 0.5-50 per 1s (adaptive)".
func (a Adaptive) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "learned %s-%s per %v", num(a.MinRate()), num(a.Max), a.Per)
	if a.Start != 0 {
		fmt.Fprintf(&b, " from %s", num(a.Start))
	}
	if a.Burst > 1 {
		fmt.Fprintf(&b, ", burst %d", a.Burst)
	}
	return b.String() + " (adaptive)"
}

func num(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// MinRate is the lowest rate per Per: Min, or Max/100 when Min is 0.
func (a Adaptive) MinRate() float64 {
	if a.Min == 0 {
		return a.Max / 100
	}
	return a.Min
}

// StartRate is the rate per Per of a key with no learned state: Start, or
// Max when Start is 0.
func (a Adaptive) StartRate() float64 {
	if a.Start == 0 {
		return a.Max
	}
	return a.Start
}

func (a Adaptive) check() *RuleError {
	bad := func(field, format string, args ...any) *RuleError {
		return badLimit(field, strings.ToLower(field), format, args...)
	}
	finite := func(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }
	start := a.StartRate()
	switch {
	case !(a.Max > 0) || !finite(a.Max):
		return bad("Max", "must be a positive number, got %v", a.Max)
	case a.Per < time.Millisecond || a.Per > 365*24*time.Hour:
		return bad("Per", "must be between 1ms and 365 days, got %v", a.Per)
	case a.Min < 0 || !finite(a.Min) || a.Min > a.Max:
		return bad("Min", "must be between 0 and max (%v), got %v", a.Max, a.Min)
	case start < a.MinRate() || start > a.Max || !finite(start):
		return bad("Start", "must be between min (%v) and max (%v), got %v", a.MinRate(), a.Max, a.Start)
	case a.Burst < 0 || a.Burst > 1_000_000:
		return bad("Burst", "must be between 1 and 1000000, got %d", a.Burst)
	case units.LearnRate(a.MinRate(), a.Per) < 1:
		return bad("Min", "must be at least one per 30 years, got %v per %v", a.MinRate(), a.Per)
	case units.LearnRate(a.Max, a.Per) > 1e6*units.LearnScale:
		return bad("Max", "exceeds a million per second, got %v per %v", a.Max, a.Per)
	}
	return nil
}
