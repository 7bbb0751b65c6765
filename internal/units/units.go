// Package units converts limits into the integer units the engine's
// arithmetic takes, on both sides of the Redis boundary: emission intervals
// in whole microseconds (package gcra, quotas' GCRA rules and the
// validation in package limits) and learned rates in billionths of a unit
// per second (adaptive rules). It imports nothing of the module.
package units

import (
	"math"
	"time"
)

// MaxSpan bounds every duration the arithmetic handles (tolerance, reserve
// horizon, Burst intervals): 2^50 µs, about 35 years. With times below
// 2^51 µs (year 2041) all sums stay below 2^53, where Lua's doubles are
// still exact integers.
const MaxSpan = 1 << 50

// Interval returns the emission interval Period/Rate in whole microseconds,
// rounded up when it is not a whole number of them (so that the enforced
// rate never exceeds rate), or a reason why the limit is invalid, in the
// order the checks run: the rate, the period, the burst, an interval below
// a microsecond, Burst intervals beyond MaxSpan.
func Interval(rate float64, period time.Duration, burst int) (int64, string) {
	switch {
	case math.IsNaN(rate) || math.IsInf(rate, 0) || rate <= 0:
		return 0, "rate must be a positive number"
	case period <= 0:
		return 0, "period must be positive"
	case burst < 1:
		return 0, "burst must be at least 1"
	}
	q := float64(period.Microseconds()) / rate
	if q < 1-1e-9 {
		return 0, "period/rate is below one microsecond"
	}
	t := math.Round(q)
	if math.Abs(q-t) > 1e-9*q {
		t = math.Ceil(q)
	}
	if t*float64(burst) > MaxSpan {
		return 0, "burst × period/rate exceeds 35 years"
	}
	return int64(t), ""
}

// LearnScale is the scale of learned rates: billionths of a unit per
// second.
const LearnScale = 1e9

// LearnRate converts a rate per p into billionths of a unit per second,
// rounded down.
func LearnRate(rate float64, p time.Duration) int64 {
	return int64(math.Floor(rate * LearnScale * float64(time.Second) / float64(p)))
}
