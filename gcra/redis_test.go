package gcra

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// clockLimiter is a Limiter on an explicit clock that the test moves.
type clockLimiter struct {
	*Limiter
	now time.Time
}

func newClockLimiter(t testing.TB, c redis.UniversalClient, prefix string) *clockLimiter {
	t.Helper()
	cl := &clockLimiter{now: t0}
	l, err := New(Config{Client: c, Prefix: prefix, Now: func() time.Time { return cl.now }})
	if err != nil {
		t.Fatal(err)
	}
	cl.Limiter = l
	return cl
}

// differ applies one random operation to the Redis limiter and the model and
// reports a difference.
type differ struct {
	ctx    context.Context
	redis  *clockLimiter
	model  Model
	rng    *rand.Rand
	keys   []string
	limits map[string]Limit
	ops    int
}

func randomLimit(rng *rand.Rand) Limit {
	periods := []time.Duration{time.Millisecond, 37 * time.Millisecond, time.Second, 10 * time.Second, time.Minute, time.Hour, 24 * time.Hour}
	rates := []float64{1, 1.8, 3, 7, 18, 100, 0.5}
	l := Limit{Rate: rates[rng.IntN(len(rates))], Period: periods[rng.IntN(len(periods))], Burst: 1 + rng.IntN(12)}
	if l.Validate() != nil {
		return PerSecond(5)
	}
	return l
}

func (d *differ) step(t testing.TB) {
	key := d.keys[d.rng.IntN(len(d.keys))]
	l := d.limits[key]
	em := l.Interval()
	// Time steps from zero to days, mostly near the emission interval.
	switch x := d.rng.IntN(10); {
	case x < 3:
	case x < 7:
		d.redis.now = d.redis.now.Add(time.Duration(d.rng.Int64N(int64(em)*2 + 1)))
	case x < 9:
		d.redis.now = d.redis.now.Add(time.Duration(d.rng.Int64N(min(int64(em)*int64(l.Burst)*3, int64(6*time.Hour)) + 1)))
	case d.rng.IntN(4) == 0:
		d.redis.now = d.redis.now.Add(time.Duration(d.rng.Int64N(int64(48 * time.Hour))))
	}
	d.redis.now = d.redis.now.Truncate(time.Microsecond)
	n := d.rng.IntN(2*l.Burst + 1)
	horizon := time.Duration(d.rng.Int64N(int64(em) * int64(3*l.Burst+1)))
	var got, want Result
	var gerr, werr error
	var name string
	switch x := d.rng.IntN(20); {
	case x < 9:
		name = fmt.Sprintf("AllowN(%d)", n)
		got, gerr = d.redis.AllowN(d.ctx, key, l, n)
		want, werr = d.model.AllowN(d.redis.now, key, l, n)
	case x < 10:
		name = "Peek"
		got, gerr = d.redis.Peek(d.ctx, key, l)
		want, werr = d.model.AllowN(d.redis.now, key, l, 0)
	case x < 16:
		name = fmt.Sprintf("Reserve(%d, %v)", n, horizon)
		got, gerr = d.redis.Reserve(d.ctx, key, l, n, horizon)
		want, werr = d.model.Reserve(d.redis.now, key, l, n, horizon)
	case x < 19:
		name = fmt.Sprintf("Refund(%d)", n)
		got, gerr = d.redis.Refund(d.ctx, key, l, n)
		want, werr = d.model.Refund(d.redis.now, key, l, n)
	default:
		name = "Reset"
		gerr = d.redis.Reset(d.ctx, key)
		d.model.Reset(key)
	}
	d.ops++
	if gerr != nil || werr != nil {
		t.Fatalf("op %d %s on %q: redis err %v, model err %v", d.ops, name, key, gerr, werr)
	}
	if !got.Now.Equal(want.Now) || got.Allowed != want.Allowed || got.Remaining != want.Remaining ||
		got.RetryAfter != want.RetryAfter || got.ResetAfter != want.ResetAfter || got.Delay != want.Delay || got.Limit != want.Limit {
		t.Fatalf("op %d %s on %q under %v at %s:\n redis %+v\n model %+v", d.ops, name, key, l, d.redis.now.Format(time.RFC3339Nano), got, want)
	}
}

func newDiffer(t testing.TB, c redis.UniversalClient, prefix string, seed uint64, nkeys int) *differ {
	d := &differ{ctx: context.Background(), redis: newClockLimiter(t, c, prefix), rng: rand.New(rand.NewPCG(seed, 7)), limits: map[string]Limit{}}
	for i := 0; i < nkeys; i++ {
		k := fmt.Sprintf("k%d-%d", seed, i)
		d.keys = append(d.keys, k)
		d.limits[k] = randomLimit(d.rng)
	}
	return d
}

// TestDifferential runs 100,000 random operations against the Lua limiter on
// an explicit clock and against the Go model, and requires identical results.
func TestDifferential(t *testing.T) {
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	redistest.Parallel(t, 8, func(t testing.TB, w int) {
		d := newDiffer(t, c, prefix, uint64(w+1), 4)
		for i := 0; i < 12_500; i++ {
			d.step(t)
		}
	})
}

