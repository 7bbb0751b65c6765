package quotas

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
)

// TestPriorityProperty drives the Go model (the Lua's mirror, checked
// against it by TestDifferentialBookings) with random fleets on explicit
// time: a fair GCRA rule with priorities (5-20/s, burst 1-3, aging 0.5-2 s)
// and 60 s of tasks, booked as they arrive, each checking its booking at
// its slot and deciding again when it was taken over, as the middleware
// does. Two or three businesses (weights 1-3) have tasks of level 1 and of
// level 5: one level asks for 1.5 times the rate, the other for half its
// share of it (the businesses' weights over both levels'). From the limit,
// the weights and the aging alone:
//
//   - the runs never exceed the rate: at most burst + span/T in any span;
//   - level 1 light, level 5 overloaded (each business's password resets
//     beside its own newsletters): no level-1 task waits more than a
//     second (at one level, they would wait behind their business's
//     backlog: seconds, growing);
//   - level 1 overloaded: the level-5 tasks are held back, not starved.
//     The ideal is a queue served one task per T in arrival order, a
//     level-5 task counted 4 agings late: each runs within twice its wait
//     there and 2 s (a task taken over learns it at its slot, and decides
//     again then) and, once the level-1 tasks have been over their share
//     for 20 s, within 4 agings and 2 s;
//   - in both, the overloaded level's businesses share what it gets by
//     weight, each within 15 % of its weight's part, over the 10-50 s span.
func TestPriorityProperty(t *testing.T) {
	for seed := range uint64(8) {
		for _, heavy := range []int{1, 5} {
			t.Run(fmt.Sprintf("%d/level-%d-overloaded", seed, heavy), func(t *testing.T) {
				t.Parallel()
				priorityFleet(t, seed, heavy)
			})
		}
	}
}

// pTask is a task of priorityFleet: its flow, when it arrived, its
// current decision and when it ran (zero: not yet).
type pTask struct {
	flow    int
	arrived time.Time
	d       Decision
	ran     time.Time
}

