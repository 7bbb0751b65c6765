package gcra

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestLimitValidate(t *testing.T) {
	bad := map[string]Limit{
		"rate must be a positive number":    {Rate: 0, Period: time.Second, Burst: 1},
		"rate must be a positive number ":   {Rate: -1, Period: time.Second, Burst: 1},
		"rate must be a positive number  ":  {Rate: math.NaN(), Period: time.Second, Burst: 1},
		"rate must be a positive number   ": {Rate: math.Inf(1), Period: time.Second, Burst: 1},
		"period must be positive":           {Rate: 1, Period: 0, Burst: 1},
		"period must be positive ":          {Rate: 1, Period: -time.Second, Burst: 1},
		"burst must be at least 1":          {Rate: 1, Period: time.Second, Burst: 0},
		"below one microsecond":             {Rate: 2e6, Period: time.Second, Burst: 1},
		"exceeds 35 years":                  {Rate: 1, Period: 24 * time.Hour, Burst: 20000},
	}
	for want, l := range bad {
		err := l.Validate()
		var le *LimitError
		if !errors.As(err, &le) || !strings.Contains(err.Error(), strings.TrimSpace(want)) {
			t.Errorf("%v.Validate() = %v, want LimitError containing %q", l, err, want)
		}
		if l.Interval() != 0 {
			t.Errorf("%v.Interval() = %v, want 0 for an invalid limit", l, l.Interval())
		}
	}
	for _, l := range []Limit{PerSecond(1), PerMinute(60), PerHour(3600), PerDay(10000), {Rate: 1.8, Period: time.Second, Burst: 1}, {Rate: 1e6, Period: time.Second, Burst: 1}} {
		if err := l.Validate(); err != nil {
			t.Errorf("%v.Validate() = %v", l, err)
		}
	}
}

func TestLimitInterval(t *testing.T) {
	cases := []struct {
		l    Limit
		want time.Duration
	}{
		{PerSecond(200), 5 * time.Millisecond},
		{PerSecond(3), 333334 * time.Microsecond}, // rounded up: never faster than the rate
		{Limit{Rate: 18, Period: time.Second, Burst: 3}, 55556 * time.Microsecond},
		{Limit{Rate: 0.1, Period: time.Second, Burst: 1}, 10 * time.Second}, // no spurious rounding up
		{Limit{Rate: 1.8, Period: time.Second, Burst: 1}, 555556 * time.Microsecond},
		{PerDay(10000), 8640 * time.Millisecond},
	}
	for _, c := range cases {
		if got := c.l.Interval(); got != c.want {
			t.Errorf("%v.Interval() = %v, want %v", c.l, got, c.want)
		}
	}
}

func TestLimitString(t *testing.T) {
	if got := (Limit{Rate: 1.8, Period: time.Second, Burst: 1}).String(); got != "1.8/1s burst 1" {
		t.Errorf("String() = %q", got)
	}
	if got := PerMinute(30).String(); got != "30/1m0s burst 30" {
		t.Errorf("String() = %q", got)
	}
}
