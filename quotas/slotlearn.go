package quotas

import "math"

// Adaptive concurrency rules (limits.Concurrency with Adaptive): the Go
// mirror of rules.lua's cl_load and cl_sample, operation for operation on
// float64 as Lua computes on doubles, so that the model and the script
// learn the same numbers (TestDifferentialSlotLearning). The model keeps
// the state for good where the script's key lives a day after its last
// change.

// slotLearned is the learned state of one adaptive concurrency key: the
// limit l in millionths of a slot, the no-load latency b (µs, 0: none),
// the recent latency ratio q (millionths), h, until when calls that
// started decrease l no further (µs), s, 1 until the first decrease, and
// m, l before the last decrease.
type slotLearned struct{ l, b, q, h, s, m float64 }

// slotStart is the state of a key that learned nothing yet.
func slotStart(amin int64) slotLearned {
	return slotLearned{l: float64(amin) * 1e6, q: 1e6, s: 1}
}

// slots is the number of slots st allows, between amin and amax.
func (st slotLearned) slots(amin, amax int64) int64 {
	return max(amin, min(amax, int64(math.Floor(st.l/1e6))))
}

// sample mirrors cl_sample: st after a call answered at now after lat µs,
// over when it reported overload (lat 0 without over: no call, which the
// caller does not sample), with inflight slots held then, its own
// included.
func (st slotLearned) sample(amin, amax, lat int64, over bool, inflight, now int64) slotLearned {
	b, q, h, s, m := st.b, st.q, st.h, st.s, st.m
	// Within the bounds (they may have changed since it was stored).
	l := math.Max(float64(amin)*1000000, math.Min(float64(amax)*1000000, st.l))
	cut := 0.0
	if over {
		cut = 0.7
	} else {
		latf := float64(lat)
		switch {
		case b == 0:
			b = latf
		case latf < b:
			b = b - math.Floor((b-latf)*0.1)
		case l <= float64(amin)*1000000 && q >= 1500000:
			b = b + math.Floor((latf-b)*0.1)
		}
		q = q + math.Floor((math.Floor(latf*1000000/b)-q)*0.2)
		if q >= 1500000 {
			cut = math.Max(0.5, math.Min(0.9, 1300000/q))
		} else if q <= 1200000 && float64(inflight)*2000000 >= l {
			if s == 1 {
				l = l + 1000000
			} else {
				// A quarter slot per l calls, faster the further above m.
				l = l + math.Floor(2.5e11*math.Max(1, math.Floor((l-m)/1000000)+1)/l)
			}
			l = math.Min(l, float64(amax)*1000000)
		}
	}
	if cut > 0 && float64(now-lat) >= h {
		m = l
		l = math.Max(float64(amin)*1000000, math.Min(l-1000000, math.Floor(l*cut)))
		s, h = 0, float64(now)+math.Floor(b*q/1000000)
	}
	return slotLearned{l, b, q, h, s, m}
}
