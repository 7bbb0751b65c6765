package quotas

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/limits"
)

// TestPrefetchWindowExact hands out prefetched units of a fixed and of a
// calendar window from three limiters (three processes) on one Redis, on
// an explicit clock, to requests at twice the window's limit and then at
// a third of it. Checked on the times alone (each unit in the window of
// the moment it was handed out, by this test's own arithmetic): no window
// holds more than its limit, a busy window hands out all but what the
// three processes can hold when it ends, and below the limit every request
// is admitted. Throughout, the server's count of the current window is
// exactly the units handed out in it plus those the pools hold: nothing
// handed out is uncounted, nothing given back is lost.
func TestPrefetchWindowExact(t *testing.T) {
	minute := func(t int64) int64 { return t - t%60_000_000 }
	for _, c := range []struct {
		name   string
		limit  Limit
		n      int           // the window's limit
		every  time.Duration // its length
		window func(µs int64) int64
		calls  bool // below the limit, at most one call per 4 requests (else at most one per request)
	}{
		{"fixed", FixedWindow{Limit: 640, Every: 100 * time.Millisecond}, 640, 100 * time.Millisecond,
			func(t int64) int64 { return t - t%100_000 }, true},
		{"calendar", CalendarWindow{Limit: 3200, Cron: "* * * * *"}, 3200, time.Minute, minute, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			set := mustSet(Rule{Name: "w", Limit: c.limit, Prefetch: 20 * time.Millisecond})
			now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
			ls, counter := limitersOn(t, 3, &now)
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(3, 4))
			handed := map[int64]int{} // window start -> units handed out
			checks := 0
			// pooled is what the pools hold of the window starting at w.
			pooled := func(w int64) int {
				return pooledUnits(ls, func(g grant) bool { return c.window(g.now.UnixMicro()) == w })
			}
			check := func() {
				t.Helper()
				checks++
				st, err := ls[0].Status(ctx, set, Request{})
				if err != nil {
					t.Fatal(err)
				}
				w := c.window(now.UnixMicro())
				if used, want := st.Rules[0].Used, handed[w]+pooled(w); used != want {
					t.Fatalf("at %v the window counts %d; %d handed out and %d in the pools", now, used, handed[w], pooled(w))
				}
			}
			step := c.every / time.Duration(c.n) // the limit's spacing
			phase := func(windows int, mean time.Duration) (requests, admitted int, calls int64) {
				before, checked := counter.n.Load(), checks
				for end := now.Add(time.Duration(windows) * c.every); now.Before(end); now = now.Add(time.Duration(rng.Int64N(int64(2*mean))) + 1) {
					requests++
					d, err := ls[rng.IntN(len(ls))].Allow(ctx, set, Request{})
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed {
						admitted++
						handed[c.window(now.UnixMicro())]++
					}
					if requests%97 == 0 {
						check()
					}
				}
				return requests, admitted, counter.n.Load() - before - int64(checks-checked)
			}
			start := c.window(now.UnixMicro())
			busyReq, busyAdm, busyCalls := phase(4, step/2)
			idleFrom := c.window(now.UnixMicro())
			idleReq, idleAdm, idleCalls := phase(3, 3*step)
			check()
			t.Logf("at 2x the limit: %d requests, %d admitted, %d calls; at 1/3: %d requests, %d admitted, %d calls; per window %v",
				busyReq, busyAdm, busyCalls, idleReq, idleAdm, idleCalls, handed)
			waste := 3 * int(limits.WindowBatch(c.n)) // what 3 processes can hold at a window's end
			for w, n := range handed {
				if n > c.n {
					t.Errorf("window %d: %d handed out; the limit is %d", w, n, c.n)
				}
				if w > start && w < idleFrom && n < c.n-waste {
					t.Errorf("busy window %d: %d handed out of %d; at most %d may be held at its end", w, n, c.n, waste)
				}
			}
			if idleAdm != idleReq {
				t.Errorf("below the limit, %d of %d requests admitted", idleAdm, idleReq)
			}
			if c.calls && 4*idleCalls > int64(idleReq) {
				t.Errorf("below the limit, %d calls for %d requests: want at most 1 in 4", idleCalls, idleReq)
			}
			if idleCalls > int64(idleReq) {
				t.Errorf("below the limit, %d calls for %d requests: more than without prefetch", idleCalls, idleReq)
			}
		})
	}
}

