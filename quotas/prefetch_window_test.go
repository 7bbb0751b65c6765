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
		calls  bool // below the limit, at most one call per 4 requests
	}{
		{"fixed", FixedWindow{Limit: 640, Every: 100 * time.Millisecond}, 640, 100 * time.Millisecond,
			func(t int64) int64 { return t - t%100_000 }, true},
		{"calendar", CalendarWindow{Limit: 12800, Cron: "* * * * *"}, 12800, time.Minute, minute, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := redistest.Client(t)
			cc := redis.NewClient(&redis.Options{Addr: cl.Options().Addr})
			t.Cleanup(func() { cc.Close() })
			var counter callCounter
			cc.AddHook(&counter)
			set := mustSet(Rule{Name: "w", Limit: c.limit, Prefetch: 20 * time.Millisecond})
			prefix := redistest.Prefix(t)
			now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
			var ls []*Limiter
			for range 3 {
				l, err := New(Config{Client: cc, Prefix: prefix, Now: func() time.Time { return now }})
				if err != nil {
					t.Fatal(err)
				}
				ls = append(ls, l)
			}
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(3, 4))
			handed := map[int64]int{} // window start -> units handed out
			// pooled is what the pools hold of the window starting at w.
			pooled := func(w int64) int {
				n := 0
				for _, l := range ls {
					l.pools.mu.Lock()
					for _, p := range l.pools.m {
						for _, g := range p.grants {
							if c.window(g.now.UnixMicro()) == w {
								n += int(g.units)
							}
						}
					}
					l.pools.mu.Unlock()
				}
				return n
			}
			check := func() {
				t.Helper()
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
				before := counter.n.Load()
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
				return requests, admitted, counter.n.Load() - before
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
		})
	}
}

// TestPrefetchWindowGiveBack: on the real clock, the units of a window a
// process took ahead and did not hand out go back to the window when they
// expire, without another request; after a Block (which drops the pools)
// too.
func TestPrefetchWindowGiveBack(t *testing.T) {
	set := mustSet(Rule{Name: "w", Limit: FixedWindow{Limit: 3200, Every: time.Hour}, Prefetch: 10 * time.Millisecond})
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	l, err := New(Config{Client: c, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	used := func() int {
		st, err := l.Status(ctx, set, Request{})
		if err != nil {
			t.Fatal(err)
		}
		if st.Rules[0].ResetAfter < 10*time.Second {
			t.Skip("the hour's window ends within the test")
		}
		return st.Rules[0].Used
	}
	// settled waits until the window counts want units.
	settled := func(want int, what string) {
		t.Helper()
		var got int
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if got = used(); got == want {
				return
			}
		}
		t.Errorf("%s: the window counts %d, want %d", what, got, want)
	}
	handed := 0
	allow := func(n int) {
		for range n {
			d, err := l.Allow(ctx, set, Request{})
			if err != nil || !d.Allowed {
				t.Fatalf("%+v %v", d, err)
			}
			handed++
		}
	}
	allow(20) // batches of 1, 2, 4, 8, 16 (if the loop is fast)
	if u := used(); u < handed {
		t.Fatalf("the window counts %d; %d were handed out", u, handed)
	}
	settled(handed, "after the units expired")
	allow(20)
	if _, err := l.Block(ctx, set, Request{}, time.Now()); err != nil {
		t.Fatal(err)
	}
	settled(handed, "after a Block")
}
