package estimate

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/taskrl/taskrl/policy"
)

func parse(t *testing.T, yaml string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// roundRobin returns payloads {"business_id": "b<i%k+1>"}.
func roundRobin(k int) func(int) []byte {
	return func(i int) []byte { return fmt.Appendf(nil, `{"url":"http://x","business_id":"b%d"}`, i%k+1) }
}

// epoch10 is a start on a 10-second (and 1-minute) boundary.
var epoch10 = time.Date(2026, 5, 4, 9, 0, 0, 0, time.UTC)

func run(t *testing.T, p *policy.Policy, n int, payload func(int) []byte, opt Options) *Report {
	t.Helper()
	if opt.Start.IsZero() {
		opt.Start = epoch10
	}
	r, err := Run(p, Campaign{Type: "http:call", Queue: "default", N: n, Payload: payload}, opt)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func check(t *testing.T, r *Report, want time.Duration, binding string) {
	t.Helper()
	if r.Duration != want {
		t.Errorf("duration %s, want %s", r.Duration, want)
	}
	if !r.End.Equal(r.Start.Add(want)) {
		t.Errorf("end %s, want start + %s", r.End, want)
	}
	if r.Binding != binding {
		t.Errorf("binding rule %q, want %q", r.Binding, binding)
	}
}

func TestGCRA(t *testing.T) {
	// 10 at once, then one every 10ms: task 999 starts at 990 × 10ms.
	p := parse(t, `
rules:
  - name: vendor-peak
    match: {type: "http:call"}
    gcra: {rate: 100, per: 1s, burst: 10}
`)
	r := run(t, p, 1000, roundRobin(1), Options{})
	check(t, r, 9900*time.Millisecond, "vendor-peak")
	if got := r.Rules[0]; got.Alone != r.Duration || got.Keys != 1 || got.Limit != "100/1s burst 10 (GCRA)" {
		t.Errorf("rule report %+v", got)
	}
	if got := FormatDuration(r.Duration); got != "9.90s" {
		t.Errorf("FormatDuration = %q", got)
	}
}

// perBusiness holds each business to 1/s burst 1.
const perBusiness = `
rules:
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 1, per: 1s, burst: 1}
`

func TestPerBusiness(t *testing.T) {
	// 20 businesses × 20 tasks at 1/s per business: each business's last
	// task starts after 19 s, whatever the order.
	p := parse(t, perBusiness)
	r := run(t, p, 400, roundRobin(20), Options{})
	check(t, r, 19*time.Second, "per-business")
	if got := r.Rules[0]; got.Keys != 20 || got.Alone != r.Duration {
		t.Errorf("rule report %+v", got)
	}
	// Grouped by business instead of round robin: the same.
	r = run(t, p, 400, func(i int) []byte { return fmt.Appendf(nil, `{"business_id":"b%d"}`, i/20) }, Options{})
	check(t, r, 19*time.Second, "per-business")
}

func TestFixedWindow(t *testing.T) {
	p := parse(t, `
rules:
  - name: vendor-window
    match: {type: "http:call"}
    quota: {limit: 190, every: 10s}
`)
	// 190 now, 190 at the first reset, 20 at the second.
	r := run(t, p, 400, roundRobin(3), Options{})
	check(t, r, 20*time.Second, "vendor-window")
	// Starting 3 s into a window: the resets come 7 s and 17 s later.
	r = run(t, p, 400, roundRobin(3), Options{Start: epoch10.Add(3 * time.Second)})
	check(t, r, 17*time.Second, "vendor-window")
	// Exactly 380: one reset.
	r = run(t, p, 380, roundRobin(3), Options{})
	check(t, r, 10*time.Second, "vendor-window")
}

func TestWindowDominatesGCRA(t *testing.T) {
	// The GCRA spaces each window's 190 tasks over 1.8 s; the window then
	// holds the rest until the next reset. The last task starts 100 ms
	// after the second reset (a burst of 10, then 10 ms apart). Alone, the
	// GCRA would take 3.9 s and the window 20 s: the window binds.
	p := parse(t, `
rules:
  - name: vendor-peak
    match: {type: "http:call"}
    gcra: {rate: 100, per: 1s, burst: 10}
  - name: vendor-window
    match: {type: "http:call"}
    quota: {limit: 190, every: 10s}
`)
	r := run(t, p, 400, roundRobin(1), Options{})
	check(t, r, 20100*time.Millisecond, "vendor-window")
	if a, b := r.Rules[0].Alone, r.Rules[1].Alone; a != 3900*time.Millisecond || b != 20*time.Second {
		t.Errorf("alone: GCRA %s, window %s; want 3.9s, 20s", a, b)
	}
}

func TestBindingPerBusinessOverGlobal(t *testing.T) {
	// 2 businesses at 1/s each under a global 10/s: b1 at 0, 1, 2, ...;
	// b2 100 ms later each time. The last task (b2) starts at 9.1 s.
	// Alone, the global rule would take 1.9 s and the per-business one 9 s.
	p := parse(t, `
rules:
  - name: global
    match: {type: "http:call"}
    gcra: {rate: 10, per: 1s, burst: 1}
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 1, per: 1s, burst: 1}
`)
	r := run(t, p, 20, roundRobin(2), Options{})
	check(t, r, 9100*time.Millisecond, "per-business")
}

func TestSlidingWindow(t *testing.T) {
	p := parse(t, `
rules:
  - name: recent
    match: {type: "http:call"}
    sliding: {limit: 100, every: 1m}
`)
	// 100 now, 100 a minute later, 50 two minutes later.
	r := run(t, p, 250, roundRobin(1), Options{Start: epoch10.Add(1234 * time.Millisecond)})
	check(t, r, 2*time.Minute, "recent")
	if got := FormatDuration(r.Duration); got != "120.00s (2m0s)" {
		t.Errorf("FormatDuration = %q", got)
	}
}

func TestSlidingAfterGCRA(t *testing.T) {
	// A 1/s GCRA spreads the tasks; a sliding window of 3 per 10 s then
	// admits tasks 0,1,2 at 0,1,2 s and each next one 10 s after the one
	// three before it: 10, 11, 12, 20, 21, 22, and task 9 at 30 s. Alone,
	// the window takes 30 s too (3 at 0, 10, 20, 30), the GCRA 9 s.
	p := parse(t, `
rules:
  - name: rate
    match: {type: "http:call"}
    gcra: {rate: 1, per: 1s, burst: 1}
  - name: recent
    match: {type: "http:call"}
    sliding: {limit: 3, every: 10s}
`)
	r := run(t, p, 10, roundRobin(1), Options{})
	check(t, r, 30*time.Second, "recent")
}

func TestConcurrency(t *testing.T) {
	p := parse(t, `
rules:
  - name: business-concurrency
    match: {type: "http:call"}
    key: "{{.business_id}}"
    concurrency: {max: 3, lease: 30s, reserved: 1}
`)
	// 2 usable slots, tasks of 1 s: 10 tasks of one business in 5 pairs.
	r := run(t, p, 10, roundRobin(1), Options{})
	check(t, r, 4*time.Second, "business-concurrency")
	// Tasks of 2.5 s, 3 businesses × 4 tasks: pairs at 0, 2.5 s per business.
	r = run(t, p, 12, roundRobin(3), Options{TaskDuration: 2500 * time.Millisecond})
	check(t, r, 2500*time.Millisecond, "business-concurrency")
	if got := r.Rules[0].Keys; got != 3 {
		t.Errorf("keys %d, want 3", got)
	}
}

// TestAdaptiveConcurrency: an adaptive concurrency rule is estimated at
// its max (what the service takes is learned from the calls alone): 2
// slots, tasks of 1 s, 10 tasks in 5 pairs.
func TestAdaptiveConcurrency(t *testing.T) {
	p := parse(t, `
rules:
  - name: backend
    match: {type: "http:call"}
    adaptive_concurrency: {min: 1, max: 2, lease: 30s}
`)
	r := run(t, p, 10, roundRobin(1), Options{})
	check(t, r, 4*time.Second, "backend")
	if r.Rules[0].Limit != "1-2 at once, learned, lease 30s (adaptive concurrency)" {
		t.Errorf("limit %q", r.Rules[0].Limit)
	}
}

func TestCalendarWindow(t *testing.T) {
	p := parse(t, `
rules:
  - name: vendor-daily
    match: {type: "http:call"}
    quota: {limit: 100, cron: "0 0 * * *", tz: "America/Los_Angeles"}
`)
	la, err := time.LoadLocation("America/Los_Angeles")
	if err != nil {
		t.Skip(err)
	}
	// Noon on Saturday 7 March 2026: 100 now, 100 at midnight (12 h),
	// 50 at the next midnight, 23 h later (clocks spring forward on 8 March).
	r := run(t, p, 250, roundRobin(1), Options{Start: time.Date(2026, 3, 7, 12, 0, 0, 0, la)})
	check(t, r, 35*time.Hour, "vendor-daily")
}

func TestNoRuleDelays(t *testing.T) {
	p := parse(t, `
rules:
  - name: vendor-daily
    match: {type: "http:call"}
    quota: {limit: 10000, cron: "@daily"}
`)
	r := run(t, p, 500, roundRobin(1), Options{})
	check(t, r, 0, "")
	var b strings.Builder
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "binding rule:                    none") {
		t.Errorf("report:\n%s", b.String())
	}
}

func TestUnmatched(t *testing.T) {
	p := parse(t, `
rules:
  - name: bulk
    match: {queue: bulk}
    gcra: {rate: 1, per: 1s}
`)
	r := run(t, p, 50, roundRobin(1), Options{})
	if r.Unmatched != 50 || len(r.Rules) != 0 || r.Duration != 0 {
		t.Errorf("report %+v", r)
	}
	var b strings.Builder
	r.Write(&b)
	if !strings.Contains(b.String(), "no rule of the policy applies") {
		t.Errorf("report:\n%s", b.String())
	}
}

func TestMissingKeyField(t *testing.T) {
	p := parse(t, perBusiness)
	// Every third task lacks business_id: the worker would archive it; it
	// takes no quota.
	payload := func(i int) []byte {
		if i%3 == 2 {
			return []byte(`{"url":"http://x"}`)
		}
		return []byte(`{"business_id":"b1"}`)
	}
	r := run(t, p, 9, payload, Options{})
	if r.Refused != 3 || r.FirstRefused != 2 {
		t.Errorf("refused %d, first %d; want 3, 2", r.Refused, r.FirstRefused)
	}
	if !strings.Contains(r.RefusedReason, `"per-business"`) || !strings.Contains(r.RefusedReason, `"business_id"`) {
		t.Errorf("reason %q does not name the rule and the field", r.RefusedReason)
	}
	check(t, r, 5*time.Second, "per-business")
	var b strings.Builder
	r.Write(&b)
	if !strings.Contains(b.String(), "tasks the worker would archive:  3 (first: task 3: ") {
		t.Errorf("report:\n%s", b.String())
	}
}

func TestReportTable(t *testing.T) {
	p := parse(t, `
rules:
  - name: vendor-peak
    match: {type: "http:call"}
    gcra: {rate: 100, per: 1s, burst: 10}
  - name: per-business
    match: {type: "http:*"}
    key: "{{.business_id}}"
    gcra: {rate: 1.8, per: 1s, burst: 1}
  - name: other
    match: {type: "email:*"}
    gcra: {rate: 1, per: 1s}
`)
	r := run(t, p, 1000, roundRobin(20), Options{})
	var b strings.Builder
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		`dry run: 1000 tasks of type "http:call" on queue "default", limits idle at 2026-05-04 09:00:00.000 UTC`,
		"RULE          LIMIT                   KEY               KEYS  ALONE",
		"vendor-peak   100/1s burst 10 (GCRA)  (global)          1     9.90s",
		"per-business  1.8/1s burst 1 (GCRA)   {{.business_id}}  20    27.22s",
		"binding rule:                    per-business",
		"estimated duration:              27.33s (until the last task starts)",
		"completes at:                    2026-05-04 09:00:27.332 UTC",
		"tasks no rule matches:           0",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "other") {
		t.Errorf("report lists a rule that does not apply:\n%s", out)
	}
	// 50 tasks per business at 1.8/s (T = 555,556 µs, rounded up): alone,
	// the last starts 49 T after the first. In the first round the global
	// rule lets 10 businesses start at once and the other 10 in 10 ms
	// steps. Later rounds are booked ahead of the global rule's bookings:
	// the first booking of a round starts its interval on the next
	// multiple of 10 ms, which takes one unit of the burst at that moment,
	// so the last task starts up to 10 ms later still.
	if lo, hi := 49*555556*time.Microsecond+100*time.Millisecond, 49*555556*time.Microsecond+110*time.Millisecond; r.Duration < lo || r.Duration > hi {
		t.Errorf("duration %s, want %s to %s", r.Duration, lo, hi)
	}
}

