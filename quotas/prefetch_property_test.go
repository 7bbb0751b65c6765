package quotas

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/limits"
)

// TestPrefetchProperty: random fleets (2-6 processes on one Redis, an
// explicit clock) prefetch random sets (a fixed, calendar or sliding
// window or a GCRA rule, alone or two together) under random traffic
// (phases at 2x, a third of and again 2x the tightest rule, costs 1-3, a
// tenth of admissions refunded at once, a process's GiveBack now and
// then). What was handed out, net of refunds, is checked against each
// rule's limit computed from the rule alone: no fixed or calendar window
// over its limit, no span of a sliding window's Every over its limit, no
// span [a, b] of a GCRA rule over Burst + (b-a)/T. A window busy to its
// end (a request denied by it in its last tenth, within a 2x phase) hands
// out at least its limit less what the processes can hold when it ends:
// processes × (the set's batch + the largest cost) + the largest cost
// (the bound docs/design.md states). Every 101st request, a fixed
// window's count in Redis is what was handed out in it plus what the
// pools hold. The seeds run side by side: their clocks are explicit.
func TestPrefetchProperty(t *testing.T) {
	for seed := range uint64(16) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			prefetchProperty(t, seed)
		})
	}
}

// propRule is a rule of the property test with what its checks need.
type propRule struct {
	r      Rule
	every  time.Duration // a window's length; a GCRA rule's interval
	limit  int           // a window's limit; a GCRA rule's burst
	window func(µs int64) int64
}

// pace returns the tightest of rules' spacings between units, and a
// phase length: three of the longest window (a GCRA rule: a second).
func pace(rules []propRule) (spacing, phase time.Duration) {
	for _, r := range rules {
		sp := r.every / time.Duration(r.limit)
		if _, ok := r.r.Limit.(GCRA); ok {
			sp, phase = r.every, max(phase, 3*time.Second)
		} else {
			phase = max(phase, 3*r.every)
		}
		spacing = max(spacing, sp)
	}
	return spacing, phase
}

func randomPrefetchRule(rng *rand.Rand, name string, prefetch time.Duration) propRule {
	fixed := func(every time.Duration) func(int64) int64 {
		return func(t int64) int64 { return t - t%every.Microseconds() }
	}
	switch rng.IntN(4) {
	case 0:
		every := []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, time.Second}[rng.IntN(3)]
		n := 64 + rng.IntN(440)
		return propRule{Rule{Name: name, Limit: FixedWindow{Limit: n, Every: every}, Prefetch: prefetch}, every, n, fixed(every)}
	case 1:
		n := 128 + rng.IntN(400)
		return propRule{Rule{Name: name, Limit: CalendarWindow{Limit: n, Cron: "* * * * *"}, Prefetch: prefetch}, time.Minute, n, fixed(time.Minute)}
	case 2:
		every := []time.Duration{100 * time.Millisecond, time.Second}[rng.IntN(2)]
		n := 64 + rng.IntN(440)
		return propRule{r: Rule{Name: name, Limit: SlidingWindow{Limit: n, Every: every}, Prefetch: prefetch}, every: every, limit: n}
	}
	g := gcra.Limit{Rate: float64(200 + rng.IntN(1800)), Period: time.Second, Burst: 1}
	g.Burst = int(limits.Ahead(GCRA(g), prefetch)) + 1 + rng.IntN(60)
	return propRule{r: Rule{Name: name, Limit: GCRA(g), Prefetch: prefetch}, every: g.Interval(), limit: g.Burst}
}

