package quotas

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// keptSet is a set of one concurrency rule of max slots that keeps them
// for 10ms.
func keptSet(max int) *Set {
	return mustSet(Rule{Name: "slots", Limit: Concurrency{Max: max, Lease: time.Minute}, Prefetch: 10 * time.Millisecond})
}

// used is the slots rule's count in Redis.
func used(t *testing.T, l *Limiter, s *Set, req Request) int {
	t.Helper()
	st, err := l.Status(context.Background(), s, req)
	if err != nil {
		t.Fatal(err)
	}
	return st.Rules[0].Used
}

// keptUnits is how many grants l keeps.
func keptUnits(l *Limiter) int {
	l.slots.mu.Lock()
	defer l.slots.mu.Unlock()
	n := 0
	for _, p := range l.slots.m {
		n += len(p.free)
	}
	return n
}

// TestKeptSlots: a slot released is kept and handed to the next request
// without a call, under its lease; Redis counts it all the while; it goes
// back when kept past its time, when its lease is too old to hand out, at a
// Block and at GiveBack; a lease released twice reports false; near its
// limit a rule's slots go back at once, and a pool keeps keepMost.
func TestKeptSlots(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	ctx := context.Background()
	allow := func(t *testing.T, l *Limiter, s *Set, holder string) Decision {
		t.Helper()
		d, err := l.Allow(ctx, s, Request{Holder: holder})
		if err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
		return d
	}
	release := func(t *testing.T, l *Limiter, d Decision) {
		t.Helper()
		for _, ls := range d.Leases {
			if ok, err := l.Release(ctx, ls); err != nil || !ok {
				t.Fatalf("release: %v %v", ok, err)
			}
		}
	}
	t.Run("kept and handed out", func(t *testing.T) {
		ls, counter := limitersOn(t, 1, &now)
		l, s := ls[0], keptSet(64)
		used(t, l, s, Request{}) // loads the scripts
		before := counter.n.Load()
		d := allow(t, l, s, "a")
		release(t, l, d)
		if n := counter.n.Load() - before; n != 1 {
			t.Errorf("a take and a release made %d calls, want 1", n)
		}
		if got := used(t, l, s, Request{}); got != 1 {
			t.Errorf("a kept slot: Redis counts %d, want 1", got)
		}
		before = counter.n.Load()
		d2 := allow(t, l, s, "b")
		if n := counter.n.Load() - before; n != 0 {
			t.Errorf("the kept slot was handed out with %d calls, want 0", n)
		}
		if d2.Leases[0].Token != d.Leases[0].Token {
			t.Errorf("handed out under token %d, want the kept lease's %d", d2.Leases[0].Token, d.Leases[0].Token)
		}
		if ok, err := l.Release(ctx, d.Leases[0]); err != nil || ok {
			t.Errorf("a lease of an earlier hand-out released: %v %v, want false", ok, err)
		}
		release(t, l, d2)
		if ok, err := l.Release(ctx, d2.Leases[0]); err != nil || ok {
			t.Errorf("a lease released twice: %v %v, want false", ok, err)
		}
		if got := keptUnits(l); got != 1 {
			t.Errorf("%d kept, want 1", got)
		}
		// Past its time: the next request gives it back and takes a new one.
		now = now.Add(10 * time.Millisecond)
		d3 := allow(t, l, s, "c")
		if d3.Leases[0].Token == d.Leases[0].Token {
			t.Error("a slot kept past its time was handed out")
		}
		if got := used(t, l, s, Request{}); got != 1 {
			t.Errorf("after the kept slot went back Redis counts %d, want 1", got)
		}
		release(t, l, d3)
		if err := l.GiveBack(ctx); err != nil {
			t.Fatal(err)
		}
		if got := used(t, l, s, Request{}); got != 0 {
			t.Errorf("after GiveBack Redis counts %d, want 0", got)
		}
	})
	t.Run("fresh", func(t *testing.T) {
		ls, _ := limitersOn(t, 1, &now)
		l, s := ls[0], keptSet(64) // a lease of 1m: handed out again within 1s
		d := allow(t, l, s, "a")
		// Held 0.9 s, renewed on the way: kept, handed out again.
		now = now.Add(500 * time.Millisecond)
		if ok, err := l.Renew(ctx, d.Leases[0]); err != nil || !ok {
			t.Fatalf("renew: %v %v", ok, err)
		}
		now = now.Add(400 * time.Millisecond)
		release(t, l, d)
		d2 := allow(t, l, s, "b")
		if d2.Leases[0].Token != d.Leases[0].Token {
			t.Fatal("a slot taken 0.9 s ago was not handed out again")
		}
		// Released 1.1 s after it was taken: given back, however renewed.
		now = now.Add(200 * time.Millisecond)
		if ok, err := l.Renew(ctx, d2.Leases[0]); err != nil || !ok {
			t.Fatalf("renew: %v %v", ok, err)
		}
		release(t, l, d2)
		if got, kept := used(t, l, s, Request{}), keptUnits(l); got != 0 || kept != 0 {
			t.Errorf("released 1.1 s after it was taken: Redis counts %d, %d kept; want it given back", got, kept)
		}
	})
	t.Run("lost", func(t *testing.T) {
		ls, _ := limitersOn(t, 1, &now)
		l, s := ls[0], keptSet(64)
		d := allow(t, l, s, "a")
		now = now.Add(61 * time.Second) // the lease ended
		if ok, err := l.Renew(ctx, d.Leases[0]); err != nil || ok {
			t.Fatalf("renew of an ended lease: %v %v, want false", ok, err)
		}
		now = now.Add(-61 * time.Second) // as if a clock stood still: only the loss tells
		if ok, err := l.Release(ctx, d.Leases[0]); err != nil || !ok {
			t.Fatalf("release: %v %v", ok, err)
		}
		if kept := keptUnits(l); kept != 0 {
			t.Errorf("a grant whose renewal found it gone was kept (%d)", kept)
		}
	})
	t.Run("drop", func(t *testing.T) {
		ls, _ := limitersOn(t, 1, &now)
		l, s := ls[0], keptSet(64)
		// A call that ran in Redis and lost its reply: its holder is dropped.
		req := Request{Holder: keptHolder()}
		if d, err := l.decideNow(ctx, s, req, opAllow, 0); err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
		l.dropKept(s, req)
		for deadline := time.Now().Add(5 * time.Second); used(t, l, s, Request{}) != 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		if got := used(t, l, s, Request{}); got != 0 {
			t.Errorf("after the drop Redis counts %d, want 0", got)
		}
	})
	t.Run("block by another process", func(t *testing.T) {
		ls, _ := limitersOn(t, 2, &now)
		a, b, s := ls[0], ls[1], keptSet(64)
		release(t, a, allow(t, a, s, "a"))
		if _, err := b.Block(ctx, s, Request{}, now.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		// Within a second of its take the kept slot is still handed out...
		now = now.Add(5 * time.Millisecond)
		d := allow(t, a, s, "b")
		// ... and then given back: the next take sees the block.
		now = now.Add(time.Second)
		release(t, a, d)
		if d, err := a.Allow(ctx, s, Request{Holder: "c"}); err != nil || d.Allowed {
			t.Errorf("a second after the block: %+v %v, want denied", d, err)
		}
	})
	t.Run("block", func(t *testing.T) {
		ls, _ := limitersOn(t, 1, &now)
		l, s := ls[0], keptSet(64)
		d1, d2 := allow(t, l, s, "a"), allow(t, l, s, "b")
		release(t, l, d1)
		if _, err := l.Block(ctx, s, Request{}, now.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		// The kept slot goes back in the background; the one out when it
		// is released.
		release(t, l, d2)
		for deadline := time.Now().Add(5 * time.Second); used(t, l, s, Request{}) != 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		if got := used(t, l, s, Request{}); got != 0 {
			t.Errorf("after a Block Redis counts %d, want 0", got)
		}
		if d, err := l.Allow(ctx, s, Request{Holder: "c"}); err != nil || d.Allowed {
			t.Errorf("during the block: %+v %v, want denied", d, err)
		}
	})
	t.Run("near the limit", func(t *testing.T) {
		ls, _ := limitersOn(t, 1, &now)
		l, s := ls[0], keptSet(32) // kept while 4 are free
		var ds []Decision
		for i := range 29 {
			ds = append(ds, allow(t, l, s, fmt.Sprint("h", i)))
		}
		// The 28th was taken with 4 free, the 29th with 3.
		release(t, l, ds[28])
		if got, kept := used(t, l, s, Request{}), keptUnits(l); got != 28 || kept != 0 {
			t.Errorf("the 29th released: Redis counts %d, %d kept; want 28 and 0 (taken with 3 free: given back)", got, kept)
		}
		release(t, l, ds[27])
		if got, kept := used(t, l, s, Request{}), keptUnits(l); got != 28 || kept != 1 {
			t.Errorf("the 28th released: Redis counts %d, %d kept; want 28 and 1 (taken with 4 free: kept)", got, kept)
		}
		// A pool keeps keepMost.
		for _, d := range ds[:27] {
			release(t, l, d)
		}
		if got, kept := used(t, l, s, Request{}), keptUnits(l); got != keepMost || kept != keepMost {
			t.Errorf("all released: Redis counts %d, %d kept; want %d and %d", got, kept, keepMost, keepMost)
		}
		if err := l.GiveBack(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("real clock", func(t *testing.T) {
		l, err := New(Config{Client: redistest.Client(t), Prefix: redistest.Prefix(t)})
		if err != nil {
			t.Fatal(err)
		}
		s := mustSet(Rule{Name: "slots", Limit: Concurrency{Max: 64, Lease: time.Minute}, Prefetch: 100 * time.Millisecond})
		start := time.Now()
		release(t, l, allow(t, l, s, "a"))
		got, kept := used(t, l, s, Request{}), keptUnits(l)
		if time.Since(start) < 50*time.Millisecond && (got != 1 || kept != 1) {
			t.Errorf("at once after its release Redis counts %d, %d kept; want the slot kept", got, kept)
		}
		for deadline := time.Now().Add(5 * time.Second); used(t, l, s, Request{}) != 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		if got, kept := used(t, l, s, Request{}), keptUnits(l); got != 0 || kept != 0 {
			t.Errorf("after its time Redis counts %d, %d kept; want the slot given back by the timer", got, kept)
		}
	})
}

// TestKeptSlotsFleet: 4 processes on an explicit clock take and release
// the slots of a global rule and of keyed ones at random, one process
// dying (its slots held until their leases end), another giving back at
// times: no rule ever has more slots out than its max, Redis counts
// exactly the slots out plus those kept, and below the limit at most one
// request in 3 makes a call (0.23 measured; each request makes one
// without keeping).
func TestKeptSlotsFleet(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	ls, counter := limitersOn(t, 4, &now)
	ctx := context.Background()
	const max = 40
	set := mustSet(
		Rule{Name: "global", Limit: Concurrency{Max: max, Lease: 30 * time.Second}, Prefetch: 10 * time.Millisecond},
		Rule{Name: "per-key", Limit: Concurrency{Max: 200, Lease: 30 * time.Second}, Prefetch: 10 * time.Millisecond},
	)
	rng := rand.New(rand.NewPCG(5, 6))
	type held struct {
		l   int
		key string
		d   Decision
	}
	var out []held
	dead, deadHeld := -1, 0 // deadHeld: its global slots out and kept
	keys := []string{"big", "big", "big", "big", "s1", "s2", "s3"}
	requests, admitted, denied := 0, 0, 0 // requests and calls: below the limit
	var calls int64
	for step := range 6000 {
		now = now.Add(time.Duration(rng.IntN(100)) * time.Microsecond)
		// About 20 slots out, then (steps 2000-2999) more than the limit.
		target := 20
		if step >= 2000 && step < 3000 {
			target = 2 * max
		}
		if step == 3000 {
			dead = 0 // dies: its slots out and kept stay held until their leases end
			deadHeld = keptUnits(ls[dead])
			out = slices.DeleteFunc(out, func(h held) bool {
				if h.l == dead {
					deadHeld++
				}
				return h.l == dead
			})
		}
		if step == 3000+1 {
			if got := used(t, ls[1], set, Request{Keys: []string{"", "big"}}); got == 0 {
				t.Fatal("nothing held when the process died")
			}
		}
		if len(out) > 0 && (len(out) >= target || rng.IntN(2) == 0) {
			i := rng.IntN(len(out))
			h := out[i]
			out = append(out[:i], out[i+1:]...)
			for _, lease := range h.d.Leases {
				if ok, err := ls[h.l].Release(ctx, lease); err != nil || !ok {
					t.Fatalf("step %d: release %v %v", step, ok, err)
				}
			}
			continue
		}
		if step%500 == 250 {
			if err := ls[3].GiveBack(ctx); err != nil {
				t.Fatal(err)
			}
		}
		i := 1 + rng.IntN(3)
		if dead < 0 {
			i = rng.IntN(4)
		}
		key := keys[rng.IntN(len(keys))]
		before := counter.n.Load()
		d, err := ls[i].Allow(ctx, set, Request{Keys: []string{"", key}, Holder: fmt.Sprint("t", step)})
		if err != nil {
			t.Fatal(err)
		}
		if step < 2000 {
			requests++
			calls += counter.n.Load() - before
		}
		if !d.Allowed {
			denied++
			continue
		}
		admitted++
		out = append(out, held{i, key, d})
		if len(out) > max {
			t.Fatalf("step %d: %d slots out, max %d", step, len(out), max)
		}
		if step%37 == 0 && dead < 0 {
			// Every slot Redis holds is out or kept.
			kept := 0
			for _, l := range ls {
				kept += keptUnits(l)
			}
			if got := used(t, ls[1], set, Request{Keys: []string{"", key}}); got != len(out)+kept {
				t.Fatalf("step %d: Redis counts %d global slots; %d out and %d kept", step, got, len(out), kept)
			}
		}
	}
	if denied == 0 {
		t.Error("no request was denied: the limit was never reached")
	}
	if 3*calls > int64(requests) {
		t.Errorf("below the limit, %d calls for %d requests: want at most 1 in 3", calls, requests)
	}
	// The live processes give everything back; the dead one's slots stay
	// until their leases end.
	for _, h := range out {
		for _, lease := range h.d.Leases {
			if ok, err := ls[h.l].Release(ctx, lease); err != nil || !ok {
				t.Fatalf("release: %v %v", ok, err)
			}
		}
	}
	for _, l := range ls[1:] {
		if err := l.GiveBack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := used(t, ls[1], set, Request{Keys: []string{"", "big"}}); got != deadHeld {
		t.Errorf("everything given back but the dead process's %d: Redis counts %d", deadHeld, got)
	}
	now = now.Add(31 * time.Second)
	if got := used(t, ls[1], set, Request{Keys: []string{"", "big"}}); got != 0 {
		t.Errorf("after the dead process's leases ended Redis counts %d, want 0", got)
	}
	t.Logf("%d admitted, %d denied; below the limit %d calls for %d requests", admitted, denied, calls, requests)
}