func priorityFleet(t *testing.T, seed uint64, heavy int) {
	rng := rand.New(rand.NewPCG(seed, 29))
	rate, burst := 5+rng.IntN(16), 1+rng.IntN(3)
	aging := time.Duration(500+rng.IntN(1501)) * time.Millisecond
	lim := gcra.Limit{Rate: float64(rate), Period: time.Second, Burst: burst}
	set := mustSet(Rule{Name: "vendor", Fair: true, Aging: aging, Limit: GCRA(lim)})
	type flow struct {
		name          string
		level, weight int
		every         time.Duration // between arrivals
	}
	// Two or three businesses, each with tasks of both levels.
	var flows []flow
	sum := map[int]int{} // weights per level
	for i := range 2 + rng.IntN(2) {
		w := 1 + rng.IntN(3)
		for _, level := range []int{1, 5} {
			sum[level] += w
			flows = append(flows, flow{name: fmt.Sprintf("b%d", i), level: level, weight: w})
		}
	}
	for i, f := range flows {
		// The heavy level asks for 1.5 times the rate, the other for half
		// its share, each flow by its weight.
		ask := 1.5 * float64(rate) * float64(f.weight) / float64(sum[f.level])
		if f.level != heavy {
			ask = 0.5 * float64(rate) * float64(f.weight) / float64(sum[1]+sum[5])
		}
		flows[i].every = time.Duration(float64(time.Second) / ask)
	}
	req := func(f flow) Request {
		return Request{Fair: []string{f.name}, Weights: []int{f.weight}, Priorities: []int{f.level}}
	}
	m := NewModel()
	t0 := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	end := t0.Add(60 * time.Second)
	reserve := func(now time.Time, tk *pTask) {
		d, err := m.ReserveAt(now, set, req(flows[tk.flow]), time.Hour)
		if err != nil || !d.Allowed {
			t.Fatalf("reserve for %s at %v: %+v %v", flows[tk.flow].name, now.Sub(t0), d, err)
		}
		tk.d = d
	}
	next := make([]time.Time, len(flows))
	for i := range flows {
		next[i] = t0.Add(time.Duration(rng.Int64N(int64(flows[i].every))))
	}
	var tasks []*pTask
	retakes := 0
	for now := t0; now.Before(end); now = now.Add(5 * time.Millisecond) {
		for i := range flows {
			for !next[i].After(now) && next[i].Before(end) {
				tk := &pTask{flow: i, arrived: now}
				reserve(now, tk)
				tasks = append(tasks, tk)
				next[i] = next[i].Add(flows[i].every)
			}
		}
		for _, tk := range takenOver(t, m, set, now, tasks, func(f int) Request { return req(flows[f]) }) {
			retakes++
			reserve(now, tk)
		}
	}
	// The ideal for level 1 overloaded: a queue served one task per T in
	// the order of the tasks' arrivals, a level-5 task's counted 4 agings
	// late (never run before it arrived; the burst ignored). The fair
	// tags only bring a light flow forward, so the level-5 tasks must run
	// no later than there, and a second.
	ideal := map[*pTask]time.Time{}
	if heavy == 1 {
		order := slices.Clone(tasks)
		late := func(tk *pTask) time.Time {
			if flows[tk.flow].level == 5 {
				return tk.arrived.Add(4 * aging)
			}
			return tk.arrived
		}
		slices.SortStableFunc(order, func(a, b *pTask) int { return late(a).Compare(late(b)) })
		var at time.Time
		for _, tk := range order {
			at = maxTime(tk.arrived, at.Add(lim.Interval()))
			ideal[tk] = at
		}
	}
	var runs []time.Time
	ran := map[int]int{}
	var lightMax, over, steady time.Duration
	for _, tk := range tasks {
		if tk.ran.IsZero() {
			continue
		}
		runs = append(runs, tk.ran)
		if flows[tk.flow].level != heavy {
			lightMax = max(lightMax, tk.ran.Sub(tk.arrived))
			if at, ok := ideal[tk]; ok {
				// How far past twice its ideal wait it ran; and, once the
				// level-1 flows have been over their share for 20 s, past
				// 4 agings.
				over = max(over, tk.ran.Sub(tk.arrived)-2*at.Sub(tk.arrived))
				if !tk.arrived.Before(t0.Add(20 * time.Second)) {
					steady = max(steady, tk.ran.Sub(tk.arrived))
				}
			}
		} else if !tk.ran.Before(t0.Add(10*time.Second)) && tk.ran.Before(t0.Add(50*time.Second)) {
			ran[tk.flow]++
		}
	}
	checkRuns(t, runs, lim, t0)
	t.Logf("%d/s burst %d, aging %v, weights %d and %d: %d tasks, %d decided again; the light level's tasks waited %v at most (%v from 20 s on), %v at most past twice the ideal", rate, burst, aging, sum[1], sum[5], len(tasks), retakes, lightMax, steady, over)
	switch {
	case heavy == 5 && lightMax > time.Second:
		t.Errorf("a level-1 task waited %v, over 1s", lightMax)
	case heavy == 1 && over > 2*time.Second:
		t.Errorf("a level-5 task ran %v after twice its ideal wait, over 2s", over)
	case heavy == 1 && steady > 4*aging+2*time.Second:
		t.Errorf("from 20 s on, a level-5 task waited %v, over 4 agings (%v) and 2s", steady, 4*aging)
	}
	total := 0
	for _, n := range ran {
		total += n
	}
	for i, f := range flows {
		if f.level != heavy {
			continue
		}
		want := float64(total) * float64(f.weight) / float64(sum[heavy])
		t.Logf("%s (weight %d) ran %d of its level's runs, its share %.1f (%.2fx)", f.name, f.weight, ran[i], want, float64(ran[i])/want)
		if d := float64(ran[i]) - want; d > 0.15*want || d < -0.15*want {
			t.Errorf("%s ran %d, more than 15%% from its weight's share of %.1f", f.name, ran[i], want)
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// takenOver checks the booking of each task due by now and not run yet, as
// the middleware does at its slot: a task that still holds it runs then;
// the tasks whose booking was taken over are returned, to decide again.
func takenOver(t *testing.T, m *Model, set *Set, now time.Time, tasks []*pTask, req func(flow int) Request) []*pTask {
	t.Helper()
	var out []*pTask
	for _, tk := range tasks {
		if !tk.ran.IsZero() || tk.d.Now.Add(tk.d.Delay).After(now) {
			continue
		}
		held, err := m.HeldAt(now, set, req(tk.flow), tk.d)
		if err != nil {
			t.Fatal(err)
		}
		if held {
			tk.ran = tk.d.Now.Add(tk.d.Delay)
		} else {
			out = append(out, tk)
		}
	}
	return out
}

// checkRuns fails t when the runs (moments, any order) exceed GCRA limit
// lim in any span of up to 10 s: more than burst + span/T of them.
func checkRuns(t *testing.T, runs []time.Time, lim gcra.Limit, t0 time.Time) {
	t.Helper()
	slices.SortFunc(runs, func(a, b time.Time) int { return a.Compare(b) })
	em := lim.Interval()
	for i := range runs {
		for j := i; j < len(runs) && runs[j].Sub(runs[i]) <= 10*time.Second; j++ {
			if allowed := lim.Burst + int(runs[j].Sub(runs[i])/em); j-i+1 > allowed {
				t.Fatalf("%d runs in %v from %v, over the limit's %d", j-i+1, runs[j].Sub(runs[i]), runs[i].Sub(t0), allowed)
			}
		}
	}
}
