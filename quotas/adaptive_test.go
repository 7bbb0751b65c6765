package quotas

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// rateOf is the rate per second of a decision's rule i.
func rateOf(t *testing.T, d Decision, i int) float64 {
	t.Helper()
	iv := d.Rules[i].Interval
	if iv <= 0 {
		t.Fatalf("rule %d has no interval: %+v", i, d.Rules[i])
	}
	return float64(time.Second) / float64(iv)
}

func near(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > want*0.002 {
		t.Fatalf("%s: rate %.4f/s, want %.4f/s", what, got, want)
	}
}

// walk drives one adaptive rule of a model on explicit times.
type walk struct {
	t *testing.T
	m *Model
	s *Set
}

// status is the rule's rate at at.
func (w walk) status(at time.Time) float64 {
	d, err := w.m.StatusAt(at, w.s, Request{})
	if err != nil {
		w.t.Fatal(err)
	}
	return rateOf(w.t, d, 0)
}

// block reports a throttle at at for a second, and returns the rate after.
func (w walk) block(at time.Time) float64 {
	d, err := w.m.BlockAt(at, w.s, Request{}, at.Add(time.Second))
	if err != nil {
		w.t.Fatal(err)
	}
	return rateOf(w.t, d, 0)
}

// admit takes every unit the rule admits from..to, one per interval, and
// returns the time after the last.
func (w walk) admit(from, to time.Time) time.Time {
	at := from
	for at.Before(to) {
		d, err := w.m.AllowAt(at, w.s, Request{})
		if err != nil {
			w.t.Fatal(err)
		}
		if !d.Allowed {
			at = at.Add(d.RetryAfter)
			continue
		}
		at = at.Add(d.Rules[0].Interval)
	}
	return at
}

// TestAdaptiveLearns walks an adaptive rule through every phase of its
// algorithm on explicit times, with the figures Adaptive's doc states.
func TestAdaptiveLearns(t *testing.T) {
	w := walk{t, NewModel(), mustSet(Rule{Name: "vendor", Limit: Adaptive{Max: 100, Min: 1, Start: 40, Per: time.Second}})}
	status, block, admit := w.status, w.block, w.admit
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	near(t, "start", status(t0), 40)
	near(t, "a throttle at a rate never good cuts it to 0.7", block(t0), 28)
	near(t, "a throttle 0.5s later is the same event", block(t0.Add(500*time.Millisecond)), 28)
	// From a hard cut the rule searches up with a 20 % step after a dwell
	// (16 em busy at 28/s, 0.57 s, counted from the end of the block)...
	at := admit(t0.Add(time.Second), t0.Add(1400*time.Millisecond))
	near(t, "no probe before a dwell", status(at), 28)
	at = admit(at, t0.Add(1700*time.Millisecond))
	near(t, "search probe", status(at), 33.6)
	// ... and a throttle while probing goes back to the last good rate.
	near(t, "failed probe", block(at), 28)
	// Good probes are kept, the step quartered after the failure: 5 %,
	// then doubling after two good ones in a row.
	at = at.Add(time.Second)
	rates := []float64{28}
	for len(rates) < 4 {
		at = admit(at, at.Add(10*time.Millisecond))
		if r := status(at); math.Abs(r-rates[len(rates)-1]) > 0.01 {
			rates = append(rates, r)
		}
	}
	for i, step := range []float64{0.05, 0.05, 0.1} {
		near(t, fmt.Sprintf("probe %d", i+1), rates[i+1], rates[i]*(1+step))
	}
	// A throttle at a rate good for a dwell (the last good one after a
	// failed probe): 0.97 of it, remembered; another before the next
	// dwell: 0.7.
	good := rates[2]
	near(t, "failed probe", block(at), good)
	at = at.Add(1100 * time.Millisecond)
	near(t, "a good rate throttled", block(at), good*0.97)
	at = at.Add(1100 * time.Millisecond)
	near(t, "throttled again before a dwell", block(at), good*0.97*0.7)
	// Idle time is no evidence: nothing changes in an idle hour.
	near(t, "after an idle hour", status(at.Add(time.Hour)), good*0.97*0.7)
	// The floor, and a day after the last block ends the start again.
	for i := 0; i < 20; i++ {
		at = at.Add(2 * time.Second)
		block(at)
	}
	near(t, "floor", status(at), 1)
	near(t, "a day later", status(at.Add(24*time.Hour+time.Second)), 40)
}