// FuzzDifferential drives the Lua limiter and the model with operations
// decoded from the fuzzer's bytes.
func FuzzDifferential(f *testing.F) {
	f.Add(uint64(1), 40)
	f.Add(uint64(99), 200)
	f.Add(uint64(12345), 5)
	f.Fuzz(func(t *testing.T, seed uint64, steps int) {
		if steps < 0 || steps > 500 {
			steps %= 500
			if steps < 0 {
				steps = -steps
			}
		}
		d := newDiffer(t, redistest.Client(t), redistest.Prefix(t), seed, 2)
		for i := 0; i < steps; i++ {
			d.step(t)
		}
	})
}

// TestCluster runs the differential test on the 3-master cluster, with keys
// spread over every master.
func TestCluster(t *testing.T) {
	c := redistest.Cluster(t)
	prefix := redistest.Prefix(t)
	d := newDiffer(t, c, prefix, 42, 60)
	masters := map[string]bool{}
	ctx := context.Background()
	for _, k := range d.keys {
		key := d.redis.Key(k)
		// The key hashes on its tag: the encoded user key alone.
		if got, want := c.ClusterKeySlot(ctx, key).Val(), c.ClusterKeySlot(ctx, keys.Encode(k)).Val(); got != want {
			t.Fatalf("key %q in slot %d, its tag %q in slot %d", key, got, keys.Encode(k), want)
		}
		n, err := c.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		masters[n.Options().Addr] = true
	}
	if len(masters) != 3 {
		t.Fatalf("keys landed on %d masters, want 3", len(masters))
	}
	for i := 0; i < 6000; i++ {
		d.step(t)
	}
}

