package fakeapi

import (
	"errors"
	"math"
	"time"
)

// Limit is a GCRA rate as a vendor publishes it: Rate requests per Period,
// Burst of them at once from idle, then one every Period/Rate. The zero
// Limit disables a limit. The API enforces it with arithmetic of its own,
// in nanoseconds (tats), not with package gcra: it judges the limiter,
// so it must not share its code. Its fields are gcra.Limit's, so either
// converts to the other.
type Limit struct {
	Rate   float64
	Period time.Duration
	Burst  int
}

// Validate reports why l cannot be enforced, or nil.
func (l Limit) Validate() error {
	switch {
	case math.IsNaN(l.Rate) || math.IsInf(l.Rate, 0) || l.Rate <= 0:
		return errors.New("rate must be a positive number")
	case l.Period <= 0:
		return errors.New("period must be positive")
	case l.Burst < 1:
		return errors.New("burst must be at least 1")
	case l.interval() < 1:
		return errors.New("period/rate must be at least a nanosecond")
	}
	return nil
}

// interval is the emission interval Period/Rate.
func (l Limit) interval() time.Duration { return time.Duration(float64(l.Period) / l.Rate) }

// tats is the state of one GCRA limit over keys: each key's theoretical
// arrival time, Unix ns. The textbook virtual scheduling algorithm: a request of
// cost n at now is admitted iff max(tat, now) + n·T − Burst·T <= now, and
// then tat becomes max(tat, now) + n·T. The zero value is empty.
type tats map[string]int64

// allow admits a request of cost n for key at now under l: undo gives the
// charge back exactly (nothing else may change the key meanwhile). When
// it is denied, undo is nil and retry is how long until it would be
// admitted.
func (s *tats) allow(now time.Time, key string, l Limit, n int) (undo func(), retry time.Duration) {
	if *s == nil {
		*s = tats{}
	}
	prev, had := (*s)[key]
	t, T := now.UnixNano(), int64(l.interval())
	next := max(prev, t) + int64(n)*T
	if at := next - int64(l.Burst)*T; at > t {
		return nil, time.Duration(at - t)
	}
	(*s)[key] = next
	return func() {
		if had {
			(*s)[key] = prev
		} else {
			delete(*s, key)
		}
	}, 0
}

// giveBack returns n units of key's charges at now (a request that cost
// less than it asked): its tat moves back n·T, never before now.
func (s *tats) giveBack(now time.Time, key string, l Limit, n int) {
	tat, ok := (*s)[key]
	if !ok {
		return
	}
	(*s)[key] = max(tat-int64(n)*int64(l.interval()), now.UnixNano())
}
