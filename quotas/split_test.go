package quotas

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// TestSplitProperty: 8 random fleets (2-5 processes on one Redis, an
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
// refund of units taken ahead (a split decision's global rules, a pooled
// decision's every rule) gives back their windows' counts only, so those
// units stay counted for GCRA and sliding rules. Where the slow phase leaves the global
// rules far from their limit and the cold keys' requests come to each
// process twice a prefetch (their global pool stays warm), most of their
// admissions in it must have been split, and at least 3 seeds must be
// such, or the test would not test the split.
// The seeds run side by side: their clocks are explicit.
func TestSplitProperty(t *testing.T) {
	redistest.Client(t) // skips without a server (-short)
	var dense atomic.Int32
	t.Run("seeds", func(t *testing.T) {
		for seed := range uint64(8) {
			t.Run(fmt.Sprint(seed), func(t *testing.T) {
				t.Parallel()
				if splitProperty(t, seed) {
					dense.Add(1)
				}
			})
		}
	})
	if dense := dense.Load(); dense < 3 {
		t.Errorf("%d seeds had the global pool warm: the split was hardly tested", dense)
	}
}

// splitProperty runs one seed and reports whether its slow phase was
// dense enough to check that cold keys' admissions were split.
func splitProperty(t *testing.T, seed uint64) bool {
	rng := rand.New(rand.NewPCG(seed, 29))
	prefetch := time.Duration(10+rng.IntN(41)) * time.Millisecond
	procs := 2 + rng.IntN(4)
	// The global rules' pace (spacing, phase). Even seeds draw global
	// rules until the slow phase is dense (below).
	var global, keyed []propRule
	var spacing, phase time.Duration
	for try := 0; try == 0 || seed%2 == 0 && try < 100 && 6*time.Duration(procs)*spacing >= prefetch/2; try++ {
		global = nil
		for i := range 1 + rng.IntN(2) {
			global = append(global, randomPrefetchRule(rng, fmt.Sprint("g", i), prefetch))
		}
		spacing, phase = pace(global)
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
	// Handouts with their key and the rules that still count them: a
	// handout refunded from its Receipt leaves every rule, but a unit taken
	// ahead (split or pooled) stays with the GCRA and sliding rules.
	type charge struct {
		h       handout
		key     string
		counted []bool // by rule index
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
			counted := make([]bool, len(all))
			for i := range counted {
				counted[i] = true
			}
			charges = append(charges, &charge{h: handout{at: now.Add(d.Delay).UnixMicro(), cost: cost}, key: key, counted: counted, req: req, d: d})
			if len(charges) > 10 && rng.IntN(20) == 0 {
				// A Receipt refunded by another process, as a worker does
				// for a task booked elsewhere that did not run.
				c := charges[rng.IntN(len(charges)-5)]
				if c.h.cost == 0 {
					continue // refunded already
				}
				rd, err := ParseReceipt(c.d.Receipt())
				if err != nil {
					t.Fatal(err)
				}
				if err := ls[rng.IntN(procs)].Refund(ctx, set, c.req, rd); err != nil {
					t.Fatal(err)
				}
				receipts++
				for i, r := range all {
					ahead := c.d.pf != nil || c.d.split != nil && !isKeyed[i]
					switch r.r.Limit.(type) {
					case GCRA, SlidingWindow:
						c.counted[i] = c.counted[i] && ahead
					default:
						c.counted[i] = false
					}
				}
				c.h.cost = 0
			}
		}
	}
	sorted := func(keep func(c *charge) bool) []handout {
		var out []handout
		for _, c := range charges {
			if keep(c) {
				out = append(out, handout{at: c.h.at, cost: c.d.cost})
			}
		}
		slices.SortStableFunc(out, func(a, b handout) int { return int(a.at - b.at) })
		return out
	}
	start := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for i, r := range all {
		if !isKeyed[i] {
			checkHandouts(t, r, sorted(func(c *charge) bool { return c.counted[i] }), start)
			continue
		}
		for _, k := range keys {
			checkHandouts(t, r, sorted(func(c *charge) bool { return c.key == k && c.counted[i] }), start)
		}
	}
	if dense && (coldAdmitted == 0 || coldSplit*2 < coldAdmitted) {
		t.Errorf("%d of %d admissions of cold keys in the slow phase split: want most", coldSplit, coldAdmitted)
	}
	t.Logf("%d processes, prefetch %v, rules %v: %d requests, %d admitted (%d refunded, %d by receipt); slow phase (dense %v): %d of %d cold keys' admissions split",
		procs, prefetch, rs, requests, admitted, refunded, receipts, dense, coldSplit, coldAdmitted)
	return dense
}

// skewHook makes the Limiter's clock skew estimate two days off right
// before each call that carries a lone pair of requests (ReserveAndAllow's
// job), so that a calendar rule's ticks miss the server's clock in it.
type skewHook struct {
	l     *Limiter
	armed atomic.Bool
}