// TestPrefetchWindowGiveBack: the units of a window a process took ahead
// and did not hand out go back to the window exactly once: on the real
// clock when they expire, without another request; after a Block (which
// drops the pools); at GiveBack; and a refund of a unit handed out goes
// back to the pool while it is usable, to the window once it is not.
func TestPrefetchWindowGiveBack(t *testing.T) {
	rule := Rule{Name: "w", Limit: FixedWindow{Limit: 3200, Every: time.Hour}, Prefetch: 10 * time.Millisecond}
	set := mustSet(rule)
	// On the real clock, the units must still be pooled when the test
	// looks: the longest lease, and the look only if it came within half
	// of it (a loaded machine may pause for longer).
	rule.Prefetch = 100 * time.Millisecond
	slow := mustSet(rule)
	c := redistest.Client(t)
	ctx := context.Background()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	// setup returns a limiter on its own keys, on the real clock or (virtual)
	// on now, and the count of set's window.
	setup := func(t *testing.T, set *Set, virtual bool) (*Limiter, func() int) {
		cfg := Config{Client: c, Prefix: redistest.Prefix(t)}
		if virtual {
			cfg.Now = func() time.Time { return now }
		}
		l, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return l, func() int {
			st, err := l.Status(ctx, set, Request{})
			if err != nil {
				t.Fatal(err)
			}
			if st.Rules[0].ResetAfter < 10*time.Second {
				t.Skip("the hour's window ends within the test")
			}
			return st.Rules[0].Used
		}
	}
	// settled waits until the window counts want units, then checks that
	// nothing more is given back.
	settled := func(t *testing.T, used func() int, want int, what string) {
		t.Helper()
		got := -1
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && got != want; time.Sleep(5 * time.Millisecond) {
			got = used()
		}
		time.Sleep(50 * time.Millisecond)
		if got = used(); got != want {
			t.Errorf("%s: the window counts %d, want %d", what, got, want)
		}
	}
	allow := func(t *testing.T, l *Limiter, set *Set, n int) []Decision {
		t.Helper()
		var ds []Decision
		for range n {
			d, err := l.Allow(ctx, set, Request{})
			if err != nil || !d.Allowed {
				t.Fatalf("%+v %v", d, err)
			}
			ds = append(ds, d)
		}
		return ds
	}
	pooled := func(t *testing.T, used func() int, handed int) {
		t.Helper()
		if u := used(); u <= handed {
			t.Fatalf("the window counts %d with %d handed out: nothing was taken ahead", u, handed)
		}
	}

	t.Run("expired", func(t *testing.T) {
		l, used := setup(t, slow, false)
		start := time.Now()
		allow(t, l, slow, 20)
		u := used()
		if time.Since(start) < rule.Prefetch/2 && u <= 20 {
			t.Fatalf("the window counts %d with 20 handed out: nothing was taken ahead", u)
		}
		settled(t, used, 20, "after the units expired")
	})
	t.Run("block", func(t *testing.T) {
		l, used := setup(t, set, true) // no timers: only the Block gives back
		ds := allow(t, l, set, 20)
		pooled(t, used, 20)
		if _, err := l.Block(ctx, set, Request{}, now); err != nil {
			t.Fatal(err)
		}
		settled(t, used, 20, "after a Block")
		if err := l.Refund(ctx, set, Request{}, ds[19]); err != nil {
			t.Fatal(err)
		}
		settled(t, used, 19, "after a refund of a unit whose pool a Block dropped")
	})
	t.Run("GiveBack", func(t *testing.T) {
		l, used := setup(t, set, true)
		allow(t, l, set, 20)
		pooled(t, used, 20)
		if err := l.GiveBack(ctx); err != nil {
			t.Fatal(err)
		}
		if u := used(); u != 20 {
			t.Errorf("after GiveBack the window counts %d, want 20", u)
		}
	})
	t.Run("refund", func(t *testing.T) {
		l, used := setup(t, set, true)
		ds := allow(t, l, set, 20)
		held := used() - 20
		// Usable still: back to the pool, handed out again without a call
		// (ds[1]: the first request was decided as usual, the pool cold).
		if err := l.Refund(ctx, set, Request{}, ds[1]); err != nil {
			t.Fatal(err)
		}
		if u := used(); u != 20+held {
			t.Errorf("a refund while usable changed the count to %d, want %d", u, 20+held)
		}
		// Expired: the refund and the pool go back to the window.
		now = now.Add(20 * time.Millisecond)
		if err := l.Refund(ctx, set, Request{}, ds[2]); err != nil {
			t.Fatal(err)
		}
		allow(t, l, set, 1) // finds the expired units and gives them back
		if u, want := used(), 18+1+poolUnits(l); u != want {
			t.Errorf("after expiry the window counts %d, want %d (18 kept, 1 new, %d pooled)", u, want, poolUnits(l))
		}
	})
	t.Run("refund on the real clock", func(t *testing.T) {
		l, used := setup(t, set, false)
		d := allow(t, l, set, 1)[0] // a batch of 1: nothing over
		if err := l.Refund(ctx, set, Request{}, d); err != nil {
			t.Fatal(err)
		}
		settled(t, used, 0, "a unit refunded into its pool, after it expired")
	})
}

