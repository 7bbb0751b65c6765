package simulate

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/policy"
)

func mustPolicy(t testing.TB, doc string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustVendor(t testing.TB, spec string) Vendor {
	t.Helper()
	v, err := ParseVendor(spec)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

const adaptivePolicy = `
rules:
  - name: vendor-learned
    match: {type: "http:call"}
    adaptive: {max: 40, min: 1, per: 1s}
`

func TestParseVendor(t *testing.T) {
	v := mustVendor(t, "20/s for 1m, 5/s burst 3 for 90s,0.5/10s")
	want := []Phase{
		{Limit: gcra.Limit{Rate: 20, Period: time.Second, Burst: 1}, For: time.Minute},
		{Limit: gcra.Limit{Rate: 5, Period: time.Second, Burst: 3}, For: 90 * time.Second},
		{Limit: gcra.Limit{Rate: 0.5, Period: 10 * time.Second, Burst: 1}},
	}
	if len(v.Phases) != len(want) {
		t.Fatalf("%+v", v)
	}
	for i := range want {
		if v.Phases[i] != want[i] {
			t.Errorf("phase %d: %+v, want %+v", i+1, v.Phases[i], want[i])
		}
	}
	if got := v.String(); got != "20/s for 1m0s, 5/s burst 3 for 1m30s, 0.5/10s" {
		t.Errorf("String: %q", got)
	}
	if l, i := v.At(61 * time.Second); i != 1 || l.Rate != 5 {
		t.Errorf("At(61s): %v %d", l, i)
	}
	if l, i := v.At(time.Hour); i != 2 || l.Rate != 0.5 {
		t.Errorf("At(1h): %v %d", l, i)
	}
	if v := mustVendor(t, "20 at once for 90s,10 at once"); v.String() != "20 at once for 1m30s, 10 at once" || v.Phases[1].Slots != 10 || !v.service() {
		t.Errorf("a service: %+v %q", v, v.String())
	}
	for spec, msg := range map[string]string{
		"":                             "empty",
		"20":                           "RATE/PER",
		"x/s":                          `bad rate "x"`,
		"20/fortnight":                 `bad period "fortnight"`,
		"20/s for":                     `"for" needs a value`,
		"20/s for -1s":                 `bad duration "-1s"`,
		"20/s burst 0":                 "burst",
		"20/s every 2s":                `unknown word "every"`,
		"20/s, 5/s for 1m":             "phase 1: needs a duration",
		"-3/s":                         "rate",
		"20/s for 1m,, 5/s":            "phase 2",
		"20/s for 1m burst x":          `bad burst "x"`,
		"20/s for 1m burst 2 ":         "",
		"20 at once for 1m, 5/s":       "vendor phase 2: a vendor is rates (RATE/PER) or a service (N at once), not both",
		"20 at once for 1m, 5 at once": "",
		"0 at once":                    `bad number of calls at once "0"`,
		"x at once":                    `bad number of calls at once "x"`,
		"20 at once for":               "expected N at once [for DURATION]",
		"20 at once burst 2":           "expected N at once [for DURATION]",
		"20 at once for -1s":           `bad duration "-1s"`,
		"20 at once, 5/s":              "phase 1: needs a duration",
	} {
		_, err := ParseVendor(spec)
		switch {
		case msg == "" && err != nil:
			t.Errorf("%q: %v", spec, err)
		case msg != "" && (err == nil || !strings.Contains(err.Error(), msg)):
			t.Errorf("%q: got %v, want an error containing %q", spec, err, msg)
		}
	}
}

// TestFixedRule: a fixed GCRA rule below the vendor's limit sends exactly
// its rate and is never throttled; one above it runs into the wall after
// every block (one call passes per Retry-After), where an adaptive rule
// with the same maximum learns the vendor's rate. The ideals come from the
// limits alone.
func TestFixedRule(t *testing.T) {
	run := func(limit string) Report {
		doc := "rules: [{name: vendor, match: {type: \"http:call\"}, " + limit + "}]"
		rep, err := Run(Spec{Policy: mustPolicy(t, doc), Type: "http:call", Vendor: mustVendor(t, "20/s"), Duration: 100 * time.Second, Interval: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %.2f/s answered 200, %d of %d calls 429", limit, float64(rep.Done)/100, rep.Throttled, rep.Calls)
		return rep
	}
	if rep := run("gcra: {rate: 10, per: 1s}"); rep.Throttled > 0 || math.Abs(float64(rep.Done)/100-10) > 0.3 {
		t.Errorf("a fixed rule below the limit: %+v", rep)
	}
	if rep := run("gcra: {rate: 25, per: 1s}"); float64(rep.Done)/100 > 2 {
		t.Errorf("a fixed rule above the limit did better than the wall allows: %+v", rep)
	}
	if rep := run("adaptive: {max: 25, per: 1s}"); float64(rep.Done)/100 < 17 || rep.ThrottledShare() > 0.02 {
		t.Errorf("an adaptive rule did not learn the limit: %.2f/s, %.1f%% 429", float64(rep.Done)/100, 100*rep.ThrottledShare())
	}
}

// TestAdaptiveDay runs a day's shape, shortened for the race detector: a
// vendor (burst 1, calls arriving with 2 ms of jitter) whose limit changes
// six times, an adaptive rule that knows none of it. The bars: at most 2 %
// of calls answered 429, and in every phase, after a 5-minute row of
// settling, at least 85 % of the vendor's limit used (measured: 87-94 %;
// BENCHMARKS.md has the full 24 h day).
func TestAdaptiveDay(t *testing.T) {
	v := mustVendor(t, "20/s for 20m, 5/s for 20m, 20/s for 20m, 10/s for 20m, 30/s for 10m, 5/s for 10m, 20/s")
	const day = 2 * time.Hour
	start := time.Now()
	rep, err := Run(Spec{Policy: mustPolicy(t, adaptivePolicy), Type: "http:call", Vendor: v, Duration: day, Interval: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%v simulated in %v: %d calls, %.2f%% answered 429, %.1f limiter operations per call", day, time.Since(start), rep.Calls, 100*rep.ThrottledShare(),
		float64(rep.Decisions)/float64(rep.Calls))
	if rep.ThrottledShare() > 0.02 {
		t.Errorf("%.2f%% of calls answered 429, want at most 2%%", 100*rep.ThrottledShare())
	}
	for _, p := range rep.Phases(v, day, 5*time.Minute) {
		t.Logf("%v-%v vendor %.0f/s: %.1f%% used, %d calls, %d 429", p.From, p.To, p.Limit, 100*p.Used, p.Calls, p.Throttled)
		if p.Used < 0.85 {
			t.Errorf("%v-%v vendor %.0f/s: %.1f%% used, want at least 85%%", p.From, p.To, p.Limit, 100*p.Used)
		}
	}
	for _, r := range rep.Rows {
		if r.Learned > 40 || r.Learned < 1 {
			t.Errorf("%v: learned %.2f/s, outside min and max", r.From, r.Learned)
		}
	}
}

// TestAdaptiveLimitReturns: a limit that falls and comes back (e2e
// TestAdaptive's shape, 20/s for 40 s, 5/s, 20/s for 40 s, on 3 and 6
// workers of 10 slots) is found again soon, wherever the learner's probes
// stand when it comes back: the low phase lasts 15 to 45 s, a second
// apart. Measured (2026-11-29): 83.0 % of the third phase used from 10 s
// in on average, 73.0 % at worst, 1.22 % of calls 429 (83.9, 73.0 and
// 1.18 % before the learned burst and the 10 % step; 80.0, 61.0 and
// 1.50 % before the probes back to the remembered rate waited the hold
// since the last cut, and failed probes quartered the step). The bars
// (the simulation is deterministic): 82 % on average, 70 % at worst,
// 1.5 % of calls 429. Probes confirmed by their 5 units above the good
// rate with no bound gave 65.2 and 30.0 %; bounded by the hold alone,
// without the 4 P while a remembered rate is tried, 83.0 and 54.3 %.
func TestAdaptiveLimitReturns(t *testing.T) {
	if testing.Short() {
		t.Skip("62 simulations")
	}
	p := mustPolicy(t, adaptivePolicy)
	var sum, throttled float64
	lowest, runs := 1.0, 0
	for low := 15; low <= 45; low++ {
		v := mustVendor(t, fmt.Sprintf("20/s for 40s, 5/s for %ds, 20/s", low))
		d := time.Duration(80+low) * time.Second
		for _, workers := range []int{3, 6} {
			rep, err := Run(Spec{Policy: p, Type: "http:call", Vendor: v, Workers: workers, Concurrency: 10, Latency: time.Millisecond, Duration: d, Interval: time.Second, Backlog: 60})
			if err != nil {
				t.Fatal(err)
			}
			used := rep.Phases(v, d, 10*time.Second)[2].Used
			if used < lowest {
				lowest = used
				t.Logf("5/s for %d s, %d workers: %.1f%% of the third phase used", low, workers, 100*used)
			}
			sum += used
			throttled += rep.ThrottledShare()
			runs++
		}
	}
	mean, share := sum/float64(runs), throttled/float64(runs)
	t.Logf("%d runs: %.1f%% of the third phase used on average, %.1f%% at worst; %.2f%% of calls 429", runs, 100*mean, 100*lowest, 100*share)
	if mean < 0.82 || lowest < 0.7 || share > 0.015 {
		t.Errorf("want at least 82%% on average and 70%% at worst, at most 1.5%% of calls 429")
	}
}

func TestSpecErrors(t *testing.T) {
	p := mustPolicy(t, adaptivePolicy)
	keyed := mustPolicy(t, `rules: [{name: per-business, match: {type: "http:call"}, key: "{{.business_id}}", gcra: {rate: 2, per: 1s}}]`)
	v := mustVendor(t, "20/s")
	for _, tc := range []struct {
		spec Spec
		msg  string
	}{
		{Spec{Vendor: v, Duration: time.Second}, "policy"},
		{Spec{Policy: p, Duration: time.Second}, "vendor"},
		{Spec{Policy: p, Vendor: v}, "duration"},
		{Spec{Policy: p, Vendor: v, Duration: time.Second, Type: "other"}, "no rule"},
		{Spec{Policy: p, Vendor: v, Duration: time.Second, Type: "http:call", Workers: -1}, "at least 1"},
		{Spec{Policy: p, Vendor: v, Duration: 48 * time.Hour, Type: "http:call", Interval: time.Second}, "100000"},
		{Spec{Policy: p, Vendor: v, Duration: time.Second, Type: "http:call", Backlog: 1, Payloads: [][]byte{[]byte("{}"), []byte("{}")}}, "a backlog of 1 cannot hold 2 payloads"},
		{Spec{Policy: keyed, Vendor: v, Duration: time.Second, Type: "http:call", Payloads: [][]byte{[]byte(`{"business_id":"b1"}`), []byte(`{"business_id":null}`)}}, "payload 2:"},
		{Spec{Policy: keyed, Vendor: v, Duration: time.Second, Type: "http:call", Payloads: [][]byte{[]byte(`[]`)}}, "the payload:"},
	} {
		if _, err := Run(tc.spec); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%+v: got %v, want an error containing %q", tc.spec, err, tc.msg)
		}
	}
}

// runPayloads runs doc for 2 minutes against a vendor that never throttles,
// with a backlog of payloads, and returns each payload's rate answered 200.
func runPayloads(t *testing.T, doc string, payloads ...string) []float64 {
	t.Helper()
	spec := Spec{Policy: mustPolicy(t, doc), Type: "http:call", Vendor: mustVendor(t, "100000/s burst 1000"), Duration: 2 * time.Minute, Interval: time.Minute, Backlog: 150}
	for _, p := range payloads {
		spec.Payloads = append(spec.Payloads, []byte(p))
	}
	rep, err := Run(spec)
	if err != nil {
		t.Fatal(err)
	}
	var rates []float64
	for _, p := range rep.Payloads {
		rates = append(rates, float64(p.Done)/spec.Duration.Seconds())
	}
	if len(rates) != len(payloads) {
		t.Fatalf("%d payloads reported, want %d: %+v", len(rates), len(payloads), rep.Payloads)
	}
	return rates
}

// within reports whether got is within frac of want.
func within(got, want, frac float64) bool { return math.Abs(got-want) <= frac*want }

// TestPayloadsWeighted: a fair 12/s shared by weights 3, 2 and 1 from the
// payload gives each business its share (ideal: 12 x w / 6).
func TestPayloadsWeighted(t *testing.T) {
	got := runPayloads(t, `
rules:
  - name: shared
    match: {type: "http:call"}
    gcra: {rate: 12, per: 1s}
    fair: {key: "{{.business_id}}", weight: "{{.weight}}"}
`, `{"business_id":"b1","weight":3}`, `{"business_id":"b2","weight":2}`, `{"business_id":"b3","weight":1}`)
	t.Logf("per second: %.2f", got)
	for i, want := range []float64{6, 4, 2} {
		if !within(got[i], want, 0.05) {
			t.Errorf("weight %d: %.2f/s, want %.0f/s within 5%%", 3-i, got[i], want)
		}
	}
}

// TestPayloadsTiers: a key on the pro plan (6/s) beside three on the
// default (2/s) and a plan the rule lacks, under a shared 20/s that does
// not bind: with the keyed rule's burst 2 each key gets its plan's rate.
// With burst 1 the pro key loses what the others' bookings, placed first,
// take from its rigid schedule (docs/policy.md, "Plans"): the test states
// the figure measured and fails below half the plan.
func TestPayloadsTiers(t *testing.T) {
	doc := `
rules:
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 2, per: 1s, burst: BURST}
    tier: "{{.plan}}"
    tiers:
      pro: {gcra: {rate: 6, per: 1s, burst: BURST}}
  - name: shared
    match: {type: "http:call"}
    gcra: {rate: 20, per: 1s}
`
	payloads := []string{`{"business_id":"b1","plan":"pro"}`, `{"business_id":"b2"}`, `{"business_id":"b3","plan":"gold"}`, `{"business_id":"b4","plan":"free"}`}
	want := []float64{6, 2, 2, 2}
	got := runPayloads(t, strings.ReplaceAll(doc, "BURST", "2"), payloads...)
	t.Logf("burst 2, per second: %.2f", got)
	for i := range want {
		if !within(got[i], want[i], 0.02) {
			t.Errorf("burst 2, %s: %.2f/s, want %.0f/s within 2%%", payloads[i], got[i], want[i])
		}
	}
	got = runPayloads(t, strings.ReplaceAll(doc, "BURST", "1"), payloads...)
	t.Logf("burst 1, per second: %.2f", got)
	if got[0] < want[0]/2 || got[0] > want[0]*1.01 {
		t.Errorf("burst 1, the pro key: %.2f/s, want 3-6/s", got[0])
	}
}

// TestAdaptiveConcurrency: an adaptive concurrency rule that knows only
// 1-200 learns how many calls a service takes at once from the latency of
// the calls, for services of 10 to 80 slots whose slots halve and then
// triple (N unknown to the policy), answering in 50 ms or 400 ms without
// load, with 3 or 6 workers of 40 slots. The bars (issue 31), from 10 s
// after each change: the calls in service average within 20 % of N, and
// the 99th percentile of the latency stays within twice the unloaded one
// (the latency at no load, at most 10 % more with the service's jitter:
// 55 ms or 440 ms).
// Below 5 slots the service's latency doubles with one call too many, so
// no learner keeps its p99 within 2x (N 2: 164 ms, measured).
func TestAdaptiveConcurrency(t *testing.T) {
	p := mustPolicy(t, `
rules:
  - name: backend
    match: {type: "http:call"}
    adaptive_concurrency: {min: 1, max: 200, lease: 30s}
`)
	cases := []struct {
		n, workers int
		latency    time.Duration
	}{{10, 3, 50 * time.Millisecond}, {10, 6, 50 * time.Millisecond}, {20, 3, 50 * time.Millisecond}, {20, 6, 400 * time.Millisecond},
		{40, 3, 50 * time.Millisecond}, {40, 6, 400 * time.Millisecond}, {80, 6, 50 * time.Millisecond}}
	if raceEnabled {
		cases = cases[:2] // the same code, ten times slower
	}
	for _, c := range cases {
		unloaded := c.latency + c.latency/10
		v := Vendor{Phases: []Phase{{Slots: c.n, For: time.Minute}, {Slots: c.n / 2, For: time.Minute}, {Slots: 3 * c.n / 2}}}
		rep, err := Run(Spec{Policy: p, Type: "http:call", Vendor: v, Duration: 3 * time.Minute, Interval: 5 * time.Second,
			Latency: c.latency, Workers: c.workers, Concurrency: 40})
		if err != nil {
			t.Fatal(err)
		}
		var from time.Duration
		for i, ph := range v.Phases {
			to := from + ph.For
			if i == len(v.Phases)-1 {
				to = 3 * time.Minute
			}
			var area, span float64
			var p99 time.Duration
			for _, r := range rep.Rows {
				if r.From >= from+10*time.Second && r.To <= to {
					d := (r.To - r.From).Seconds()
					area, span, p99 = area+r.InFlight*d, span+d, max(p99, r.P99)
				}
			}
			inFlight := area / span
			t.Logf("N %d, %d workers, %v: phase %d (%d at once): %.1f in service, p99 %v", c.n, c.workers, c.latency, i+1, ph.Slots, inFlight, p99.Round(time.Millisecond))
			if !within(inFlight, float64(ph.Slots), 0.2) {
				t.Errorf("N %d, %d workers, %v, phase %d: %.1f calls in service, want %d within 20%%", c.n, c.workers, c.latency, i+1, inFlight, ph.Slots)
			}
			if p99 > 2*unloaded {
				t.Errorf("N %d, %d workers, %v, phase %d: p99 latency %v, want at most %v", c.n, c.workers, c.latency, i+1, p99, 2*unloaded)
			}
			from = to
		}
	}
}

// TestPayloadsRepeated: a payload given twice is one payload of the
// report, with twice the tasks waiting of the other.
func TestPayloadsRepeated(t *testing.T) {
	rep, err := Run(Spec{Policy: mustPolicy(t, adaptivePolicy), Type: "http:call", Vendor: mustVendor(t, "20/s"), Duration: 10 * time.Second, Backlog: 60,
		Payloads: [][]byte{[]byte(`{"b":1}`), []byte(`{"b":2}`), []byte(`{"b":1}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Payloads) != 2 || rep.Payloads[0].Payload != `{"b":1}` || rep.Payloads[0].Waiting != 40 || rep.Payloads[1].Waiting != 20 {
		t.Errorf("%+v", rep.Payloads)
	}
}