// TestAdaptiveRemembers: after a fall from a rate that was good, probes
// go straight back to it once the hold (8 P here) has passed since the
// last cut, every other probe; the others step up from the good rate.
func TestAdaptiveRemembers(t *testing.T) {
	s := mustSet(Rule{Name: "vendor", Limit: Adaptive{Max: 20, Min: 1, Per: time.Second}})
	m := NewModel()
	at := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	// The start (Max), never measured, is cut hard at its first throttle,
	// and searched up from to Max again.
	w := walk{t, m, s}
	near(t, "the start cut", w.block(at), 14)
	at = w.admit(at.Add(time.Second), at.Add(10*time.Second))
	near(t, "back at Max", w.status(at), 20)
	for i := 0; i < 40; i++ { // 2 s at 20/s: good
		if d, err := m.AllowAt(at, s, Request{}); err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
		at = at.Add(50 * time.Millisecond)
	}
	rate := func(at time.Time) float64 {
		d, err := m.StatusAt(at, s, Request{})
		if err != nil {
			t.Fatal(err)
		}
		return rateOf(t, d, 0)
	}
	for _, want := range []float64{19.4, 19.4 * 0.7, 19.4 * 0.7 * 0.7} { // the limit fell to 10/s
		if _, err := m.BlockAt(at, s, Request{}, at.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		near(t, "cut", rate(at), want)
		at = at.Add(1100 * time.Millisecond)
	}
	// The limit is 10/s now: every probe above it fails. Probes alternate
	// between the remembered rate (3 % lower after each failure) and
	// steps up from the good rate.
	var seen []float64
	for end := at.Add(time.Minute); at.Before(end); {
		d, _ := m.AllowAt(at, s, Request{})
		if r := rateOf(t, d, 0); len(seen) == 0 || r != seen[len(seen)-1] {
			seen = append(seen, r)
			if r > 10 {
				m.BlockAt(at, s, Request{}, at.Add(time.Second))
				at = at.Add(time.Second)
				continue
			}
		}
		at = at.Add(d.Rules[0].Interval)
	}
	t.Logf("rates: %.2f", seen)
	near(t, "first probe, within the hold after the last cut: a step", seen[1], seen[0]*1.2)
	i := slices.IndexFunc(seen, func(r float64) bool { return r > 19 })
	if i < 0 || len(seen) < i+5 {
		t.Fatalf("no probe back to the remembered rate and two more: %.2f", seen)
	}
	near(t, "after the hold, the remembered rate", seen[i], 19.4)
	near(t, "next: a step from the good rate", seen[i+2], seen[i+1]*1.02)
	near(t, "then the remembered rate, 3 % lower", seen[i+4], 19.4*0.97)
}

// TestAdaptiveProbeOutlastsBurst: a probe is kept only once it has passed
// 5 units more than the good rate would have, not at the end of its
// dwell, so a vendor's burst of up to 5 cannot make a rate above its
// limit look good: from 10/s (good after a dwell of 16 em, 1.6 s), a
// probe to 12.5/s is still a probe after a second (2.5 units above) and
// kept after 2 s; a probe that would take longer than the hold to pass
// them is kept after the hold.
func TestAdaptiveProbeOutlastsBurst(t *testing.T) {
	w := walk{t, NewModel(), mustSet(Rule{Name: "vendor", Limit: Adaptive{Max: 40, Min: 1, Start: 10, Per: time.Second}})}
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	at := w.admit(t0, t0.Add(time.Second))
	near(t, "the start, not good before 16 em", w.status(at), 10)
	at = w.admit(at, t0.Add(1700*time.Millisecond))
	near(t, "the start, good after a dwell, probed", w.status(at), 12.5)
	probe := at
	at = w.admit(at, probe.Add(time.Second))
	near(t, "a probe 2.5 units above after a second", w.status(at), 12.5)
	at = w.admit(at, probe.Add(2100*time.Millisecond))
	near(t, "kept after 5 units above; the next probe", w.status(at), 12.5*1.25)
	near(t, "which fails back to the kept one", w.block(at), 12.5)

	// A probe too small to pass 5 units soon (2/s to its Max of 2.05/s:
	// 100 s) is kept after the hold all the same (48.8 s busy, 100 em).
	for _, c := range []struct {
		busy time.Duration
		want float64
	}{{47 * time.Second, 2}, {50 * time.Second, 2.05 * 0.97}} {
		w := walk{t, NewModel(), mustSet(Rule{Name: "vendor", Limit: Adaptive{Max: 2.05, Min: 1, Start: 2, Per: time.Second}})}
		at := w.admit(t0, t0.Add(4100*time.Millisecond)) // a dwell of 4 P (16 em is 8 s)
		near(t, "the start, good after a dwell, probed", w.status(at), 2.05)
		at = w.admit(at, at.Add(c.busy))
		near(t, fmt.Sprintf("a throttle after %v at the probe", c.busy), w.block(at), c.want)
	}
}

// TestAdaptiveLearnsBurst: a probe that failed after passing more than 5
// units above the good rate (a vendor's burst let them through) raises
// the units the next probes must pass to be kept: from 100/s, a probe of
// 25 % throttled 0.4 s in (10 units above), the next, of 6.25 %, is kept
// after 10 units (1.6 s), not 5 (0.8 s).
func TestAdaptiveLearnsBurst(t *testing.T) {
	w := walk{t, NewModel(), mustSet(Rule{Name: "vendor", Limit: Adaptive{Max: 400, Min: 1, Start: 100, Per: time.Second}})}
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	// probeAt admits from at until the rate changes from was, and returns
	// that time.
	probeAt := func(at time.Time, was float64) time.Time {
		for end := at.Add(5 * time.Second); math.Abs(w.status(at)-was) < 0.01; at = w.admit(at, at.Add(10*time.Millisecond)) {
			if at.After(end) {
				t.Fatalf("still at %.2f/s", was)
			}
		}
		return at
	}
	p1 := probeAt(t0, 100)
	near(t, "the start, good after a dwell, probed", w.status(p1), 125)
	at := w.admit(p1, p1.Add(400*time.Millisecond))
	near(t, "the probe throttled 10 units above", w.block(at), 100)
	p2 := probeAt(at.Add(time.Second), 100)
	near(t, "the next probe, the step quartered", w.status(p2), 106.25)
	at = w.admit(p2, p2.Add(1200*time.Millisecond))
	near(t, "7.5 units above: not yet kept", w.status(at), 106.25)
	at = w.admit(at, p2.Add(1700*time.Millisecond))
	near(t, "10 units above: kept, the next probe", w.status(at), 106.25*1.0625)
}

// TestAdaptiveThrottleBeforeProbe: a throttle that comes before a probe's
// first unit went out is the good rate's, not the probe's: the good rate
// is nudged (7/s to 6.79/s) rather than kept with the probe failed. A
// vendor at 2.5/s, burst 5, let 2.94/s through for 10 s; the 429 came a
// moment after the next probe started, and 2.94/s stayed, each probe from
// it failing, for 35 s.
func TestAdaptiveThrottleBeforeProbe(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		what string
		at   time.Duration // from the probe's first unit
		want float64
	}{
		{"before the probe's first unit: the good rate nudged", -time.Millisecond, 7 * 0.97},
		{"at it: the probe failed, back to the good rate", 0, 7},
	} {
		w := walk{t, NewModel(), mustSet(Rule{Name: "vendor", Limit: Adaptive{Max: 40, Min: 1, Start: 10, Per: time.Second}})}
		near(t, "the start cut", w.block(t0), 7)
		at := t0.Add(time.Second) // the block
		for w.status(at) < 8 && at.Before(t0.Add(4*time.Second)) {
			at = w.admit(at, at.Add(time.Millisecond)) // a unit
		}
		near(t, "good after a dwell, probed", w.status(at), 8.4)
		near(t, "a throttle "+c.what, w.block(at.Add(c.at)), c.want)
	}
}