// pooledUnits is what the pools of ls hold in the grants keep selects
// (nil: all).
func pooledUnits(ls []*Limiter, keep func(grant) bool) int {
	n := 0
	for _, l := range ls {
		l.pools.mu.Lock()
		for _, p := range l.pools.m {
			for _, g := range p.grants {
				if keep == nil || keep(g) {
					n += int(g.units)
				}
			}
		}
		l.pools.mu.Unlock()
	}
	return n
}

// poolUnits is what l's pools hold.
func poolUnits(l *Limiter) int { return pooledUnits([]*Limiter{l}, nil) }

// TestPrefetchWindowCosts: a request whose per-rule Costs all equal its
// Cost prefetches, and its batches charge the batch's units, not the
// request's.
func TestPrefetchWindowCosts(t *testing.T) {
	set := mustSet(Rule{Name: "w", Limit: FixedWindow{Limit: 640, Every: time.Hour}, Prefetch: 10 * time.Millisecond})
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	l, err := New(Config{Client: redistest.Client(t), Prefix: redistest.Prefix(t), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	handed := 0
	for range 300 {
		d, err := l.Allow(ctx, set, Request{Costs: []int{1}})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			handed++
		}
		now = now.Add(time.Microsecond)
	}
	st, err := l.Status(ctx, set, Request{})
	if err != nil {
		t.Fatal(err)
	}
	if used, want := st.Rules[0].Used, handed+poolUnits(l); used != want || handed != 300 {
		t.Errorf("%d handed out of 300; the window counts %d, want %d (%d pooled)", handed, used, want, poolUnits(l))
	}
}

// TestPrefetchWindowMargin: near its limit a window is decided request by
// request: a batch that leaves less than windowMargin batches pauses the
// pool, so the last units of a window filled by one busy process each take
// a call.
func TestPrefetchWindowMargin(t *testing.T) {
	const limit = 320 // batches of at most 10
	set := mustSet(Rule{Name: "w", Limit: FixedWindow{Limit: limit, Every: 10 * time.Second}, Prefetch: 20 * time.Millisecond})
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	ls, counter := limitersOn(t, 1, &now)
	l := ls[0]
	var called []bool // per admitted request: it made a call
	for {
		before := counter.n.Load()
		d, err := l.Allow(context.Background(), set, Request{})
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			break
		}
		called = append(called, counter.n.Load() > before)
		now = now.Add(time.Microsecond)
	}
	calls := 0
	for _, c := range called[len(called)-3*10:] {
		if c {
			calls++
		}
	}
	t.Logf("%d admitted with %d calls; of the last 30, %d with a call", len(called), counter.n.Load(), calls)
	if len(called) != limit {
		t.Fatalf("%d admitted, want the limit %d", len(called), limit)
	}
	if calls < 20 {
		t.Errorf("of the window's last 30 units %d took a call: near the limit a window decides request by request", calls)
	}
}

