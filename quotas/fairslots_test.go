package quotas

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// slotSim runs tasks of three flows through one concurrency rule of 12
// slots on an explicit clock, in steps of 20 ms: each step every flow asks
// for slots (flow a, the one with the backlog, 8 times, b and c twice, in a
// random order), and each task admitted holds its slot for 0.4-1.2 s, then
// releases it. Flow c stops asking at 20 s. It returns each flow's average
// slots held over [5 s, 20 s) and [25 s, 40 s).
func slotSim(t *testing.T, fair bool) (phase1, phase2 map[string]float64) {
	t.Helper()
	c := redistest.Client(t)
	cl := newClocked(t, c, redistest.Prefix(t), time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	set := mustSet(Rule{Name: "slots", Fair: fair, Limit: Concurrency{Max: 12, Lease: 30 * time.Second}})
	weights := map[string]int{"a": 1, "b": 2, "c": 1}
	asks := map[string]int{"a": 8, "b": 2, "c": 2}
	rng := rand.New(rand.NewPCG(7, 7))
	type running struct {
		flow string
		end  time.Time
		ls   Lease
	}
	var run []running
	held := map[string]int{}
	phase1, phase2 = map[string]float64{}, map[string]float64{}
	ctx := context.Background()
	start, seq := cl.now, 0
	const step = 20 * time.Millisecond
	for i := 0; i < 2000; i++ {
		cl.now = cl.now.Add(step)
		at := cl.now.Sub(start)
		kept := run[:0]
		for _, r := range run {
			if r.end.After(cl.now) {
				kept = append(kept, r)
				continue
			}
			if ok, err := cl.Release(ctx, r.ls); err != nil || !ok {
				t.Fatalf("release %+v: %v %v", r.ls, ok, err)
			}
			held[r.flow]--
		}
		run = kept
		var order []string
		for f, n := range asks {
			if f == "c" && at >= 20*time.Second {
				continue
			}
			for range n {
				order = append(order, f)
			}
		}
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, f := range order {
			seq++
			d, err := cl.Allow(ctx, set, Request{Holder: fmt.Sprintf("%s-%d", f, seq), Fair: []string{f}, Weights: []int{weights[f]}})
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				continue
			}
			run = append(run, running{f, cl.now.Add(400*time.Millisecond + time.Duration(rng.Int64N(int64(800*time.Millisecond)))), d.Leases[0]})
			held[f]++
		}
		if len(run) > 12 {
			t.Fatalf("%d slots out of 12", len(run))
		}
		for f, n := range held {
			switch {
			case at >= 5*time.Second && at < 20*time.Second:
				phase1[f] += float64(n) / 750
			case at >= 25*time.Second:
				phase2[f] += float64(n) / 750
			}
		}
	}
	return phase1, phase2
}

// TestFairSlots: a fair concurrency rule of 12 slots shared by flows of
// weights 1, 2 and 1, flow a asking four times as often as the others,
// gives each its weight's share of the slots held (3, 6 and 3; after c
// stops, 4 and 8), each within 10 % (measured: at most 5.3 % off), with
// every slot in use; the same
// traffic on a rule that is not fair gives a at least twice its share.
// The ideal comes from the limit and the weights alone.
func TestFairSlots(t *testing.T) {
	p1, p2 := slotSim(t, true)
	t.Logf("fair: phase 1 %.2f / %.2f / %.2f slots, phase 2 %.2f / %.2f", p1["a"], p1["b"], p1["c"], p2["a"], p2["b"])
	for _, c := range []struct {
		phase        map[string]float64
		flow         string
		ideal, total float64
	}{{p1, "a", 3, 12}, {p1, "b", 6, 12}, {p1, "c", 3, 12}, {p2, "a", 4, 12}, {p2, "b", 8, 12}} {
		if got := c.phase[c.flow]; math.Abs(got-c.ideal) > 0.10*c.ideal {
			t.Errorf("flow %s held %.2f slots on average; its share is %.0f", c.flow, got, c.ideal)
		}
	}
	for i, p := range []map[string]float64{p1, p2} {
		if sum := p["a"] + p["b"] + p["c"]; sum < 11.5 {
			t.Errorf("phase %d: %.2f of 12 slots in use on average", i+1, sum)
		}
	}
	u1, _ := slotSim(t, false)
	t.Logf("not fair: phase 1 %.2f / %.2f / %.2f slots", u1["a"], u1["b"], u1["c"])
	if u1["a"] < 6 {
		t.Errorf("without fairness flow a held only %.2f slots: the traffic does not test fairness", u1["a"])
	}
}

