package estimate_test

import (
	"fmt"
	"time"

	"github.com/taskrl/taskrl/cmd/internal/estimate"
	"github.com/taskrl/taskrl/policy"
)

// A backfill of 400 tasks under a window of 190 per 10 s: 190 run now, 190
// after the first reset and 20 after the second.
func ExampleRun() {
	p, err := policy.Parse([]byte(`
rules:
  - name: vendor-window
    match: {type: "http:call"}
    quota: {limit: 190, every: 10s}
`))
	if err != nil {
		panic(err)
	}
	rep, err := estimate.Run(p, estimate.Campaign{
		Type: "http:call", Queue: "default", N: 400,
		Payload: func(i int) []byte { return fmt.Appendf(nil, `{"business_id":"b%d"}`, i%3+1) },
	}, estimate.Options{Start: time.Date(2026, 5, 4, 9, 0, 0, 0, time.UTC)})
	if err != nil {
		panic(err)
	}
	fmt.Println(rep.Binding, estimate.FormatDuration(rep.Duration), rep.End.Format(time.TimeOnly))
	// Output: vendor-window 20.00s 09:00:20
}
