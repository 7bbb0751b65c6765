package quotas

import (
	"math"
	"time"

	"github.com/taskrl/taskrl/internal/units"
)

// Constants of the learning algorithm (see Adaptive); learn.lua has the
// same values. P is the rule's Per; em the interval of the current rate.
const (
	learnDwell      = 2                // a rate is good after P/learnDwell busy...
	learnDwellUnits = 4                // ... and at least this many em...
	learnDwellMore  = 16               // ... and this many em...
	learnDwellCap   = 4                // ... up to this many P
	learnHold       = 24               // P to the next probe after one failed at the smallest step...
	learnHoldUnits  = 100              // ... and at least this many em...
	learnHoldBack   = 8                // ... or, while a remembered rate is more than 10 % above, this many P...
	learnBackUnits  = 60               // ... and at least this many em
	learnStep0      = 0.25             // the first probe step...
	learnStepCut    = 0.2              // ... and after a hard cut
	learnStepJump   = 0.1              // ... and after the first probe kept at the smallest step
	learnStepMin    = 0.02             // the smallest probe step
	learnStepMax    = 1.0              // the largest probe step
	learnStepFail   = 4                // a failed probe divides the step by this
	learnCut        = 0.7              // a throttle at a rate not yet good cuts it to this share...
	learnNudge      = 0.97             // ... at a rate good for a dwell to this one...
	learnNudgeAgain = 0.9              // ... or this one if it was nudged within the hold, no probe since
	learnForget     = 0.97             // a failed probe at the remembered rate lowers it by this share
	learnCool       = 1000000          // µs: throttles within this of a cut are one event
	learnScale      = units.LearnScale // rates are stored in billionths of a unit per second
	learnTTL        = 24 * time.Hour
	learnExcess     = 5 // a probe is good once it also passed this many units above the good rate (x if more)...
	learnExcessBack = 4 // ... or was busy for this many P while a remembered rate is more than 10 % above...
	learnExcessNext = 5 // ... or this many P after a kept probe, else the hold
)

// learnParams are an adaptive rule's bounds in the units the script takes:
// rates in billionths of a unit per second, Per in µs.
type learnParams struct {
	min, max, start, per int64
}

// compileAdaptive compiles a valid Adaptive limit: a GCRA whose interval
// is learned.
func compileAdaptive(a Adaptive) compiled {
	p := learnParams{min: units.LearnRate(a.MinRate(), a.Per), max: units.LearnRate(a.Max, a.Per), start: units.LearnRate(a.StartRate(), a.Per), per: a.Per.Microseconds()}
	return compiled{kind: kindGCRA, suffix: "adaptive", em: intervalOf(p.start), burst: int64(max(a.Burst, 1)), learn: &p}
}

// learned is an adaptive rule's state (learn.lua): the rate r and the last
// good rate g while probing (0: not probing), in billionths of a unit per
// second; the probe step s in millionths; when the next probe is due (n;
// while probing, when its units start), the time of the last cut (d), the
// time busy time is counted from (w), the busy time at the current rate
// (a), all in µs; k, 1 after a good probe; h, the rate that was good
// before the limit fell (0: none), as r; c, 1 once the current rate was
// good for a dwell; m, 1 when the next probe is a step even below h
// (after a probe to h failed), 2 after a nudge until the next probe; x,
// the most units above the good rate a failed probe passed before its
// throttle, in thousandths (the vendor's burst, as far as seen).
type learned struct{ r, g, s, n, d, w, a, k, h, c, m, x int64 }

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
// dwell is good (a probe that was, and that passed learnExcess units more
// than the good rate in it, or x thousandths if more, or was busy for
// excessWait, is kept, and the next is due at once: two kept in a row
// double the step, the first kept at the smallest step makes it
// learnStepJump, as a limit that rose calls for); then a due probe
// starts: a step up, or straight to the remembered rate h once the hold
// has passed since the last cut (unless the last probe to it failed;
// before, a kept step had the next probe go to h at once, and at 0.5/s
// after a fall from 2/s each drew a 429). Its units come after the TAT
// tat, so busy time counts for it from there.
func (p *learnParams) grow(s learned, now, tat int64) learned {
	if s.a < p.dwell(s.r) {
		return s
	}
	if s.g > 0 && s.a < p.excessWait(s) && s.excess() < max(learnExcess, float64(s.x)/1e3) {
		return s
	}
	s.a, s.c = 0, 1
	if s.g > 0 {
		s.g, s.n = 0, now
		if s.k == 1 {
			s.s = min(learnStepMax*1e6, 2*s.s)
		} else if s.s <= learnStepMin*1e6 {
			s.s = learnStepJump * 1e6
		}
		s.k = 1
		if s.r >= s.h {
			s.h = 0
		}
	}
	if now >= s.n && s.r < p.max {
		start := max(s.w, tat)
		s.g, s.w, s.n, s.c = s.r, start, start, 0
		up := min(p.max, int64(math.Floor(float64(s.r)*(1+float64(s.s)/1e6))))
		if s.m != 1 && now >= s.d+p.hold(s) {
			up = max(up, s.h)
		}
		s.r, s.m = up, 0
	}
	return s
}

