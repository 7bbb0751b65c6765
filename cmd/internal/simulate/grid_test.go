package simulate

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
)

// gridCell is one vendor an adaptive rule must learn: its rate (per
// second) and burst, how its 429s say when to try again, the shape of its
// limit over time and the workers calling it.
type gridCell struct {
	rate    float64
	burst   int
	ra      RetryAfter
	shape   string // const (3 min), up2, up4 (a quarter or half the rate, then the rate), down2, down4 (the reverse), 90 s each
	workers int
}

func (c gridCell) String() string {
	return fmt.Sprintf("%g/s burst %d, %s, retry-after %s, %d workers", c.rate, c.burst, c.shape, c.ra, c.workers)
}

// vendor is the cell's vendor and how long it runs.
func (c gridCell) vendor() (Vendor, time.Duration) {
	at := func(r float64, d time.Duration) Phase {
		return Phase{Limit: gcra.Limit{Rate: r, Period: time.Second, Burst: c.burst}, For: d}
	}
	v := Vendor{RetryAfter: c.ra}
	step := 90 * time.Second
	switch c.shape {
	case "const":
		v.Phases = []Phase{at(c.rate, 0)}
		return v, 3 * time.Minute
	case "up2":
		v.Phases = []Phase{at(c.rate/2, step), at(c.rate, 0)}
	case "up4":
		v.Phases = []Phase{at(c.rate/4, step), at(c.rate, 0)}
	case "down2":
		v.Phases = []Phase{at(c.rate, step), at(c.rate/2, 0)}
	case "down4":
		v.Phases = []Phase{at(c.rate, step), at(c.rate/4, 0)}
	}
	return v, 2 * step
}

// gridResult is what a cell measured: the share of calls answered 429,
// and the lowest share of the vendor's rate used in a phase, from 10 s
// after it began.
type gridResult struct {
	throttled, used float64
}

// ok reports whether r meets issue 31's bars: at most 2 % of calls
// answered 429, at least 85 % of the vendor's rate used.
func (r gridResult) ok() bool { return r.throttled <= 0.02 && r.used >= 0.85 }

// evenBound is the most of a vendor's rate (rate per second, burst) a
// sender can use with at most 2 % of its calls answered 429 when it
// spaces its calls evenly, each reaching the vendor up to jitter later
// (uniformly, as the simulator's calls do): computed from the limits
// alone, on a GCRA of its own (a call passes when it arrives no earlier
// than the theoretical arrival time less burst-1 intervals), over 20,000
// calls at each share of the rate from 1 % to 100 %. A vendor of 300/s
// and burst 1 (3.3 ms between calls) with 2 ms of jitter: 66 %; pacing
// closer draws more 429s than it gains (85 %: 24 % of calls 429).
func evenBound(rate float64, burst int, jitter time.Duration) float64 {
	em := 1 / rate
	tolerance := float64(burst-1) * em
	best := 0.0
	for pct := 1; pct <= 100; pct++ {
		u := float64(pct) / 100
		rng := rand.New(rand.NewPCG(1, 2))
		tat, passed, refused := 0.0, 0, 0
		const calls = 20000
		for i := range calls {
			at := float64(i)*em/u + rng.Float64()*jitter.Seconds()
			if at < tat-tolerance-1e-12 { // a float's rounding is no 429

				refused++
				continue
			}
			tat = max(tat, at) + em
			passed++
		}
		if float64(refused) <= 0.02*calls {
			best = max(best, u*float64(passed)/calls)
		}
	}
	return best
}

// bound is the least evenBound of c's vendor's limits under the
// simulator's jitter: below 85 %, no sender that spaces its calls evenly
// meets the bars against it. bounds caches evenBound by limit.
func (c gridCell) bound(bounds map[gcra.Limit]float64) float64 {
	v, _ := c.vendor()
	least := 1.0
	for _, p := range v.Phases {
		b, ok := bounds[p.Limit]
		if !ok {
			b = evenBound(p.Limit.Rate, p.Limit.Burst, defaultJitter)
			bounds[p.Limit] = b
		}
		least = min(least, b)
	}
	return least
}

// TestEvenBound checks evenBound against vendors whose answer is plain:
// with no jitter every share passes whole; a slow vendor's interval
// (20 ms) leaves 2 ms of jitter most of 85 %; at 300/s burst 1 the jitter is most of the
// interval and no even sender reaches 85 %; a burst of 5 absorbs it.
func TestEvenBound(t *testing.T) {
	for _, c := range []struct {
		rate     float64
		burst    int
		jitter   time.Duration
		lo, high float64
	}{
		{300, 1, 0, 0.999, 1},
		{50, 1, 2 * time.Millisecond, 0.85, 0.95},
		{300, 1, 2 * time.Millisecond, 0.6, 0.7},
		{300, 5, 2 * time.Millisecond, 0.99, 1},
	} {
		if got := evenBound(c.rate, c.burst, c.jitter); got < c.lo || got > c.high {
			t.Errorf("%g/s burst %d, jitter %v: %.3f of the rate, want %.2f-%.2f", c.rate, c.burst, c.jitter, got, c.lo, c.high)
		}
	}
}

