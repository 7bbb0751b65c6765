package quotas

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestSplitProperty: random fleets (2-5 processes on one Redis, an
// explicit clock) decide a set of one or two global rules and one or two
// keyed rules (fixed, calendar or sliding windows or GCRA rules, in a
// random order), all prefetching, for one hot key and 40 cold ones, by
// Allow, Reserve and ReserveAndAllow (beside a per-key concurrency rule),
// under phases of 0.5x, 3x (twice as long) and 0.5x the tightest global
// rule; a tenth of
// the admissions are refunded at once and a twentieth later from their
// Receipt by another process. What was handed out, net of refunds, is
// checked against each rule computed from the rule alone (checkHandouts):
// a global rule over every request, a keyed rule per key. A Receipt's
// refund gives back the keyed rules only of a split decision (its global
// units were taken ahead by the process that decided it), so those stay
// counted for the global rules. Where the slow phase leaves the global
// rules far from their limit and the cold keys' requests come to each
// process twice a prefetch (their global pool stays warm), most of their
// admissions in it must have been split, and at least 3 seeds must be
// such, or the test would not test the split.
func TestSplitProperty(t *testing.T) {
	dense := 0
	for seed := range uint64(12) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			if splitProperty(t, seed) {
				dense++
			}
		})
	}
	if dense < 3 {
		t.Errorf("%d seeds had the global pool warm: the split was hardly tested", dense)
	}
}