// excess is learn.lua's ad_excess: the units a probe passed above the
// good rate g, busy at rate r for a.
func (s learned) excess() float64 {
	return float64(s.a) * float64(s.r-s.g) / 1e15
}

// dwell is learn.lua's ad_dwell: the busy time, µs, that makes rate r
// good: the longest of P/2, 4 em and 16 em up to 4 P. A vendor's burst,
// refilled while a block (most often a whole second) held the calls, lets
// a rate above its limit through for a while after it, and with a dwell
// of 4 em every 429 found a rate good for a dwell and only nudged it: a
// vendor down from 10/s to 2.5/s, burst 5, saw 6.8/s learned, then 4.2/s
// 40 s later, a 429 every 2 to 3 s. The cap (4 P) leaves the dwell below
// 4 units per P as it was, and the climb from there no slower.
func (p *learnParams) dwell(r int64) int64 {
	em := intervalOf(r)
	return max(p.per/learnDwell, learnDwellUnits*em, min(learnDwellMore*em, learnDwellCap*p.per))
}

// hold is learn.lua's ad_hold: how long after a failure the next probe
// waits, µs: 24 P and at least 100 em (a failed probe a hold costs at
// most 1 % of the calls: at 2/s, 60 em was 1.7 %, and with the 429s of
// the start most of a 3-minute run's 2 %), or 8 P and at least 60 em
// while a remembered rate is more than 10 % above the current one.
func (p *learnParams) hold(s learned) int64 {
	if s.h*10 > s.r*11 {
		return max(learnHoldBack*p.per, learnBackUnits*intervalOf(s.r))
	}
	return max(learnHold*p.per, learnHoldUnits*intervalOf(s.r))
}

// excessWait is learn.lua's ad_excess_wait: the busy time, µs, after
// which a probe that has not yet passed learnExcess units (x if more)
// above the good rate is good all the same: 4 P while a remembered rate
// is more than 10 % above the current one (so that probes back to it stay
// as frequent), 5 P right after a kept probe (so that a limit that rose is
// followed sooner: from 5/s, each 2 % probe waited the hold, 24 s, for
// its 5 units), the hold otherwise.
func (p *learnParams) excessWait(s learned) int64 {
	if s.h*10 > s.r*11 {
		return learnExcessBack * p.per
	}
	if s.k == 1 {
		return learnExcessNext * p.per
	}
	return p.hold(s)
}

// cut is learn.lua's ad_cut: the state after a Block at now until till of
// a call decided at decided (0: unknown), and whether it cut (rather than
// taking the block for the same congestion: a call decided before the
// last cut, or, undated, within learnCool of it).
func (p *learnParams) cut(s learned, now, till, decided int64) (learned, bool) {
	if s.d > 0 && (decided > 0 && decided < s.d || decided == 0 && now-s.d < learnCool) {
		return s, false
	}
	c := int64(0)
	if s.g > 0 && now < s.n {
		// The probe's units have not gone out yet: the throttle is the
		// good rate's, good for a dwell.
		s.r, s.g, s.c = s.g, 0, 1
	}
	if s.g > 0 {
		s.x = max(s.x, int64(math.Floor(s.excess()*1e3)))
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
		s.s = max(learnStepMin*1e6, s.s/learnStepFail)
	} else if s.c == 1 && (s.d > 0 || s.k == 1) {
		// Good for a dwell: the limit fell, or the calls' jitter crossed
		// it. A small cut, the rate remembered (a little lower if it was
		// already), and small probes after the hold. Nudged already
		// within the hold, with no probe since, the rate is above the
		// limit, not at it (a vendor's burst made it look good): a larger
		// cut.
		if s.h = max(s.h, s.r); s.r >= s.h {
			s.h = int64(math.Floor(float64(s.r) * learnForget))
		}
		f := learnNudge
		if s.m == 2 && now < s.n {
			f = learnNudgeAgain
		}
		s.r = max(p.min, int64(math.Floor(float64(s.r)*f)))
		s.s, s.n = learnStepMin*1e6, now+p.hold(s)
		if s.m == 0 {
			s.m = 2
		}
	} else {
		// A rate not yet good, or the start before any cut or kept probe
		// (never measured: a vendor's burst can make a start far above
		// its limit look good, and remembered it drew a 429 every other
		// probe): cut hard, and search up from there with big steps after
		// a dwell.
		s.r = max(p.min, int64(math.Floor(float64(s.r)*learnCut)))
		s.s, s.n = learnStepCut*1e6, now+p.per/learnDwell
	}
	s.k, s.c, s.d, s.a, s.w = 0, c, now, 0, max(s.w, till)
	return s, true
}