func TestLargeCampaignIsFast(t *testing.T) {
	// 20,000 tasks under every kind of rule: a smoke test that the
	// simulation stays near-linear (no timing assertion; the test's own
	// timeout is the bound).
	p := parse(t, `
rules:
  - name: peak
    match: {type: "http:call"}
    gcra: {rate: 1000, per: 1s, burst: 10}
  - name: window
    match: {type: "http:call"}
    quota: {limit: 9000, every: 10s}
  - name: daily
    match: {type: "http:call"}
    quota: {limit: 1000000, cron: "0 0 * * *"}
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    sliding: {limit: 100, every: 1m}
  - name: conc
    match: {type: "http:call"}
    key: "{{.business_id}}"
    concurrency: {max: 50, lease: 30s}
`)
	r := run(t, p, 20000, roundRobin(500), Options{TaskDuration: 100 * time.Millisecond})
	// The 10 s window admits 9,000 (the peak rule spreads them over 9 s):
	// the last 2,000 get the window after the second reset, at 20 s, and
	// the peak rule starts them in 1.99 s. Alone, the window takes 20 s and
	// the peak rule 19.99 s.
	if want := 21990 * time.Millisecond; r.Duration != want {
		t.Errorf("duration %s, want %s", r.Duration, want)
	}
	if r.Binding != "window" {
		t.Errorf("binding %q, want window", r.Binding)
	}
}

