// Package ideal computes, from the limits alone, the earliest schedule a
// list of calls could run on: the yardstick the end-to-end tests measure
// the limiter against. It shares no code with the limiter (gcra, quotas,
// the scripts or the estimator): only the definitions of the limits.
//
// The schedule is greedy, earliest first: of the calls not yet scheduled,
// the one that can start soonest (not before it arrives, with every limit
// admitting it given the calls already scheduled) starts then; of calls
// that can start at the same time, the one whose key has the most calls
// left goes first (so that no key is left to finish alone at its own
// rate), then the earlier call. Calls take no time. As every call starts no earlier
// than the one before it, a GCRA limit is the textbook virtual scheduling
// algorithm: a call may start at t when max(TAT, t) + T <= t + Burst*T, and
// moves the TAT to max(TAT, t) + T.
//
// Example and test support, imported by examples/quickstart and cmd/internal/e2e.
package ideal

import (
	"math"
	"time"
)

// Limit is a GCRA rate: Rate calls per Period, Burst at once from idle.
// Its fields are gcra.Limit's, so one converts to the other; the emission
// interval is taken as the limits define it, Period/Rate in whole
// microseconds rounded up (so the rate is never exceeded), computed here.
type Limit struct {
	Rate   float64
	Period time.Duration
	Burst  int
}

// interval is the emission interval in microseconds.
func (l Limit) interval() int64 {
	return int64(math.Ceil(float64(l.Period.Microseconds()) / l.Rate))
}

// Rule is one limit: a GCRA rate, or Limit calls per fixed window of length
// Every aligned to the Unix epoch. Keyed makes it one limit per Call.Key.
type Rule struct {
	GCRA  Limit
	Limit int
	Every time.Duration
	Keyed bool
}

// Call is one call to schedule: it may not start before At; Key is the
// entity keyed rules limit it under (a business id).
type Call struct {
	At  time.Time
	Key string
}

// Schedule returns the start time of each call, in the calls' order.
func Schedule(rules []Rule, calls []Call) []time.Time {
	type state struct {
		tat  map[string]int64
		wins map[string]map[int64]int
	}
	st := make([]state, len(rules))
	for i := range st {
		st[i] = state{tat: map[string]int64{}, wins: map[string]map[int64]int{}}
	}
	key := func(r Rule, c Call) string {
		if r.Keyed {
			return c.Key
		}
		return ""
	}
	// earliest is the first time >= t at which rule i admits call c.
	earliest := func(i int, c Call, t int64) int64 {
		r, k := rules[i], key(rules[i], c)
		if r.Limit > 0 {
			every := r.Every.Microseconds()
			for st[i].wins[k][t/every] >= r.Limit {
				t = (t/every + 1) * every
			}
			return t
		}
		em := r.GCRA.interval()
		if tat, ok := st[i].tat[k]; ok {
			return max(t, tat+em-int64(r.GCRA.Burst)*em)
		}
		return t
	}
	out := make([]time.Time, len(calls))
	done := make([]bool, len(calls))
	left := map[string]int{}
	for _, c := range calls {
		left[c.Key]++
	}
	for range calls {
		best, bestAt := -1, int64(0)
		for j, c := range calls {
			if done[j] {
				continue
			}
			t := c.At.UnixMicro()
			for {
				nt := t
				for i := range rules {
					nt = max(nt, earliest(i, c, nt))
				}
				if nt == t {
					break
				}
				t = nt
			}
			if best < 0 || t < bestAt || t == bestAt && left[c.Key] > left[calls[best].Key] {
				best, bestAt = j, t
			}
		}
		done[best] = true
		left[calls[best].Key]--
		out[best] = time.UnixMicro(bestAt)
		for i, r := range rules {
			k := key(r, calls[best])
			if r.Limit > 0 {
				w := st[i].wins[k]
				if w == nil {
					w = map[int64]int{}
					st[i].wins[k] = w
				}
				w[bestAt/r.Every.Microseconds()]++
				continue
			}
			em := r.GCRA.interval()
			tat, ok := st[i].tat[k]
			if !ok || tat < bestAt {
				tat = bestAt
			}
			st[i].tat[k] = tat + em
		}
	}
	return out
}

// Last returns the latest of ts.
func Last(ts []time.Time) time.Time {
	var last time.Time
	for _, t := range ts {
		if t.After(last) {
			last = t
		}
	}
	return last
}