// TestFairSlotsOutliveBlock: under a Block longer than the leases, a fair
// concurrency rule's holders set lives as long as its tokens hash (until
// the block ends), after an acquire, a renew and a release alike, so that
// a lease ending meanwhile is reclaimed by a look and gives its flow's
// slot back rather than leaving the flow's count behind in the hash.
func TestFairSlotsOutliveBlock(t *testing.T) {
	c := redistest.Client(t)
	l, err := New(Config{Client: c, Prefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	set := mustSet(Rule{Name: "slots", Fair: true, Limit: Concurrency{Max: 4, Lease: 2 * time.Second}})
	req := func(h string) Request { return Request{Holder: h, Fair: []string{"a"}} }
	d, err := l.Allow(ctx, set, req("t1"))
	if err != nil || !d.Allowed {
		t.Fatalf("%+v %v", d, err)
	}
	if _, err := l.Allow(ctx, set, req("t2")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Block(ctx, set, req(""), time.Now().Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	ls := d.Leases[0]
	check := func(what string) {
		t.Helper()
		for _, k := range []string{ls.zkey, ls.hkey} {
			if ttl := c.PTTL(ctx, k).Val(); ttl < 8*time.Second {
				t.Errorf("%s: %s lives %v, want until the block ends (about 10 s)", what, k, ttl)
			}
		}
	}
	check("block")
	if ok, err := l.Renew(ctx, ls); !ok || err != nil {
		t.Fatalf("renew: %v %v", ok, err)
	}
	check("renew")
	if ok, err := l.Release(ctx, ls); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	check("release")
}

// TestFairSlotsNextBehind: a fair concurrency rule's refusals say whose
// turn comes. Flow a holds both slots of 2; b asks alone (no other flow
// waits): neither Next nor Behind. a asks again: b, holding none, ranks
// below it, so a is Behind. b asks again: it is Next. A Critical request
// of a, and any request once the rule is blocked, says neither. The same
// against the Model.
func TestFairSlotsNextBehind(t *testing.T) {
	c := redistest.Client(t)
	l, err := New(Config{Client: c, Prefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	for name, d := range map[string]Decider{"redis": l, "model": NewModel()} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			set := mustSet(Rule{Name: "slots", Fair: true, Limit: Concurrency{Max: 2, Lease: time.Minute}})
			ask := func(flow, holder string, critical bool) RuleStatus {
				t.Helper()
				dec, err := d.Allow(ctx, set, Request{Holder: holder, Fair: []string{flow}, Critical: critical})
				if err != nil {
					t.Fatal(err)
				}
				if flow == "a" && (holder == "a1" || holder == "a2") != dec.Allowed {
					t.Fatalf("%s: allowed %v", holder, dec.Allowed)
				}
				return dec.Rules[0]
			}
			ask("a", "a1", false)
			ask("a", "a2", false)
			for _, c := range []struct {
				flow, holder string
				critical     bool
				next, behind bool
			}{
				{"b", "b1", false, false, false},
				{"a", "a3", false, false, true},
				{"b", "b1", false, true, false},
				{"a", "a3", true, false, false},
			} {
				if st := ask(c.flow, c.holder, c.critical); st.Next != c.next || st.Behind != c.behind {
					t.Errorf("%s (critical %v): Next %v Behind %v, want %v %v", c.holder, c.critical, st.Next, st.Behind, c.next, c.behind)
				}
			}
			if _, err := d.Block(ctx, set, Request{Fair: []string{"a"}}, time.Now().Add(time.Minute)); err != nil {
				t.Fatal(err)
			}
			for _, h := range []string{"a3", "b1"} {
				if st := ask(map[string]string{"a3": "a", "b1": "b"}[h], h, false); st.Next || st.Behind {
					t.Errorf("%s under a block: Next %v Behind %v", h, st.Next, st.Behind)
				}
			}
		})
	}
}
