package quotas

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Adaptive is a GCRA limit whose rate is learned, for the whole fleet, in
// the rule's own state: it starts at Start (default Max), is lowered by
// Limiter.Block (the remote side throttled a call: the rate was too high)
// and raised while requests are admitted, always between Min and Max per
// Per. Burst (default 1) is the burst of the GCRA at every rate. The rate
// lives in Redis beside the rule's TAT, so every worker sees one learned
// rate and it survives their restarts (a key idle for a day starts at
// Start again).
//
// The algorithm, in units of Per (P) and of the rate c at the last cut:
//
//   - Cut. A Block lowers the rate to 0.9 of what it was (to 0.6 when the
//     previous cut was less than 4 P ago: the limit fell further than one
//     step), and remembers that rate as c. Blocks less than a second after
//     a cut are the same congestion event (the answers to the calls that
//     were in flight together) and change nothing.
//   - Recovery. Below 0.95 c the rate climbs back by 0.1 c per P of
//     admitted traffic: in about half a P after the block.
//   - Probe. From 0.95 c it creeps up by 0.003 c per P, reaching c again
//     after about 17 P; the remote side's limit is usually near c, so a
//     cut happens about every 20 P, each costing the block the remote side
//     asks for.
//   - Climb. With no cut yet, or 20 P after the last one, it grows by 30 %
//     per P (compounded per request): a limit that was raised is found in
//     seconds, a start far below the limit climbs tenfold in about 8 P.
//
// Growth is counted in admitted units (each unit counts its emission
// interval), so an idle rule does not creep up on no evidence. A refund
// does not undo growth: on Redis Cluster, a set whose rules span slots and
// that one slot denies may have grown an adaptive rule in another slot by
// the request's units. A Set with
// an adaptive rule should book at most a few seconds ahead (see
// Limiter.Reserve): a booking keeps the rate it was made at.
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
// same values.
const (
	learnCut     = 0.9     // cut to this share of the rate
	learnCutDeep = 0.6     // ... when the last cut was recent
	learnAgain   = 4       // P: a cut within this of the last is "recent"
	learnCool    = 1000000 // µs: blocks within this of a cut are one event
	learnNear    = 0.95    // share of c where recovery ends and probing starts
	learnFast    = 0.1     // recovery: c per P
	learnProbe   = 0.003   // probe: c per P
	learnHold    = 20      // P after a cut before climbing
	learnClimb   = 0.3     // climb: share of the rate per P
	learnScale   = 1e9     // rates are stored in billionths of a unit per second
	learnTTL     = 24 * time.Hour
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

// learned is an adaptive rule's state: the rate r, the rate c at the last
// cut (0: none), both in billionths of a unit per second, and the time d
// of the last cut (µs, 0: none).
type learned struct{ r, c, d int64 }

// intervalOf is the emission interval, in µs, of a rate in billionths of
// a unit per second: learn.lua's ad_em.
func intervalOf(r int64) int64 {
	return max(1, int64(math.Ceil(1e15/float64(r))))
}

// grow is learn.lua's ad_grow: the state after n units admitted at now
// with the rule's interval em.
func (p *learnParams) grow(s learned, n, em, now int64) learned {
	per := float64(p.per)
	span := float64(n*em) / per // P of traffic these units stand for
	r, c := float64(s.r), float64(s.c)
	switch {
	case s.c == 0 || now-s.d >= learnHold*p.per:
		r = r + r*(learnClimb*span)
	case r < learnNear*c:
		r = math.Min(learnNear*c, r+c*(learnFast*span))
	default:
		r = r + c*(learnProbe*span)
	}
	s.r = min(p.max, max(p.min, int64(math.Floor(r))))
	return s
}

// cut is learn.lua's ad_cut: the state after a Block at now.
func (p *learnParams) cut(s learned, now int64) learned {
	if s.d > 0 && now-s.d < learnCool {
		return s
	}
	f := learnCut
	if s.d > 0 && now-s.d < learnAgain*p.per {
		f = learnCutDeep
	}
	s.c, s.d = s.r, now
	s.r = max(p.min, int64(math.Floor(float64(s.r)*f)))
	return s
}