// TestPrefetchSlidingExact: a sliding window of 640 per 100 ms prefetched
// by three limiters on an explicit clock (prefetch: 20ms, so the log spans
// 120 ms), requests at twice the limit and then, after 120 ms without
// any, at a third of it. Checked on
// the hand-out times alone: no span of 100 ms holds more than 640. At
// every 97th request the server's count (entries of the last 120 ms) is
// the units logged then, handed out or pooled, less those given back.
func TestPrefetchSlidingExact(t *testing.T) {
	const limit, every, prefetch = 640, 100 * time.Millisecond, 20 * time.Millisecond
	set := mustSet(Rule{Name: "s", Limit: SlidingWindow{Limit: limit, Every: every}, Prefetch: prefetch})
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	ls, counter := limitersOn(t, 3, &now)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 6))
	var handed, logged []int64 // per unit handed out: when, and its batch's moment
	span := (every + prefetch).Microseconds()
	checks := 0
	check := func() {
		t.Helper()
		checks++
		st, err := ls[0].Status(ctx, set, Request{})
		if err != nil {
			t.Fatal(err)
		}
		from := now.UnixMicro() - span
		want := 0
		for _, at := range logged {
			if at > from {
				want++
			}
		}
		want += pooledUnits(ls, func(g grant) bool { return g.now.UnixMicro() > from })
		if used := st.Rules[0].Used; used != want {
			t.Fatalf("at %v the log counts %d; logged in its span and not given back: %d", now, used, want)
		}
	}
	step := every / limit
	phase := func(d, mean time.Duration) (requests, admitted int, calls int64) {
		before, checked := counter.n.Load(), checks
		for end := now.Add(d); now.Before(end); now = now.Add(time.Duration(rng.Int64N(int64(2*mean))) + 1) {
			requests++
			dec, err := ls[rng.IntN(len(ls))].Allow(ctx, set, Request{})
			if err != nil {
				t.Fatal(err)
			}
			if dec.Allowed {
				admitted++
				at := dec.Now.UnixMicro()
				if dec.pf != nil {
					at = dec.pf.g.now.UnixMicro()
				}
				handed, logged = append(handed, now.UnixMicro()), append(logged, at)
			}
			if requests%97 == 0 {
				check()
			}
		}
		return requests, admitted, counter.n.Load() - before - int64(checks-checked)
	}
	busyReq, busyAdm, busyCalls := phase(4*every, step/2)
	now = now.Add(every + prefetch) // the busy phase leaves the log
	idleReq, idleAdm, idleCalls := phase(3*every, 3*step)
	check()
	t.Logf("at 2x the limit: %d requests, %d admitted, %d calls; at 1/3: %d requests, %d admitted, %d calls",
		busyReq, busyAdm, busyCalls, idleReq, idleAdm, idleCalls)
	for i, j := 0, 0; j < len(handed); j++ {
		for handed[j]-handed[i] >= every.Microseconds() {
			i++
		}
		if n := j - i + 1; n > limit {
			t.Fatalf("%d units handed out within %v (from %d µs); the limit is %d", n, every, handed[i], limit)
		}
	}
	if busyAdm < 4*limit*int(every)/int(every+prefetch)*9/10 {
		t.Errorf("at twice the limit %d handed out in %v; the lengthened log allows about %d", busyAdm, 4*every, 4*limit*int(every)/int(every+prefetch))
	}
	if idleAdm != idleReq {
		t.Errorf("below the limit, %d of %d requests admitted", idleAdm, idleReq)
	}
	if 4*idleCalls > int64(idleReq) {
		t.Errorf("below the limit, %d calls for %d requests: want at most 1 in 4", idleCalls, idleReq)
	}
}

// limitersOn returns n limiters (processes) on one Redis client, whose
// commands counter counts, and one key prefix, all on the clock *now.
func limitersOn(t *testing.T, n int, now *time.Time) ([]*Limiter, *callCounter) {
	t.Helper()
	cc := redis.NewClient(&redis.Options{Addr: redistest.Client(t).Options().Addr})
	t.Cleanup(func() { cc.Close() })
	counter := &callCounter{}
	cc.AddHook(counter)
	prefix := redistest.Prefix(t)
	var ls []*Limiter
	for range n {
		l, err := New(Config{Client: cc, Prefix: prefix, Now: func() time.Time { return *now }})
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	return ls, counter
}
