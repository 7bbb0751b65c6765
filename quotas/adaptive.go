package quotas

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Adaptive is a GCRA limit whose rate is learned, for the whole fleet, in
// the rule's own state: it starts at Start (default Max), is lowered when
// Limiter.Block reports that the remote side throttled a call, and raised
// step by step while admitted traffic flows without one, always between
// Min and Max per Per. Burst (default 1) is the burst of the GCRA at every
// rate. The state lives in Redis beside the rule's TAT, so every worker
// sees one learned rate and it survives their restarts (a key idle for a
// day starts at Start again).
//
// The algorithm keeps a rate known to be good and probes above it. P is
// Per; em the interval of the current rate; a dwell is the longer of P/2
// and 4 em; the hold the longer of 60 em and 24 P (8 P while a remembered
// rate, see below, is more than 10 % above the current one).
//
//   - Good. A rate is good once the rule has been busy at it for a dwell
//     (the time its admitted units occupied, as the TAT shows, from the
//     first unit booked at that rate: an idle rule learns nothing) with
//     no throttle.
//   - Probe. When the rate is good and a probe is due, the rate is raised
//     by the step (25 % at first). A probe that stays good for a dwell is
//     kept and the next is due at once; after two good probes in a row
//     the step doubles, up to 100 %: a limit far above is found in a few
//     dwells (1/s to 300/s in about 18 s of traffic).
//   - Throttled while probing. Back to the last good rate at once, the
//     step halved (at least 2 %); the next probe is due after a dwell
//     while the step is above 4 %, after the hold once it is not: at a
//     stable limit the rule stays within a few % below it and probes once
//     a hold.
//   - Throttled not probing: the limit fell, or the rate sat so close to
//     it that the calls' jitter crossed it. A rate good for a dwell (as
//     the last good rate after a failed probe is) is cut to 0.97 of it and
//     remembered (3 % lower if it was the remembered rate already); the
//     step is 2 % and the next probe is due after the hold. A rate not yet
//     good (the start, or after a cut) is cut to 0.7, again after each
//     block while it is too high, and searched up from with a 25 % step
//     after a dwell. Every other probe goes straight back to the
//     remembered rate (the others step up from the good rate), and each
//     that fails remembers 3 % less: a limit that comes back is found
//     within two holds.
//
// Throttles less than a second after a cut are the same congestion event
// (the answers to the calls in flight together) and change nothing; the
// time a Block holds counts as idle. A cut starts the rule's time afresh
// from the block's end: what was booked at the refused rate is dropped
// (Held reports those bookings, Refund gives nothing back for them).
//
// Every failed probe costs the block the remote side asks for (at least a
// second of the fleet's calls, as a Retry-After is in whole seconds), so
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

// Constants of the learning algorithm (see Adaptive); learn.lua has the
// same values. P is the rule's Per; em the interval of the current rate.
const (
	learnDwell      = 2       // a rate is good after P/learnDwell busy...
	learnDwellUnits = 4       // ... and at least this many em
	learnHold       = 24      // P to the next probe after one failed at the smallest step...
	learnHoldBack   = 8       // ... or while a remembered rate is more than 10 % above
	learnHoldUnits  = 60      // ... and at least this many em
	learnStep0      = 0.25    // the first probe step
	learnStepMin    = 0.02    // the smallest probe step
	learnStepMax    = 1.0     // the largest probe step
	learnCut        = 0.7     // a throttle at a rate not yet good cuts it to this share...
	learnNudge      = 0.97    // ... at a rate good for a dwell to this one
	learnForget     = 0.97    // a failed probe at the remembered rate lowers it by this share
	learnCool       = 1000000 // µs: throttles within this of a cut are one event
	learnScale      = 1e9     // rates are stored in billionths of a unit per second
	learnTTL        = 24 * time.Hour
)

// learnParams are an adaptive rule's bounds in the units the script takes:
// rates in billionths of a unit per second, Per in µs.
type learnParams struct {
	min, max, start, per int64
}

// rateArg converts a rate per p into billionths of a unit per second.
func rateArg(rate float64, p time.Duration) int64 {
	return int64(math.Floor(rate * learnScale * float64(time.Second) / float64(p)))
}

// String describes the limit, e.g. for logs and errors.
func (a Adaptive) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "learned %s-%s per %v", num(a.min()), num(a.Max), a.Per)
	if a.Start != 0 {
		fmt.Fprintf(&b, " from %s", num(a.Start))
	}
	if a.Burst > 1 {
		fmt.Fprintf(&b, ", burst %d", a.Burst)
	}
	return b.String() + " (adaptive)"
}