// TestTTL checks that every key expires when it is back at its full burst,
// that peeks and denials write nothing, and that a full refund deletes.
func TestTTL(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	l, err := New(Config{Client: c, Prefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	limit := Limit{Rate: 1, Period: 10 * time.Second, Burst: 3} // T = 10 s
	key := l.Key("ttl")
	if r, err := l.Peek(ctx, "ttl", limit); err != nil || !r.Allowed || r.Remaining != 3 {
		t.Fatalf("peek: %+v %v", r, err)
	}
	if n := c.Exists(ctx, key).Val(); n != 0 {
		t.Fatal("peek created the key")
	}
	var last Result
	for i := 0; i < 3; i++ {
		if last, err = l.Allow(ctx, "ttl", limit); err != nil || !last.Allowed {
			t.Fatalf("allow %d: %+v %v", i, last, err)
		}
	}
	pttl := c.PTTL(ctx, key).Val()
	// The TTL is the time until full again (30 s), less the time since.
	if pttl > last.ResetAfter+time.Millisecond || pttl < last.ResetAfter-5*time.Second || last.ResetAfter < 29*time.Second {
		t.Fatalf("PTTL %v, ResetAfter %v", pttl, last.ResetAfter)
	}
	before := c.Get(ctx, key).Val()
	if r, _ := l.Allow(ctx, "ttl", limit); r.Allowed {
		t.Fatal("4th allowed")
	}
	if after := c.Get(ctx, key).Val(); after != before {
		t.Fatalf("denial wrote the key: %s -> %s", before, after)
	}
	if _, err := strconv.ParseInt(before, 10, 64); err != nil {
		t.Fatalf("stored TAT %q is not an integer: %v", before, err)
	}
	if r, err := l.Refund(ctx, "ttl", limit, 3); err != nil || r.Remaining != 3 {
		t.Fatalf("refund: %+v %v", r, err)
	}
	if n := c.Exists(ctx, key).Val(); n != 0 {
		t.Fatal("full refund left the key")
	}
	// Reset deletes.
	l.Allow(ctx, "ttl", limit)
	if err := l.Reset(ctx, "ttl"); err != nil || c.Exists(ctx, key).Val() != 0 {
		t.Fatalf("reset: %v", err)
	}
}

// TestOneEvalshaPerCall counts the commands the server ran: one EVALSHA per
// decision, and one EVAL after the script cache was flushed.
func TestOneEvalshaPerCall(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	ctx := context.Background()
	l, _ := New(Config{Client: c})
	const calls = 50
	// The first call loads the script (EVALSHA answers NOSCRIPT, then EVAL).
	if _, err := l.Allow(ctx, "k", PerSecond(1000)); err != nil {
		t.Fatal(err)
	}
	c.ConfigResetStat(ctx)
	for i := 0; i < calls; i++ {
		if _, err := l.Allow(ctx, "k", PerSecond(1000)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if r, err := l.Allow(ctx, "k", PerSecond(1000)); err != nil || !r.Allowed {
		t.Fatalf("after SCRIPT FLUSH: %+v %v", r, err)
	}
	stats := redistest.CommandCalls(t, c)
	// EVALSHA: every call, plus the one that met NOSCRIPT; EVAL: once.
	if got := stats["evalsha"]; got != calls+1 {
		t.Errorf("evalsha calls = %d, want %d", got, calls+1)
	}
	if got := stats["eval"]; got != 1 {
		t.Errorf("eval calls = %d, want 1", got)
	}
}

// TestServerClock checks that decisions use the Redis server's clock: the
// decision time lies between two TIME readings, and a limiter on the server
// clock never reads the local one (no time.Now in the package).
func TestServerClock(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	l, _ := New(Config{Client: c, Prefix: redistest.Prefix(t)})
	limit := PerHour(1)
	before := c.Time(ctx).Val()
	r1, err := l.Allow(ctx, "clock", limit)
	if err != nil {
		t.Fatal(err)
	}
	r2, _ := l.Allow(ctx, "clock", limit)
	after := c.Time(ctx).Val()
	if r1.Now.Before(before) || r2.Now.After(after) || r2.Now.Before(r1.Now) {
		t.Fatalf("decision times %v, %v not within server TIME %v..%v", r1.Now, r2.Now, before, after)
	}
	if !r1.Allowed || r2.Allowed || r2.RetryAfter != time.Hour-r2.Now.Sub(r1.Now) {
		t.Fatalf("r1 %+v, r2 %+v", r1, r2)
	}
	files, _ := os.ReadDir(".")
	for _, f := range files {
		if !strings.HasSuffix(f.Name(), ".go") || strings.HasSuffix(f.Name(), "_test.go") {
			continue
		}
		src, _ := os.ReadFile(f.Name())
		if strings.Contains(string(src), "time.Now") || strings.Contains(string(src), "time.Since") {
			t.Errorf("%s reads the local clock; decisions must use the server's TIME", f.Name())
		}
	}
}

// TestCrossProcess hammers one key from 3 processes × 20 goroutines for about
// 3 s at 200/s burst 10. Every decision, replayed in the order the server
// made it through the model, must be exactly what GCRA permits at that
// instant: no race ever admits too many, and none denies one too many; so
// the total equals what GCRA permits over the span.
func TestCrossProcess(t *testing.T) {
	if os.Getenv("GCRA_HAMMER") != "" {
		hammerChild(t)
		return
	}
	if testing.Short() {
		t.Skip("spawns processes")
	}
	redistest.Client(t) // skip early when Redis is missing
	prefix := redistest.Prefix(t)
	var mu sync.Mutex
	var ds []hammered
	redistest.Parallel(t, 3, func(t testing.TB, i int) {
		out, err := redistest.Child("TestCrossProcess", "GCRA_HAMMER="+prefix).CombinedOutput()
		if err != nil {
			t.Fatalf("child %d: %v\n%s", i, err, out)
		}
		sc := bufio.NewScanner(strings.NewReader(string(out)))
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "D "); ok {
				var d hammered
				fmt.Sscan(v, &d.at, &d.allowed)
				mu.Lock()
				ds = append(ds, d)
				mu.Unlock()
			}
		}
	})
	if t.Failed() {
		return
	}
	// Requests that shared a script call were decided at one instant, in
	// the call's order, which the children's output does not keep: at one
	// instant GCRA admits a prefix, so the admitted ones come first.
	sort.SliceStable(ds, func(i, j int) bool {
		if ds[i].at != ds[j].at {
			return ds[i].at < ds[j].at
		}
		return ds[i].allowed && !ds[j].allowed
	})
	var m Model
	var allowed int64
	first, last := int64(-1), int64(0)
	for i, d := range ds {
		want, _ := m.AllowN(time.UnixMicro(d.at), "hot", hammerLimit, 1)
		if want.Allowed != d.allowed {
			t.Fatalf("decision %d of %d at %d: limiter allowed=%v, GCRA allows=%v", i, len(ds), d.at, d.allowed, want.Allowed)
		}
		if d.allowed {
			allowed++
			if first < 0 {
				first = d.at
			}
			last = d.at
		}
	}
	permitted := int64(hammerLimit.Burst) + (last-first)/hammerLimit.Interval().Microseconds()
	t.Logf("%d decisions, each what GCRA permits; %d allowed over %.3fs, where GCRA permits at most %d", len(ds), allowed, float64(last-first)/1e6, permitted)
	if len(ds) < 3*int(allowed) {
		t.Fatalf("only %d decisions for %d admissions: the key was not contended", len(ds), allowed)
	}
}

var hammerLimit = Limit{Rate: 200, Period: time.Second, Burst: 10}

// hammered is one decision of a child: its server time and outcome.
type hammered struct {
	at      int64
	allowed bool
}

func hammerChild(t *testing.T) {
	c := redistest.Client(t)
	l, err := New(Config{Client: c, Prefix: os.Getenv("GCRA_HAMMER")})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var lines []string
	stop := time.Now().Add(3 * time.Second)
	redistest.Parallel(t, 20, func(t testing.TB, _ int) {
		for time.Now().Before(stop) {
			r, err := l.Allow(context.Background(), "hot", hammerLimit)
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			lines = append(lines, fmt.Sprintf("D %d %v", r.Now.UnixMicro(), r.Allowed))
			mu.Unlock()
		}
	})
	fmt.Println(strings.Join(lines, "\n"))
}
