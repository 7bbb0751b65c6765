package limits_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/taskrl/taskrl/limits"
)

// Validate checks rules before they reach Redis; a *RuleError names the
// rule and the field at fault.
func ExampleValidate() {
	err := limits.Validate(
		limits.Rule{Name: "vendor", Limit: limits.GCRA{Rate: 10, Period: time.Second, Burst: 10}},
		limits.Rule{Name: "daily", Limit: limits.CalendarWindow{Limit: 10000, Cron: "0 0 * * *", TZ: "Mars/Base"}},
	)
	var re *limits.RuleError
	if errors.As(err, &re) {
		fmt.Printf("rule %s, field %s\n", re.Rule, re.Field)
	}
	fmt.Println(limits.Validate(limits.Rule{Name: "a", Limit: limits.FixedWindow{Limit: 5, Every: time.Minute}}))
	// Output:
	// rule daily, field TZ
	// <nil>
}

// Every limit describes itself for logs and errors.
func ExampleLimit() {
	for _, l := range []limits.Limit{
		limits.GCRA{Rate: 18, Period: time.Second, Burst: 3},
		limits.Adaptive{Max: 50, Per: time.Second},
		limits.SlidingWindow{Limit: 100, Every: time.Minute},
		limits.Concurrency{Max: 8, Lease: 30 * time.Second},
	} {
		fmt.Println(l)
	}
	// Output:
	// 18/1s burst 3 (GCRA)
	// learned 0.5-50 per 1s (adaptive)
	// 100 per 1m0s (sliding window)
	// 8 at once, lease 30s (concurrency)
}