func num(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func (a Adaptive) min() float64 {
	if a.Min == 0 {
		return a.Max / 100
	}
	return a.Min
}

func (a Adaptive) compile() (compiled, *RuleError) {
	bad := func(field, format string, args ...any) (compiled, *RuleError) {
		return compiled{}, badLimit(field, strings.ToLower(field), format, args...)
	}
	finite := func(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }
	start := a.Start
	if start == 0 {
		start = a.Max
	}
	burst := max(a.Burst, 1)
	switch {
	case !(a.Max > 0) || !finite(a.Max):
		return bad("Max", "must be a positive number, got %v", a.Max)
	case a.Per < time.Millisecond || a.Per > 365*24*time.Hour:
		return bad("Per", "must be between 1ms and 365 days, got %v", a.Per)
	case a.Min < 0 || !finite(a.Min) || a.Min > a.Max:
		return bad("Min", "must be between 0 and max (%v), got %v", a.Max, a.Min)
	case start < a.min() || start > a.Max || !finite(start):
		return bad("Start", "must be between min (%v) and max (%v), got %v", a.min(), a.Max, a.Start)
	case a.Burst < 0 || a.Burst > 1_000_000:
		return bad("Burst", "must be between 1 and 1000000, got %d", a.Burst)
	}
	p := learnParams{min: rateArg(a.min(), a.Per), max: rateArg(a.Max, a.Per), start: rateArg(start, a.Per), per: a.Per.Microseconds()}
	switch {
	case p.min < 1:
		return bad("Min", "must be at least one per 30 years, got %v per %v", a.min(), a.Per)
	case p.max > 1e6*learnScale:
		return bad("Max", "exceeds a million per second, got %v per %v", a.Max, a.Per)
	}
	return compiled{kind: kindGCRA, suffix: "adaptive", em: intervalOf(p.start), burst: int64(burst), learn: &p}, nil
}

// learned is an adaptive rule's state (learn.lua): the rate r and the last
// good rate g while probing (0: not probing), in billionths of a unit per
// second; the probe step s in millionths; when the next probe is due (n),
// the time of the last cut (d), the time busy time is counted from (w),
// the busy time at the current rate (a), all in µs; k, 1 after a good
// probe; h, the rate that was good before the limit fell (0: none), as r;
// c, 1 once the current rate was good for a dwell; m, 1 when the next
// probe is a step even below h (after a probe to h failed).
type learned struct{ r, g, s, n, d, w, a, k, h, c, m int64 }

// fresh is the state of a key with none.
func (p *learnParams) fresh(now int64) learned {
	return learned{r: p.start, s: learnStep0 * 1e6, w: now}
}

// intervalOf is the emission interval, in µs, of a rate in billionths of
// a unit per second: learn.lua's ad_em.
func intervalOf(r int64) int64 {
	return max(1, int64(math.Ceil(1e15/float64(r))))
}

// credit is learn.lua's ad_load with credit: the busy time since w (up
// to the TAT) is counted at the current rate.
func (p *learnParams) credit(s learned, now, tat int64) learned {
	if busy := min(now, tat) - s.w; busy > 0 {
		s.a += busy
	}
	s.w = max(s.w, now)
	return s
}

// grow is learn.lua's ad_grow: after a charge at now, a rate busy for a
// dwell is good (a probe that was is kept, and the next is due at once);
// then a due probe starts. Its units come after the TAT tat, so busy time
// counts for it from there.
func (p *learnParams) grow(s learned, now, tat int64) learned {
	if s.a < max(p.per/learnDwell, learnDwellUnits*intervalOf(s.r)) {
		return s
	}
	s.a, s.c = 0, 1
	if s.g > 0 {
		s.g, s.n = 0, now
		if s.k == 1 {
			s.s = min(learnStepMax*1e6, 2*s.s)
		}
		s.k = 1
		if s.r >= s.h {
			s.h = 0
		}
	}
	if now >= s.n && s.r < p.max {
		s.g, s.w, s.c = s.r, max(s.w, tat), 0
		up := min(p.max, int64(math.Floor(float64(s.r)*(1+float64(s.s)/1e6))))
		if s.m == 1 {
			s.m = 0
		} else {
			up = max(up, s.h)
		}
		s.r = up
	}
	return s
}

// hold is learn.lua's ad_hold: how long after a failure the next probe
// waits, µs: 24 P, or 8 P while a remembered rate is more than 10 %
// above the current one; at least 60 em.
func (p *learnParams) hold(s learned) int64 {
	h := int64(learnHold)
	if s.h*10 > s.r*11 {
		h = learnHoldBack
	}
	return max(h*p.per, learnHoldUnits*intervalOf(s.r))
}

// cut is learn.lua's ad_cut: the state after a Block at now until till,
// and whether it cut (rather than taking the block for the same event).
func (p *learnParams) cut(s learned, now, till int64) (learned, bool) {
	if s.d > 0 && now-s.d < learnCool {
		return s, false
	}
	c := int64(0)
	if s.g > 0 {
		if s.h > 0 && s.r >= s.h {
			// The level that was good before the limit fell is not yet.
			if s.h = int64(math.Floor(float64(s.h) * learnForget)); s.h <= s.g {
				s.h = 0
			}
			s.m = 1 // the next probe steps from the good rate
		}
		s.r, s.g = s.g, 0
		c = 1 // the last good rate was good for a dwell
		s.n = now + p.hold(s)
		if s.s > 2*learnStepMin*1e6 {
			s.n = now + p.per/learnDwell
		}
		s.s = max(learnStepMin*1e6, s.s/2)
	} else if s.c == 1 {
		// Good for a dwell: the limit fell, or the calls' jitter crossed
		// it. A small cut, the rate remembered (a little lower if it was
		// already), and small probes after the hold.
		if s.h = max(s.h, s.r); s.r >= s.h {
			s.h = int64(math.Floor(float64(s.r) * learnForget))
		}
		s.r = max(p.min, int64(math.Floor(float64(s.r)*learnNudge)))
		s.s, s.n = learnStepMin*1e6, now+p.hold(s)
	} else {
		// A rate not yet good: cut hard, and search up from there with
		// big steps after a dwell.
		s.r = max(p.min, int64(math.Floor(float64(s.r)*learnCut)))
		s.s, s.n = learnStep0*1e6, now+p.per/learnDwell
	}
	s.k, s.c, s.d, s.a, s.w = 0, c, now, 0, max(s.w, till)
	return s, true
}