func TestOptionsErrors(t *testing.T) {
	p := parse(t, "rules: [{name: a, match: {type: x}, gcra: {rate: 1, per: 1s}}]")
	if _, err := Run(p, Campaign{Type: "x", N: 1, Payload: roundRobin(1)}, Options{TaskDuration: -time.Second}); err == nil {
		t.Error("negative task duration accepted")
	}
	if _, err := Run(p, Campaign{Type: "x", N: 1}, Options{}); err == nil {
		t.Error("nil payload func accepted")
	}
	// A start beyond the range of the GCRA arithmetic is an error, not a
	// panic.
	if _, err := Run(p, Campaign{Type: "x", N: 3, Payload: roundRobin(1)}, Options{Start: time.Date(2050, 1, 1, 0, 0, 0, 0, time.UTC)}); err == nil {
		t.Error("start in 2050 accepted")
	}
}

// TestCost: 100 tasks of units 3 under 30/s burst 30 with cost
// "{{.units}}": the first 10 at once, then one every 3 intervals: the last
// starts (100·3 − 30) intervals after the start, 9 s at an interval of
// 1s/30 rounded up to a whole µs (33,334µs: 9.00018s); a task of units 40,
// above the burst, is refused, not waited for.
func TestCost(t *testing.T) {
	p := parse(t, `
rules:
  - name: points
    match: {type: "http:call"}
    cost: "{{.units}}"
    gcra: {rate: 30, per: 1s, burst: 30}
`)
	want := (100*3 - 30) * ((time.Second/time.Microsecond + 29) / 30 * time.Microsecond)
	r := run(t, p, 100, func(i int) []byte { return []byte(`{"units": 3}`) }, Options{})
	check(t, r, want, "points")
	r = run(t, p, 101, func(i int) []byte {
		if i == 50 {
			return []byte(`{"units": 40}`)
		}
		return []byte(`{"units": 3}`)
	}, Options{})
	check(t, r, want, "points")
	if r.Refused != 1 || r.FirstRefused != 50 || !strings.Contains(r.RefusedReason, "cost 40 is above the rule's burst of 30") {
		t.Errorf("refused %d, first %d: %q", r.Refused, r.FirstRefused, r.RefusedReason)
	}
}

