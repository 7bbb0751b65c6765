package quotas

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
)

// TestWeightedShareProperty drives the Go model (the Lua's mirror, checked
// against it by TestDifferentialBookings) on explicit time as the
// middleware drives a fair rule: three businesses of distinct random
// weights (1-4) under 8-20/s enqueue a backlog at once, interleaved, one task every 1-10 ms; each
// task is booked as it arrives, checks its booking at its slot and decides
// again when it was taken over. The backlogs are sized so that one
// business runs out after about 8 s and another some 10 s later. From the
// limit and the weights alone:
//
//   - in every 5 s span (starting 100 ms apart) while all three have work,
//     each makes its weight's share of the rate's calls within 10 % and one
//     call (a span's edges may cut one call either way);
//   - from a second after the first business's last call until the next
//     one's last, the other two share the rate by weight within 50 % and
//     one call (measured 0.72-1.43x at worst, most seeds 0.90-1.11x:
//     docs/design.md 1.5 says why not closer);
//   - no span has more calls than the limit allows, and the tasks decided
//     again are at most 1.6 per task.
//
// Before tags were returned to their flows (session 31), the first bar
// failed: 0.70-1.35x of the shares.
func TestWeightedShareProperty(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			weightedFleet(t, seed)
		})
	}
}

func weightedFleet(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 31))
	rate := 8 + rng.IntN(13)
	lim := gcra.Limit{Rate: float64(rate), Period: time.Second, Burst: 1}
	set := mustSet(Rule{Name: "vendor", Fair: true, Limit: GCRA(lim)})
	gap := time.Duration(1+rng.IntN(10)) * time.Millisecond
	weights := rng.Perm(4)[:3] // three of 1-4, in random order
	for f := range weights {
		weights[f]++
	}
	// At the shares, b0 has work for 8 s; b1 for 12 s more beside b2 alone,
	// and b2 for 5 s more on its own.
	w0, w1, w2 := float64(weights[0]), float64(weights[1]), float64(weights[2])
	r, all := float64(rate), w0+w1+w2
	counts := []int{int(8 * r * w0 / all), int(8*r*w1/all + 12*r*w1/(w1+w2)), int(8*r*w2/all + 12*r*w2/(w1+w2) + 5*r)}
	req := func(f int) Request {
		return Request{Fair: []string{fmt.Sprint("b", f)}, Weights: []int{weights[f]}}
	}
	var order []int
	for i := range slices.Max(counts) {
		for f := range 3 {
			if i < counts[f] {
				order = append(order, f)
			}
		}
	}
	m := NewModel()
	t0 := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	var tasks []*pTask
	again, next, arrive := 0, 0, t0
	end := t0.Add(time.Duration(len(order)+10*rate) * lim.Interval())
	for now := t0; now.Before(end); now = now.Add(time.Millisecond) {
		for next < len(order) && !arrive.After(now) {
			f := order[next]
			d, err := m.ReserveAt(now, set, req(f), time.Hour)
			if err != nil || !d.Allowed {
				t.Fatalf("reserve at %v: %+v %v", now.Sub(t0), d, err)
			}
			tasks = append(tasks, &pTask{flow: f, arrived: now, d: d})
			next, arrive = next+1, arrive.Add(gap)
		}
		for _, tk := range takenOver(t, m, set, now, tasks, req) {
			again++
			err := m.RefundAt(now, set, req(tk.flow), tk.d)
			if err != nil {
				t.Fatal(err)
			}
			if tk.d, err = m.ReserveAt(now, set, req(tk.flow), time.Hour); err != nil || !tk.d.Allowed {
				t.Fatalf("reserve again at %v: %+v %v", now.Sub(t0), tk.d, err)
			}
		}
	}
	var runs []time.Time
	last := make([]time.Time, 3)
	for _, tk := range tasks {
		if tk.ran.IsZero() {
			t.Fatalf("a task of b%d never ran", tk.flow)
		}
		runs = append(runs, tk.ran)
		last[tk.flow] = maxTime(last[tk.flow], tk.ran)
	}
	checkRuns(t, runs, lim, t0)
	// check tests every 5 s span from `from` that ends by `to`, for the
	// busy flows.
	check := func(what string, from, to time.Time, busy []int, margin float64) {
		const span = 5 * time.Second
		w := 0
		for _, f := range busy {
			w += weights[f]
		}
		lo, hi := 9.0, 0.0
		for s := from; !s.Add(span).After(to); s = s.Add(100 * time.Millisecond) {
			for _, f := range busy {
				n := 0
				for _, tk := range tasks {
					if tk.flow == f && !tk.ran.Before(s) && tk.ran.Before(s.Add(span)) {
						n++
					}
				}
				want := float64(rate*weights[f]) / float64(w) * span.Seconds()
				lo, hi = min(lo, float64(n)/want), max(hi, float64(n)/want)
				if d := float64(n) - want; d > margin*want+1 || d < -margin*want-1 {
					t.Errorf("%s: b%d (weight %d of %d) made %d calls in the 5 s from %v, its share %.1f", what, f, weights[f], w, n, s.Sub(t0), want)
				}
			}
		}
		if hi == 0 {
			t.Fatalf("%s: no 5 s span from %v to %v", what, from.Sub(t0), to.Sub(t0))
		}
		t.Logf("%s: %.2f-%.2fx of the shares", what, lo, hi)
	}
	t.Logf("%d/s, weights %v, %v between arrivals: %d tasks, %d decided again", rate, weights, gap, len(tasks), again)
	check("all three", t0, last[0], []int{0, 1, 2}, 0.1)
	check("b0 done", last[0].Add(time.Second), last[1], []int{1, 2}, 0.5)
	if float64(again) > 1.6*float64(len(tasks)) {
		t.Errorf("%d tasks decided again of %d, over 1.6 a task", again, len(tasks))
	}
}