// TestAdaptiveNudgedAgain: a rate good for a dwell and throttled is
// nudged to 0.97 of it; good for a dwell again and throttled within the
// hold, no probe since, it is above the limit rather than at it, and is
// cut to 0.9; after a probe, a nudge is 0.97 again. A vendor at 10/s,
// burst 20, let a start of 20/s look good for its dwell, and 21 nudges of
// 3 %, a 429 each, took it to 10.5/s. The start itself, good for a dwell,
// is cut to 0.7 at its first throttle: it was never measured, and
// remembered it would draw a 429 every other probe.
func TestAdaptiveNudgedAgain(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	w := walk{t, NewModel(), mustSet(Rule{Name: "vendor", Limit: Adaptive{Max: 10, Min: 1, Per: time.Second}})}
	at := w.admit(t0, t0.Add(1700*time.Millisecond))
	near(t, "the start, good for a dwell, throttled", w.block(at), 7)

	w = walk{t, NewModel(), mustSet(Rule{Name: "vendor", Limit: Adaptive{Max: 40, Min: 1, Start: 10, Per: time.Second}})}
	at = w.admit(t0, t0.Add(1700*time.Millisecond))
	near(t, "the start, good for a dwell, probed", w.status(at), 12.5)
	near(t, "the probe fails", w.block(at), 10)
	at = at.Add(1500 * time.Millisecond) // the block; no dwell since
	near(t, "the good rate throttled: nudged", w.block(at), 9.7)
	at = w.admit(at, at.Add(3*time.Second)) // the block, then a dwell
	near(t, "good again, throttled within the hold: cut", w.block(at), 9.7*0.9)
	at = w.admit(at, at.Add(27*time.Second))
	near(t, "after the hold, a probe to the remembered rate", w.status(at), 9.7*0.97)
	near(t, "which fails", w.block(at), 9.7*0.9)
	at = w.admit(at, at.Add(3*time.Second))
	near(t, "a probe since: nudged", w.block(at), 9.7*0.9*0.97)
}

