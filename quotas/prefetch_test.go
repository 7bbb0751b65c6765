package quotas

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// callCounter counts the commands a client sends, pipelined ones each.
type callCounter struct{ n atomic.Int64 }

func (c *callCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *callCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}
func (c *callCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

func TestPrefetchValidation(t *testing.T) {
	g := GCRA{Rate: 1000, Period: time.Second, Burst: 100} // T = 1ms
	for _, c := range []struct {
		name string
		r    Rule
	}{
		{"window too long", Rule{Name: "w", Limit: FixedWindow{Limit: 10, Every: time.Second}, Prefetch: time.Second}},
		{"fair", Rule{Name: "f", Limit: g, Fair: true, Prefetch: time.Millisecond}},
		{"adaptive", Rule{Name: "a", Limit: Adaptive{Max: 1000, Per: time.Second, Burst: 100}, Prefetch: time.Millisecond}},
		{"negative", Rule{Name: "n", Limit: g, Prefetch: -time.Millisecond}},
		{"too long", Rule{Name: "l", Limit: g, Prefetch: 101 * time.Millisecond}},
		{"burst too small", Rule{Name: "b", Limit: g, Prefetch: 100 * time.Millisecond}}, // 100 units of 100
	} {
		err := c.r.Validate()
		var re *RuleError
		if !errors.As(err, &re) || re.Field != "Rule.Prefetch" {
			t.Errorf("%s: got %v, want a RuleError on Rule.Prefetch", c.name, err)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}
	if err := (Rule{Name: "ok", Limit: g, Prefetch: 99 * time.Millisecond}).Validate(); err != nil {
		t.Errorf("99 units of a burst of 100 ahead: %v", err)
	}
	for _, l := range []Limit{FixedWindow{Limit: 1, Every: time.Second}, CalendarWindow{Limit: 5, Cron: "@daily"}, SlidingWindow{Limit: 5, Every: time.Second}} {
		if err := (Rule{Name: "w", Limit: l, Prefetch: 100 * time.Millisecond}).Validate(); err != nil {
			t.Errorf("%s with prefetch: %v", l, err)
		}
	}
}

// TestPrefetchExact hands out prefetched units from three limiters (three
// processes) on one Redis, on an explicit clock, to requests that arrive
// faster than the rule allows and then slower: every unit is counted when
// a limiter hands it out, and no span of time may hold more than the
// rule's Burst plus one per interval elapsed, checked on the times alone.
// Below the limit most requests must need no script call.
// TestPrefetchCostAboveBatch: a request of a prefetching set whose cost no
// batch can carry (above the burst less what a batch is charged ahead) is
// decided as usual, with the whole burst: admitted without a batch up to
// the burst, denied for good (Never) above it, naming the rule; an error
// for keys that do not fit the set.
func TestPrefetchCostAboveBatch(t *testing.T) {
	l, err := New(Config{Client: redistest.Client(t), Prefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	s := mustSet(Rule{Name: "hot", Limit: GCRA{Rate: 1000, Period: time.Second, Burst: 100}, Prefetch: 10 * time.Millisecond})
	d, err := l.Allow(context.Background(), s, Request{Cost: 95})
	if err != nil || !d.Allowed || d.pf != nil || d.Rules[0].Remaining != 5 {
		t.Fatalf("cost 95 of a burst of 100, above a batch's 90: %+v, %v; want admitted as usual, 5 left", d, err)
	}
	d, err = l.Allow(context.Background(), s, Request{Cost: 101})
	if err != nil || d.Allowed || d.RetryAfter != Never || d.Rule != "hot" {
		t.Fatalf("cost 101 over a burst of 100: %+v, %v; want denied, Never, rule hot", d, err)
	}
	if _, err := l.Allow(context.Background(), s, Request{Keys: []string{"a", "b"}}); err == nil {
		t.Fatal("two keys for one rule: no error")
	}
}

func TestPrefetchExact(t *testing.T) {
	c := redistest.Client(t)
	cc := redis.NewClient(&redis.Options{Addr: c.Options().Addr})
	t.Cleanup(func() { cc.Close() })
	var counter callCounter
	cc.AddHook(&counter)
	limit := gcra.Limit{Rate: 10000, Period: time.Second, Burst: 500} // T = 100µs
	set := mustSet(Rule{Name: "hot", Limit: GCRA(limit), Prefetch: 20 * time.Millisecond})
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
	rng := rand.New(rand.NewPCG(1, 2))
	var handed, denied []int64
	phase := func(d, step time.Duration) (requests int, calls int64) {
		before := counter.n.Load()
		for end := now.Add(d); now.Before(end); now = now.Add(time.Duration(rng.Int64N(int64(step))) + 1) {
			requests++
			dec, err := ls[rng.IntN(len(ls))].Allow(ctx, set, Request{})
			if err != nil {
				t.Fatal(err)
			}
			if dec.Allowed {
				handed = append(handed, now.UnixMicro())
			} else {
				denied = append(denied, now.UnixMicro())
			}
		}
		return requests, counter.n.Load() - before
	}
	// Twice the rate, then a third of it.
	busyReq, busyCalls := phase(300*time.Millisecond, 100*time.Microsecond)
	busyHanded, idleStart := len(handed), now.UnixMicro()
	idleReq, idleCalls := phase(600*time.Millisecond, 600*time.Microsecond)
	t.Logf("at 2x the rate: %d requests, %d handed out, %d calls; at 1/3: %d requests, %d handed out, %d calls",
		busyReq, busyHanded, busyCalls, idleReq, len(handed)-busyHanded, idleCalls)
	checkSpans(t, limit, handed)
	if busyHanded < 3000 {
		t.Errorf("at twice the rate, %d handed out in 0.3 s; the rule allows 3,000 and a burst", busyHanded)
	}
	// Below the rate every request is admitted once the busy phase's
	// empty bucket has had a burst's time (50 ms) to refill.
	if last := denied[len(denied)-1]; last >= idleStart+50_000 { // the busy phase has denials
		t.Errorf("below the rate, %d of %d requests handed out; one denied %v into the phase", len(handed)-busyHanded, idleReq, time.Duration(last-idleStart)*time.Microsecond)
	}
	if 4*idleCalls > int64(idleReq) {
		t.Errorf("below the rate, %d calls for %d requests: want at most 1 in 4", idleCalls, idleReq)
	}
}

// TestPrefetchRefund: a refunded prefetched unit goes back to the pool and
// is handed out again without a call; after a Block the pool is empty.
func TestPrefetchRefund(t *testing.T) {
	c := redistest.Client(t)
	cc := redis.NewClient(&redis.Options{Addr: c.Options().Addr})
	t.Cleanup(func() { cc.Close() })
	var counter callCounter
	cc.AddHook(&counter)
	set := mustSet(Rule{Name: "hot", Limit: GCRA{Rate: 100, Period: time.Second, Burst: 20}, Prefetch: 50 * time.Millisecond})
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	l, err := New(Config{Client: cc, Prefix: redistest.Prefix(t), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := Request{Keys: []string{"b1"}}
	var ds []Decision
	for range 4 {
		d, err := l.Allow(ctx, set, req)
		if err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
		ds = append(ds, d)
	}
	calls := counter.n.Load()
	if err := l.Refund(ctx, set, req, ds[3]); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Allow(ctx, set, req); err != nil || !d.Allowed {
		t.Fatalf("after a refund: %+v, %v", d, err)
	}
	if n := counter.n.Load() - calls; n != 0 {
		t.Errorf("a refund and a decision from the pool made %d calls", n)
	}
	// The unit handed out again refunds like any other.
	if err := l.Refund(ctx, set, req, ds[2]); err != nil {
		t.Fatal(err)
	}
	again, err := l.Allow(ctx, set, req)
	if err != nil || !again.Allowed {
		t.Fatalf("after a second refund: %+v, %v", again, err)
	}
	if err := l.Refund(ctx, set, req, again); err != nil {
		t.Errorf("refunding a unit that was refunded and handed out again: %v", err)
	}
	// Past its Prefetch a refunded unit is gone: the next needs a call.
	if _, err := l.Block(ctx, set, req, now); err != nil {
		t.Fatal(err)
	}
	calls = counter.n.Load()
	if d, err := l.Allow(ctx, set, req); err != nil || !d.Allowed {
		t.Fatalf("after a block that ended: %+v, %v", d, err)
	}
	if counter.n.Load() == calls {
		t.Error("a decision after a Block came from the pool")
	}
}

// checkSpans fails t if some span of the times handed (sorted) holds more
// than limit's Burst plus one per interval elapsed.
func checkSpans(t *testing.T, limit gcra.Limit, handed []int64) {
	t.Helper()
	em := limit.Interval().Microseconds()
	for i := range handed {
		for j := i; j < len(handed); j++ {
			if n, bound := int64(j-i+1), int64(limit.Burst)+(handed[j]-handed[i])/em; n > bound {
				t.Fatalf("%d units handed out in %dµs; %v allows %d", n, handed[j]-handed[i], limit, bound)
			}
		}
	}
}

// TestPrefetchWorstCase builds the case a batch's charge ahead is for: one
// process takes batches from a full bucket and hands the last of them out
// just before they expire, at the moment another process takes all the
// bucket holds. Were batches charged at their moment, that moment would
// see the rule's whole burst plus the late units.
func TestPrefetchWorstCase(t *testing.T) {
	limit := gcra.Limit{Rate: 10000, Period: time.Second, Burst: 500} // T = 100µs
	set := mustSet(Rule{Name: "hot", Limit: GCRA(limit), Prefetch: 20 * time.Millisecond})
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	a, err := New(Config{Client: c, Prefix: prefix, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{Client: c, Prefix: prefix, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var handed []int64
	allow := func(l *Limiter) bool {
		d, err := l.Allow(ctx, set, Request{})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			handed = append(handed, now.UnixMicro())
		}
		return d.Allowed
	}
	// a decides its first request as usual (its pool is cold), then takes
	// batches of 1, 2, 4, ... 128 and hands out 128 of the 255.
	for range 129 {
		if !allow(a) {
			t.Fatal("a denied from a full bucket")
		}
	}
	now = now.Add(20*time.Millisecond - time.Microsecond)
	atB := len(handed)
	for allow(b) {
	}
	atA := len(handed)
	for range 127 {
		if !allow(a) {
			t.Fatal("a's prefetched units were gone before their Prefetch")
		}
	}
	t.Logf("at the start, a handed out %d; 20ms later b %d and a %d", atB, atA-atB, len(handed)-atA)
	checkSpans(t, limit, handed)
}

// TestPrefetchConcurrent: 3 limiters × 16 goroutines on the real clock,
// below the rate: every request admitted, at most one call per 4, and
// never more handed out than the whole run allows. Run with -race.
func TestPrefetchConcurrent(t *testing.T) {
	c := redistest.Client(t)
	cc := redis.NewClient(&redis.Options{Addr: c.Options().Addr, PoolSize: 64})
	t.Cleanup(func() { cc.Close() })
	var counter callCounter
	cc.AddHook(&counter)
	limit := gcra.Limit{Rate: 100000, Period: time.Second, Burst: 1000}
	set := mustSet(Rule{Name: "hot", Limit: GCRA(limit), Prefetch: 5 * time.Millisecond})
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	var requests, admitted atomic.Int64
	begin := time.Now()
	done := make(chan struct{})
	for range 3 {
		l, err := New(Config{Client: cc, Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		for range 16 {
			go func() {
				defer func() { done <- struct{}{} }()
				for time.Since(begin) < 300*time.Millisecond {
					requests.Add(1)
					d, err := l.Allow(ctx, set, Request{})
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
					time.Sleep(200 * time.Microsecond) // each goroutine under 5,000/s
				}
			}()
		}
	}
	for range 48 {
		<-done
	}
	took := time.Since(begin)
	t.Logf("%d requests, %d admitted, %d calls in %v", requests.Load(), admitted.Load(), counter.n.Load(), took.Round(time.Millisecond))
	if admitted.Load() != requests.Load() {
		t.Errorf("%d of %d requests admitted below the rate", admitted.Load(), requests.Load())
	}
	if bound := int64(limit.Burst) + int64(took.Seconds()*limit.Rate); admitted.Load() > bound {
		t.Errorf("%d admitted in %v; the limit allows %d", admitted.Load(), took, bound)
	}
	if 4*counter.n.Load() > requests.Load() {
		t.Errorf("%d calls for %d requests: want at most 1 in 4", counter.n.Load(), requests.Load())
	}
}

// TestPrefetchManyKeys: a keyed prefetching rule keeps a pool per key, but
// a Limiter forgets those with nothing usable once it holds maxPools.
func TestPrefetchManyKeys(t *testing.T) {
	set := mustSet(Rule{Name: "per-key", Limit: GCRA{Rate: 1000, Period: time.Second, Burst: 100}, Prefetch: 10 * time.Millisecond})
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	l, err := New(Config{Client: redistest.Client(t), Prefix: redistest.Prefix(t), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range maxPools + 10 {
		if d, err := l.Allow(ctx, set, Request{Keys: []string{strconv.Itoa(i)}}); err != nil || !d.Allowed {
			t.Fatalf("key %d: %+v, %v", i, d, err)
		}
		now = now.Add(10 * time.Microsecond)
	}
	l.pools.mu.Lock()
	n := len(l.pools.m)
	l.pools.mu.Unlock()
	if n > maxPools {
		t.Errorf("%d pools kept for %d keys, at most %d", n, maxPools+10, maxPools)
	}
}