// runCell simulates c under an adaptive rule that knows only a ceiling
// (twice the vendor's highest rate) and a floor (an eighth of its lowest).
func runCell(t *testing.T, c gridCell) gridResult {
	v, d := c.vendor()
	low, high := c.rate, c.rate
	for _, p := range v.Phases {
		low, high = min(low, p.Limit.Rate), max(high, p.Limit.Rate)
	}
	policy := fmt.Sprintf("rules:\n  - name: vendor\n    match: {type: \"http:call\"}\n    adaptive: {max: %g, min: %g, per: 1s}\n", 2*high, low/8)
	rep, err := Run(Spec{Policy: mustPolicy(t, policy), Type: "http:call", Vendor: v, Workers: c.workers, Duration: d, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	res := gridResult{throttled: rep.ThrottledShare(), used: 1}
	for _, p := range rep.Phases(v, d, 10*time.Second) {
		res.used = min(res.used, p.Used)
	}
	return res
}

// TestAdaptiveGrid runs the adaptive rule against the vendors of issue
// 31's grid in the simulator: rates 2-300/s, bursts 1-20, Retry-After in
// whole seconds, exact or absent, a constant limit for 3 minutes or a
// step up or down by 2x or 4x, 1 to 6 workers. By default a sample of the
// grid (a cell per rate, burst, Retry-After and shape, the workers
// rotating; every fifth of those under the race detector); with TASKRL_ADAPTIVE_GRID=full all 540 cells, and with
// TASKRL_ADAPTIVE_GRID_OUT=FILE the table written to FILE. It logs every
// cell and whether it meets the bars (at most 2 % of calls answered 429,
// at least 85 % of the vendor's rate used from 10 s after each change),
// and fails when more sampled cells miss them than sampledMissed, leaving
// out the cells whose bars no sender that spaces its calls evenly could
// meet under the simulator's jitter (evenBound: a vendor of 300/s and
// burst 1): it guards what the learner does (the simulation is
// deterministic), and the count falls as it learns more shapes.
func TestAdaptiveGrid(t *testing.T) {
	full := os.Getenv("TASKRL_ADAPTIVE_GRID") == "full"
	if testing.Short() && !full {
		t.Skip("a minute of simulation")
	}
	var cells []gridCell
	i := 0
	for _, rate := range []float64{2, 10, 50, 300} {
		for _, burst := range []int{1, 5, 20} {
			for _, ra := range []RetryAfter{WholeSeconds, Exact, NoRetryAfter} {
				for _, shape := range []string{"const", "up2", "up4", "down2", "down4"} {
					for wi, workers := range []int{1, 3, 6} {
						if full || wi == i%3 {
							cells = append(cells, gridCell{rate, burst, ra, shape, workers})
						}
					}
					i++
				}
			}
		}
	}
	if raceEnabled && !full {
		// Every fifth cell of the sample.
		var fifth []gridCell
		for i := 0; i < len(cells); i += 5 {
			fifth = append(fifth, cells[i])
		}
		cells = fifth
	}
	results := make([]gridResult, len(cells))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	for i, c := range cells {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			results[i] = runCell(t, c)
		}()
	}
	wg.Wait()
	var table strings.Builder
	table.WriteString("| vendor | shape | retry-after | workers | 429 % | lowest use % | bars |\n| --- | --- | --- | --- | --- | --- | --- |\n")
	var missed []string
	infeasible := 0
	bounds := map[gcra.Limit]float64{}
	for i, c := range cells {
		r := results[i]
		mark := "met"
		switch b := c.bound(bounds); {
		case r.ok():
		case b < 0.85:
			// No even sender meets the bars: not counted.
			mark = fmt.Sprintf("missed; an even sender uses at most %.0f %%", 100*b)
			infeasible++
		default:
			mark = "missed"
			missed = append(missed, fmt.Sprintf("%v: %.1f%% 429, %.0f%% used", c, 100*r.throttled, 100*r.used))
		}
		fmt.Fprintf(&table, "| %g/s burst %d | %s | %s | %d | %.1f | %.0f | %s |\n", c.rate, c.burst, c.shape, c.ra, c.workers, 100*r.throttled, 100*r.used, mark)
	}
	t.Logf("%d cells, %d miss the bars, and %d more that no even sender could meet (evenBound):\n%s", len(cells), len(missed), infeasible, table.String())
	if out := os.Getenv("TASKRL_ADAPTIVE_GRID_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(table.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	most := sampledMissed
	if raceEnabled {
		most = sampledMissedRace
	}
	if !full && len(missed) > most {
		slices.Sort(missed)
		t.Errorf("%d sampled cells miss the bars, more than the %d measured before:\n%s", len(missed), most, strings.Join(missed, "\n"))
	}
}

// sampledMissed is how many cells of the sample (180) missed the bars
// when the learner last changed, and sampledMissedRace how many of its
// every fifth cell (36), both leaving out the cells no even sender could
// meet (15 and 3: 300/s burst 1); lower them as the learner gets better.
// Before, on 2026-11-28 (docs/design.md 1.12): 109 and 13; probes
// confirmed 5 units above the good rate, 98 and 9; a dwell of 16 em up
// to 4 P, 92 and 7; a throttle before a probe's first unit nudging the
// good rate, 90 and 7; a hold of at least 100 em, 88 and 5; a second
// nudge within the hold cutting to 0.9, 83 and 5; the start cut hard at
// its first throttle, 80 and 2; probes back to the remembered rate only
// a hold after the last cut, 79 and 2; 5 P after a kept probe, 76 and 2;
// a search step of 20 % after a hard cut, 73 and 2; on 2026-11-29, the
// learned burst and a 10 % step after a kept 2 % probe, 70 and 2.
const sampledMissed, sampledMissedRace = 70, 2