// TestAdaptiveNextProbeSooner: once a probe at the smallest step is
// kept, the next is larger and kept sooner, so that a limit that rose is
// followed sooner: from 10/s, after three failed probes (the step
// quartered each time, to 2 %), a probe of 2 % is kept after the hold
// (24 s), short of its 5 units (25 s), and the next is a step of 10 %,
// kept after 5 s (its 5 units, and 5 P), the step doubled.
func TestAdaptiveNextProbeSooner(t *testing.T) {
	w := walk{t, NewModel(), mustSet(Rule{Name: "vendor", Limit: Adaptive{Max: 40, Min: 1, Start: 10, Per: time.Second}})}
	at := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	var cut time.Time
	for _, want := range []float64{12.5, 10.625, 10.2} { // the step quartered
		at = w.admit(at, at.Add(1700*time.Millisecond))
		near(t, "a probe", w.status(at), want)
		near(t, "which fails", w.block(at), 10)
		cut = at
		at = w.admit(at, at.Add(time.Second)) // the block
	}
	at = w.admit(at, cut.Add(23500*time.Millisecond))
	near(t, "no probe within the hold", w.status(at), 10)
	for w.status(at) < 10.1 && at.Before(cut.Add(26*time.Second)) { // at the end of a dwell after it
		at = w.admit(at, at.Add(100*time.Millisecond))
	}
	near(t, "a probe of 2 % after it", w.status(at), 10.2)
	probe := at
	at = w.admit(at, probe.Add(23500*time.Millisecond))
	near(t, "short of its 5 units and of the hold", w.status(at), 10.2)
	for w.status(at) < 10.3 && at.Before(probe.Add(26*time.Second)) { // kept at the hold
		at = w.admit(at, at.Add(100*time.Millisecond))
	}
	if at.After(probe.Add(24500 * time.Millisecond)) {
		t.Fatalf("kept %v after the probe, want at the hold, 24 s", at.Sub(probe))
	}
	near(t, "kept after the hold, the next probe", w.status(at), 10.2*1.1)
	next := at
	at = w.admit(at, next.Add(4500*time.Millisecond))
	near(t, "the next, 4.5 s in", w.status(at), 10.2*1.1)
	at = w.admit(at, next.Add(5500*time.Millisecond))
	near(t, "kept after 5 s, the step doubled", w.status(at), 10.2*1.1*1.2)
}