// splitProperty runs one seed and reports whether its slow phase was
// dense enough to check that cold keys' admissions were split.
func splitProperty(t *testing.T, seed uint64) bool {
	rng := rand.New(rand.NewPCG(seed, 29))
	prefetch := time.Duration(10+rng.IntN(41)) * time.Millisecond
	procs := 2 + rng.IntN(4)
	// The tightest global rule's spacing between units, and the phase
	// length: three of the longest window (a GCRA rule: a second). Even
	// seeds draw global rules until the slow phase is dense (below).
	var global, keyed []propRule
	var spacing, phase time.Duration
	for try := 0; try == 0 || seed%2 == 0 && try < 100 && 6*time.Duration(procs)*spacing >= prefetch/2; try++ {
		global, spacing, phase = nil, 0, 0
		for i := range 1 + rng.IntN(2) {
			global = append(global, randomPrefetchRule(rng, fmt.Sprint("g", i), prefetch))
		}
		for _, r := range global {
			sp := r.every / time.Duration(r.limit)
			if _, ok := r.r.Limit.(GCRA); ok {
				sp, phase = r.every, max(phase, 3*time.Second)
			} else {
				phase = max(phase, 3*r.every)
			}
			spacing = max(spacing, sp)
		}
	}
	for i := range 1 + rng.IntN(2) {
		keyed = append(keyed, randomPrefetchRule(rng, fmt.Sprint("k", i), prefetch))
	}
	all := append(slices.Clone(global), keyed...)
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	var rs []Rule
	isKeyed := make([]bool, len(all))
	for i, r := range all {
		rs = append(rs, r.r)
		isKeyed[i] = r.r.Name[0] == 'k'
	}
	set := mustSet(rs...)
	slots := mustSet(Rule{Name: "slots", Limit: Concurrency{Max: 1000, Lease: 30 * time.Second}})
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	ls, _ := limitersOn(t, procs, &now)
	ctx := context.Background()
	keys := []string{"hot"}
	for i := range 40 {
		keys = append(keys, fmt.Sprint("cold", i))
	}
	request := func(key string, cost int) Request {
		req := Request{Keys: make([]string, len(all)), Cost: cost}
		for i := range all {
			if isKeyed[i] {
				req.Keys[i] = key
			}
		}
		return req
	}
	// Handouts by id: at, cost and key; a handout refunded from its
	// Receipt after a split decision leaves the keyed rules only.
	type charge struct {
		h       handout
		key     string
		keyedOK bool // still counted by the keyed rules
		req     Request
		d       Decision
	}
	var charges []*charge
	requests, admitted, refunded, receipts, coldAdmitted, coldSplit := 0, 0, 0, 0, 0, 0
	// The slow phase's requests of cold keys come to each process every
	// 2 x 3 spacings x procs on average.
	dense := 6*time.Duration(procs)*spacing < prefetch/2
	for p, factor := range []float64{0.5, 3, 0.5} {
		end := now.Add(phase)
		if p == 1 {
			end = now.Add(2 * phase) // long enough for the pools to warm
		}
		for now.Before(end) {
			now = now.Add(time.Duration(rng.Int64N(int64(2*factor*float64(spacing)))) + 1)
			cost := 1
			if rng.IntN(5) == 0 {
				cost = 2 + rng.IntN(2)
			}
			key := keys[0]
			if rng.IntN(2) == 0 {
				key = keys[1+rng.IntN(len(keys)-1)]
			}
			l := ls[rng.IntN(procs)]
			req := request(key, cost)
			requests++
			var d Decision
			var err error
			switch x := rng.IntN(4); {
			case x < 2:
				d, err = l.Allow(ctx, set, req)
			case x < 3:
				d, err = l.Reserve(ctx, set, req, time.Duration(rng.Int64N(int64(phase/3))))
			default:
				var sd Decision
				d, sd, _, err = l.ReserveAndAllow(ctx, set, req, time.Duration(rng.Int64N(int64(phase/3))), slots, Request{Keys: []string{key}, Holder: fmt.Sprint("h", requests)})
				for _, lease := range sd.Leases {
					if _, err := l.Release(ctx, lease); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				continue
			}
			admitted++
			if key != "hot" && p == 1 {
				coldAdmitted++
				if d.split != nil {
					coldSplit++
				}
			}
			if d.split != nil && d.Delay != 0 {
				t.Fatalf("a split decision booked %v ahead: only now is split", d.Delay)
			}
			if rng.IntN(10) == 0 {
				refunded++
				if err := l.Refund(ctx, set, req, d); err != nil {
					t.Fatal(err)
				}
				continue
			}
			charges = append(charges, &charge{h: handout{at: now.Add(d.Delay).UnixMicro(), cost: cost}, key: key, keyedOK: true, req: req, d: d})
			if len(charges) > 10 && rng.IntN(20) == 0 {
				// A Receipt refunded by another process, as a worker does
				// for a task booked elsewhere that did not run.
				c := charges[rng.IntN(len(charges)-5)]
				if c.d.pf != nil || !c.keyedOK {
					continue // a receipt of pooled units refunds nothing
				}
				rd, err := ParseReceipt(c.d.Receipt())
				if err != nil {
					t.Fatal(err)
				}
				if err := ls[rng.IntN(procs)].Refund(ctx, set, c.req, rd); err != nil {
					t.Fatal(err)
				}
				receipts++
				c.keyedOK = false
				if c.d.split == nil {
					c.h.cost = 0 // every rule got it back
				}
			}
		}
	}
	sorted := func(keep func(c *charge) bool) []handout {
		var out []handout
		for _, c := range charges {
			if keep(c) && c.h.cost > 0 {
				out = append(out, c.h)
			}
		}
		slices.SortStableFunc(out, func(a, b handout) int { return int(a.at - b.at) })
		return out
	}
	start := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, r := range all {
		if r.r.Name[0] == 'g' {
			checkHandouts(t, r, sorted(func(*charge) bool { return true }), start)
			continue
		}
		for _, k := range keys {
			checkHandouts(t, r, sorted(func(c *charge) bool { return c.key == k && c.keyedOK }), start)
		}
	}
	if dense && (coldAdmitted == 0 || coldSplit*2 < coldAdmitted) {
		t.Errorf("%d of %d admissions of cold keys in the slow phase split: want most", coldSplit, coldAdmitted)
	}
	t.Logf("%d processes, prefetch %v, rules %v: %d requests, %d admitted (%d refunded, %d by receipt); slow phase (dense %v): %d of %d cold keys' admissions split",
		procs, prefetch, rs, requests, admitted, refunded, receipts, dense, coldSplit, coldAdmitted)
	return dense
}