func (h *skewHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *skewHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *skewHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if h.armed.Load() && len(a) > 3 && (a[0] == "fcall" || a[0] == "evalsha") {
			if nk, ok := a[2].(int); ok && len(a) > 3+nk && fmt.Sprint(a[3+nk]) == "2" {
				h.l.skew.Learn(time.Now().Add(-48*time.Hour), time.Now())
			}
		}
		return next(ctx, cmd)
	}
}

// TestSplitNoTicks: a split ReserveAndAllow whose keyed calendar rule's
// ticks miss the server's clock (the pair call replies ST.NO_TICKS) decides
// the keyed rules again in Redis, never from their own warm pool, so the
// split Decision carries their charges (it panicked on a pooled one), and
// a refund leaves nothing counted.
func TestSplitNoTicks(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.Client(t).Options().Addr})
	t.Cleanup(func() { _ = c.Close() })
	l, err := New(Config{Client: c, Prefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	h := &skewHook{l: l}
	c.AddHook(h)
	s := mustSet(
		Rule{Name: "g", Limit: GCRA{Rate: 100000, Period: time.Second, Burst: 100000}, Prefetch: 5 * time.Millisecond},
		Rule{Name: "k", Limit: CalendarWindow{Limit: 100000, Cron: "@daily"}, Prefetch: 100 * time.Millisecond},
	)
	slots := mustSet(Rule{Name: "slots", Limit: Concurrency{Max: 1000, Lease: time.Minute}})
	ctx := context.Background()
	n := 0
	raa := func(key string) Decision {
		t.Helper()
		n++
		rd, sd, _, err := l.ReserveAndAllow(ctx, s, Request{Keys: []string{"", key}}, 0, slots, Request{Holder: fmt.Sprint("h", n)})
		if err != nil || !rd.Allowed {
			t.Fatalf("%s: %+v %v", key, rd, err)
		}
		for _, ls := range sd.Leases {
			if _, err := l.Release(ctx, ls); err != nil {
				t.Fatal(err)
			}
		}
		return rd
	}
	var last Decision
	for round := range 2 {
		for j := range 30 {
			raa(fmt.Sprint("warm", round, j)) // the global pool warm
		}
		h.armed.Store(true)
		last = raa("k1") // the second time, k1's own pool is warm
		h.armed.Store(false)
		time.Sleep(15 * time.Millisecond)
	}
	if err := l.Refund(ctx, s, Request{Keys: []string{"", "k1"}}, last); err != nil {
		t.Fatal(err)
	}
	if err := l.GiveBack(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := l.Status(ctx, s, Request{Keys: []string{"", "k1"}}); err != nil || st.Rules[1].Used != 1 {
		t.Fatalf("k1's calendar window counts %+v, %v; want the first of two admissions only", st.Rules, err)
	}
}

// TestReceiptRefundsWindows: admissions from units taken ahead, split
// (cold keys) or whole (a hot key's own pool), refunded from their Receipt
// by another process, un-count their fixed and calendar windows, global
// ones included; a GCRA rule's unit stays spent.
func TestReceiptRefundsWindows(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	ls, _ := limitersOn(t, 2, &now)
	ctx := context.Background()
	s := mustSet(
		Rule{Name: "g", Limit: FixedWindow{Limit: 1000, Every: time.Hour}, Prefetch: 10 * time.Millisecond},
		Rule{Name: "d", Limit: CalendarWindow{Limit: 1000, Cron: "@daily"}, Prefetch: 10 * time.Millisecond},
		Rule{Name: "r", Limit: GCRA{Rate: 1000, Period: time.Second, Burst: 500}, Prefetch: 10 * time.Millisecond},
		Rule{Name: "k", Limit: FixedWindow{Limit: 1000, Every: time.Hour}, Prefetch: 10 * time.Millisecond},
	)
	var ds []Decision
	var reqs []Request
	split, pooled := 0, 0
	for i := range 40 {
		now = now.Add(100 * time.Microsecond)
		key := fmt.Sprint("cold", i)
		if i%2 == 0 {
			key = "hot"
		}
		req := Request{Keys: []string{"", "", "", key}}
		d, err := ls[0].Allow(ctx, s, req)
		if err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
		split += b2i(d.split != nil)
		pooled += b2i(d.pf != nil)
		ds, reqs = append(ds, d), append(reqs, req)
	}
	if split == 0 || pooled == 0 {
		t.Fatalf("%d split and %d pooled admissions of 40: the test tests neither", split, pooled)
	}
	for i, d := range ds {
		rd, err := ParseReceipt(d.Receipt())
		if err != nil {
			t.Fatal(err)
		}
		if err := ls[1].Refund(ctx, s, reqs[i], rd); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range ls {
		if err := l.GiveBack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, key := range []string{"hot", "cold1"} {
		st, err := ls[0].Status(ctx, s, Request{Keys: []string{"", "", "", key}})
		if err != nil {
			t.Fatal(err)
		}
		if st.Rules[0].Used != 0 || st.Rules[1].Used != 0 || st.Rules[3].Used != 0 {
			t.Errorf("%s: windows count %d, %d and %d after every admission was refunded (%d split, %d pooled)", key, st.Rules[0].Used, st.Rules[1].Used, st.Rules[3].Used, split, pooled)
		}
	}
}