// TestAdaptiveClimbs: a rule that starts far below its Max finds it in
// under a minute of traffic, doubling its probe step while probes stay
// good (each kept once 5 units above the rate before it: 20 s for the
// first, from 1/s).
func TestAdaptiveClimbs(t *testing.T) {
	s := mustSet(Rule{Name: "vendor", Limit: Adaptive{Max: 300, Min: 1, Start: 1, Per: time.Second}})
	m := NewModel()
	at := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	start := at
	for {
		d, err := m.AllowAt(at, s, Request{})
		if err != nil {
			t.Fatal(err)
		}
		if rateOf(t, d, 0) >= 299.9 {
			break
		}
		if at.Sub(start) > 2*time.Minute {
			t.Fatalf("still at %.1f/s after two minutes", rateOf(t, d, 0))
		}
		if d.Allowed {
			at = at.Add(d.Rules[0].Interval)
		} else {
			at = at.Add(d.RetryAfter)
		}
	}
	t.Logf("1/s to 300/s in %v", at.Sub(start))
	if took := at.Sub(start); took > time.Minute {
		t.Errorf("1/s to 300/s took %v", took)
	}
}

// TestAdaptiveOnRedis checks what only Redis shows: the learned rate is
// shared by every Limiter on the prefix (another worker, or this one after
// a restart), per key, and its key expires.
func TestAdaptiveOnRedis(t *testing.T) {
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	s := mustSet(Rule{Name: "per-business", Limit: Adaptive{Max: 10, Per: time.Second, Burst: 2}})
	a, err := New(Config{Client: c, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	b7 := Request{Keys: []string{"b7"}}
	if _, err := a.Block(ctx, s, b7, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{Client: c, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	d, err := b.Status(ctx, s, b7)
	if err != nil {
		t.Fatal(err)
	}
	near(t, "b7 on another limiter", rateOf(t, d, 0), 7)
	d, err = b.Status(ctx, s, Request{Keys: []string{"b8"}})
	if err != nil {
		t.Fatal(err)
	}
	near(t, "b8", rateOf(t, d, 0), 10)
	// A state stored before x (the learned burst) was added, 11 fields,
	// reads as one with x 0 (b8 has none: Status stores nothing).
	keys, err := c.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	states := 0
	for _, k := range keys {
		v, err := c.Get(ctx, k).Result()
		if err != nil || strings.Count(v, ":") != 11 || !strings.HasSuffix(v, ":0") {
			continue
		}
		states++
		ttl := c.PTTL(ctx, k).Val()
		if err := c.Set(ctx, k, strings.TrimSuffix(v, ":0"), ttl).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if states != 1 {
		t.Fatalf("%d learned states of 12 fields among %q, want 1 (b7's)", states, keys)
	}
	if d, err = b.Allow(ctx, s, b7); err != nil { // stores the state again
		t.Fatal(err)
	}
	near(t, "b7 from a state of 11 fields", rateOf(t, d, 0), 7)
	for _, k := range keys {
		if v := c.Get(ctx, k).Val(); strings.Count(v, ":") == 11 {
			states--
		}
	}
	if states != 0 {
		t.Errorf("b7's state not stored again with 12 fields")
	}
	assertAllExpire(t, c, prefix)
}

func TestAdaptiveErrors(t *testing.T) {
	for _, tc := range []struct {
		a     Adaptive
		field string
	}{
		{Adaptive{Per: time.Second}, "Max"},
		{Adaptive{Max: math.Inf(1), Per: time.Second}, "Max"},
		{Adaptive{Max: 2e6, Per: time.Second}, "Max"},
		{Adaptive{Max: 10}, "Per"},
		{Adaptive{Max: 10, Min: 11, Per: time.Second}, "Min"},
		{Adaptive{Max: 10, Min: 1e-12, Per: time.Second}, "Min"},
		{Adaptive{Max: 10, Start: 20, Per: time.Second}, "Start"},
		{Adaptive{Max: 10, Min: 2, Start: 1, Per: time.Second}, "Start"},
		{Adaptive{Max: 10, Per: time.Second, Burst: -1}, "Burst"},
	} {
		err := Rule{Name: "a", Limit: tc.a}.Validate()
		var re *RuleError
		if !errors.As(err, &re) || re.Field != tc.field {
			t.Errorf("%+v: got %v, want a fault in %s", tc.a, err, tc.field)
		}
	}
	if _, err := NewSet(Rule{Name: "a", Fair: true, Limit: Adaptive{Max: 1, Per: time.Second}}); err == nil {
		t.Error("a fair adaptive rule was accepted")
	}
}

// TestAdaptiveStaleBookings: a booking decided before a cut, for a slot
// after it, is no longer held (it was booked at a rate the remote side
// refused); one decided after the cut, or for a slot before it, is; a
// receipt carries what Held needs.
func TestAdaptiveStaleBookings(t *testing.T) {
	c := redistest.Client(t)
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	l := newClocked(t, c, redistest.Prefix(t), t0)
	ctx := context.Background()
	s := mustSet(Rule{Name: "vendor", Limit: Adaptive{Max: 10, Per: time.Second}})
	reserve := func() Decision {
		d, err := l.Reserve(ctx, s, Request{}, time.Minute)
		if err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
		return d
	}
	held := func(what string, d Decision, want bool) {
		t.Helper()
		r, err := ParseReceipt(d.Receipt())
		if err != nil {
			t.Fatal(err)
		}
		if got, err := l.Held(ctx, s, Request{}, r); err != nil || got != want {
			t.Fatalf("%s: Held %v %v, want %v", what, got, err, want)
		}
	}
	var before []Decision
	for i := 0; i < 5; i++ {
		before = append(before, reserve()) // slots 0, 100ms, ..., 400ms
	}
	l.now = t0.Add(150 * time.Millisecond)
	if _, err := l.Block(ctx, s, Request{}, l.now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	held("slot before the cut", before[1], true)
	held("slot after the cut, decided before", before[2], false)
	held("after the cut", reserve(), true)
	// Without an adaptive rule Held makes no call and says true.
	plain := mustSet(Rule{Name: "p", Limit: FixedWindow{Limit: 5, Every: time.Second}})
	d, err := l.Reserve(ctx, plain, Request{}, time.Minute)
	if ok, err2 := l.Held(ctx, plain, Request{}, d); err != nil || err2 != nil || !ok {
		t.Fatalf("%v %v %v", ok, err, err2)
	}
}

// TestAdaptiveBlockCall: on explicit times, in Redis and in the model, a
// throttle of a call decided before the last cut is the same congestion
// (no cut), an undated Block within a second of the cut too, and a call
// decided after the cut cuts again at once (a rate not yet good: 0.7).
func TestAdaptiveBlockCall(t *testing.T) {
	ctx := context.Background()
	s := mustSet(Rule{Name: "vendor", Limit: Adaptive{Max: 100, Min: 1, Start: 40, Per: time.Second}})
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	l := newClocked(t, redistest.Client(t), redistest.Prefix(t), t0)
	m := NewModel()
	for _, step := range []struct {
		at, decided time.Duration // from t0; decided -1: undated (Block)
		want        float64
	}{
		{0, -1, 28}, // the first cut: 40 to 28
		{100 * time.Millisecond, -50 * time.Millisecond, 28},   // decided before it: the same congestion
		{200 * time.Millisecond, -1, 28},                       // undated, within a second of it
		{300 * time.Millisecond, 150 * time.Millisecond, 19.6}, // decided after it: cut again
		{400 * time.Millisecond, 350 * time.Millisecond, 13.72},
	} {
		l.now = t0.Add(step.at)
		var decided time.Time
		if step.decided >= 0 {
			decided = t0.Add(step.decided)
		}
		d, err := l.BlockCall(ctx, s, Request{}, l.now.Add(time.Second), decided)
		if err != nil {
			t.Fatal(err)
		}
		near(t, fmt.Sprintf("Redis, block at %v of a call decided at %v", step.at, step.decided), rateOf(t, d, 0), step.want)
		md, err := m.BlockCallAt(l.now, s, Request{}, l.now.Add(time.Second), decided)
		if err != nil {
			t.Fatal(err)
		}
		near(t, fmt.Sprintf("model, block at %v of a call decided at %v", step.at, step.decided), rateOf(t, md, 0), step.want)
	}
}