func prefetchProperty(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 28))
	prefetch := time.Duration(1+rng.IntN(100)) * time.Millisecond
	rules := []propRule{randomPrefetchRule(rng, "a", prefetch)}
	if rng.IntN(2) == 0 {
		rules = append(rules, randomPrefetchRule(rng, "b", prefetch))
	}
	var rs []Rule
	for _, r := range rules {
		rs = append(rs, r.r)
	}
	set, err := NewSet(rs...)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	procs := 2 + rng.IntN(5)
	ls, _ := limitersOn(t, procs, &now)
	ctx := context.Background()
	spacing, phase := pace(rules)
	const maxCost = 3
	var out []handout
	type windowLog struct{ lastDenial int64 }
	busy := map[[2]int64]*windowLog{} // rule index, window start -> denials in a 2x phase
	start := now
	requests, admitted, refunded := 0, 0, 0
	for p, factor := range []float64{0.5, 3, 0.5} {
		end := now.Add(phase)
		for now.Before(end) {
			now = now.Add(time.Duration(rng.Int64N(int64(2*factor*float64(spacing)))) + 1)
			cost := 1
			if rng.IntN(5) == 0 {
				cost = 2 + rng.IntN(maxCost-1)
			}
			l := ls[rng.IntN(procs)]
			requests++
			d, err := l.Allow(ctx, set, Request{Cost: cost})
			if err != nil {
				t.Fatal(err)
			}
			at := now.UnixMicro()
			if !d.Allowed {
				if i := slices.IndexFunc(rules, func(r propRule) bool { return r.r.Name == d.Rule }); i >= 0 && rules[i].window != nil && p != 1 {
					w := [2]int64{int64(i), rules[i].window(at)}
					if busy[w] == nil {
						busy[w] = &windowLog{}
					}
					busy[w].lastDenial = at
				}
				continue
			}
			admitted++
			if rng.IntN(10) == 0 {
				refunded++
				if err := l.Refund(ctx, set, Request{Cost: cost}, d); err != nil {
					t.Fatal(err)
				}
			} else {
				out = append(out, handout{at, cost})
			}
			if rng.IntN(200) == 0 {
				if err := ls[rng.IntN(procs)].GiveBack(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if requests%101 == 0 {
				// A fixed window's count in Redis: handed out plus pooled.
				for i, r := range rules {
					if _, ok := r.r.Limit.(FixedWindow); !ok {
						continue
					}
					st, err := ls[0].Status(ctx, set, Request{})
					if err != nil {
						t.Fatal(err)
					}
					w, handed := r.window(at), 0
					for _, h := range out {
						if r.window(h.at) == w {
							handed += h.cost
						}
					}
					pooled := pooledUnits(ls, func(g grant) bool { return r.window(g.now.UnixMicro()) == w })
					if st.Rules[i].Used != handed+pooled {
						t.Fatalf("at %v rule %s counts %d; %d handed out and %d pooled", now.Sub(start), r.r.Name, st.Rules[i].Used, handed, pooled)
					}
				}
			}
		}
	}
	// The checks, from the rules alone.
	slack := procs*(int(set.batchMax)+maxCost) + maxCost
	worst := map[string]int{} // a busy window's shortfall
	for i, r := range rules {
		per := checkHandouts(t, r, out, start)
		if r.window == nil {
			continue
		}
		for w, b := range busy {
			if w[0] != int64(i) || b.lastDenial < w[1]+r.every.Microseconds()*9/10 {
				continue
			}
			short := r.limit - per[w[1]]
			worst[r.r.Name] = max(worst[r.r.Name], short)
			if short > slack {
				t.Errorf("rule %s: the window at %v, busy to its end, handed out %d of %d: more than %d short", r.r.Name, time.UnixMicro(w[1]).Sub(start), per[w[1]], r.limit, slack)
			}
		}
	}
	t.Logf("%d processes, prefetch %v, rules %v: %d requests, %d admitted (%d refunded); busy windows' largest shortfall %v (bound %d)",
		procs, prefetch, rs, requests, admitted, refunded, worst, slack)
}

// handout is units handed out: cost of them, at µs.
type handout struct {
	at   int64
	cost int
}

// checkHandouts checks out (in time order) against rule r computed from
// the rule alone: no fixed or calendar window over its limit, no span of a
// sliding window's Every over its limit, no span [a, b] of a GCRA rule over
// Burst + (b-a)/T. It returns a window rule's units per window start.
func checkHandouts(t *testing.T, r propRule, out []handout, start time.Time) map[int64]int {
	t.Helper()
	switch l := r.r.Limit.(type) {
	case FixedWindow, CalendarWindow:
		per := map[int64]int{}
		for _, h := range out {
			per[r.window(h.at)] += h.cost
		}
		for w, n := range per {
			if n > r.limit {
				t.Errorf("rule %s: the window at %v handed out %d, limit %d", r.r.Name, time.UnixMicro(w).Sub(start), n, r.limit)
			}
		}
		return per
	case SlidingWindow:
		every := l.Every.Microseconds()
		n, lo := 0, 0
		for _, h := range out {
			n += h.cost
			for out[lo].at <= h.at-every {
				n -= out[lo].cost
				lo++
			}
			if n > r.limit {
				t.Fatalf("rule %s: %d handed out in the %v up to %v, limit %d", r.r.Name, n, l.Every, time.UnixMicro(h.at).Sub(start), r.limit)
			}
		}
	case GCRA:
		em := gcra.Limit(l).Interval().Microseconds()
		for a := range out {
			n := 0
			for b := a; b < len(out); b++ {
				n += out[b].cost
				span := out[b].at - out[a].at
				if int64(n) > int64(l.Burst)+span/em {
					t.Fatalf("rule %s: %d handed out in %v from %v, more than burst %d + one per %v", r.r.Name, n, time.Duration(span)*time.Microsecond, time.UnixMicro(out[a].at).Sub(start), l.Burst, gcra.Limit(l).Interval())
				}
			}
		}
	}
	return nil
}