// TestAhead: what Redis already holds comes before the campaign
// (Options.Ahead), computed from the limits alone: at 1/s burst 1 per
// business, b1's 2 used units and 3 waiting tasks put its 4 tasks at 5..8 s
// while b2's start at 0..3 s; a window of 10 per 10 s with 8 used takes 2
// of 5 tasks now, the rest at the reset; a concurrency rule of 2 with both
// slots held starts the first task when they are released, a task later.
func TestAhead(t *testing.T) {
	ahead := func(m map[[2]string][2]int) func(rule, key string) (int, int, error) {
		return func(rule, key string) (int, int, error) {
			a := m[[2]string{rule, key}]
			return a[0], a[1], nil
		}
	}
	p := parse(t, perBusiness)
	idle := run(t, p, 8, roundRobin(2), Options{})
	check(t, idle, 3*time.Second, "per-business")
	r := run(t, p, 8, roundRobin(2), Options{Ahead: ahead(map[[2]string][2]int{{"per-business", "b1"}: {2, 3}})})
	check(t, r, 8*time.Second, "per-business")
	if len(r.Ahead) != 1 || r.Ahead[0] != (AheadState{Rule: "per-business", Key: "b1", Used: 2, Waiting: 3}) {
		t.Errorf("ahead %+v", r.Ahead)
	}
	var b strings.Builder
	if err := r.Write(&b); err != nil || !strings.Contains(b.String(), "limits as Redis has them") || !strings.Contains(b.String(), "already ahead: rule per-business key b1: 2 used, 3 tasks waiting") {
		t.Errorf("report:\n%s", b.String())
	}

	window := parse(t, `
rules:
  - name: vendor-window
    match: {type: "http:call"}
    quota: {limit: 10, every: 10s}
`)
	r = run(t, window, 5, roundRobin(1), Options{Ahead: ahead(map[[2]string][2]int{{"vendor-window", ""}: {8, 0}})})
	check(t, r, 10*time.Second, "vendor-window")

	slots := parse(t, `
rules:
  - name: business-concurrency
    match: {type: "http:call"}
    key: "{{.business_id}}"
    concurrency: {max: 2, lease: 30s}
`)
	r = run(t, slots, 2, roundRobin(1), Options{Ahead: ahead(map[[2]string][2]int{{"business-concurrency", "b1"}: {2, 0}})})
	check(t, r, time.Second, "business-concurrency")
	if _, err := Run(p, Campaign{Type: "http:call", Queue: "default", N: 1, Payload: roundRobin(1)}, Options{Start: epoch10,
		Ahead: func(string, string) (int, int, error) { return 0, 0, fmt.Errorf("boom") }}); err == nil || !strings.Contains(err.Error(), `rule "per-business" key "b1": boom`) {
		t.Errorf("a failing Ahead: %v", err)
	}
}
