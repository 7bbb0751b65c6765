package gcra

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/taskrl/taskrl/internal/units"
)

// maxSpan bounds every duration the arithmetic handles (tolerance, reserve
// horizon).
const maxSpan = units.MaxSpan

// maxTime is the largest explicit time, in Unix microseconds, a limiter accepts.
const maxTime = 1 << 51

// Limit is a GCRA limit: Rate events per Period, with Burst of them allowed at
// once from idle. The emission interval T = Period/Rate is the spacing between
// events once the burst is spent.
//
// The zero value is invalid; build one with PerSecond, PerMinute, PerHour,
// PerDay or a struct literal, and check it with Validate (every limiter call
// does). Limit is a plain value, safe to copy and share.
type Limit struct {
	// Rate is the number of events per Period. Fractions are allowed
	// (Rate 1.8, Period 1s); it must be positive and finite.
	Rate float64
	// Period is the window Rate is counted over. It must be positive.
	Period time.Duration
	// Burst is how many events may happen at once from idle, at least 1.
	// A single request may cost at most Burst.
	Burst int
}

// PerSecond returns a limit of rate events per second with a burst of rate.
func PerSecond(rate int) Limit { return Limit{Rate: float64(rate), Period: time.Second, Burst: rate} }

// PerMinute returns a limit of rate events per minute with a burst of rate.
func PerMinute(rate int) Limit { return Limit{Rate: float64(rate), Period: time.Minute, Burst: rate} }

// PerHour returns a limit of rate events per hour with a burst of rate.
func PerHour(rate int) Limit { return Limit{Rate: float64(rate), Period: time.Hour, Burst: rate} }

// PerDay returns a limit of rate events per 24 hours with a burst of rate.
func PerDay(rate int) Limit { return Limit{Rate: float64(rate), Period: 24 * time.Hour, Burst: rate} }

// String formats the limit as "RATE/PERIOD burst B", for example
// "18/1s burst 3".
func (l Limit) String() string {
	return strconv.FormatFloat(l.Rate, 'g', -1, 64) + "/" + l.Period.String() + " burst " + strconv.Itoa(l.Burst)
}

// Validate reports why l cannot be used, or nil. It checks that Rate is
// positive and finite, Period positive, Burst at least 1, the emission
// interval at least one microsecond, and Burst×interval at most about 35 years.
func (l Limit) Validate() error {
	_, err := l.interval()
	return err
}

// Interval returns the emission interval T = Period/Rate as the limiter uses
// it: whole microseconds, rounded up when Period/Rate is not a whole number of
// microseconds, so the enforced rate never exceeds Rate. It returns 0 for an
// invalid limit.
func (l Limit) Interval() time.Duration {
	t, err := l.interval()
	if err != nil {
		return 0
	}
	return time.Duration(t) * time.Microsecond
}

// interval validates l and returns T in microseconds.
func (l Limit) interval() (int64, error) {
	t, reason := units.Interval(l.Rate, l.Period, l.Burst)
	if reason != "" {
		return 0, &LimitError{Limit: l, Reason: reason}
	}
	return t, nil
}

// LimitError says why a Limit is invalid.
type LimitError struct {
	Limit  Limit
	Reason string
}

// Error implements error.
func (e *LimitError) Error() string {
	return fmt.Sprintf("gcra: invalid limit %s: %s", e.Limit, e.Reason)
}

// ErrInvalidCost is returned (wrapped) for a negative cost.
var ErrInvalidCost = errors.New("gcra: cost must not be negative")
