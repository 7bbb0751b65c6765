package quotas

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// clocked is a Limiter on an explicit clock the test moves.
type clocked struct {
	*Limiter
	now time.Time
}

func newClocked(t testing.TB, c redis.UniversalClient, prefix string, start time.Time) *clocked {
	t.Helper()
	cl := &clocked{now: start}
	l, err := New(Config{Client: c, Prefix: prefix, Now: func() time.Time { return cl.now }})
	if err != nil {
		t.Fatal(err)
	}
	cl.Limiter = l
	return cl
}

var calendars = []CalendarWindow{
	{Cron: "0 0 * * *", TZ: "America/Los_Angeles"},
	{Cron: "0 0 * * *", TZ: "Europe/London"},
	{Cron: "30 1 * * *", TZ: "America/Los_Angeles"},
	{Cron: "0 0 1 * *"},
	{Cron: "0 0 1 1 *", TZ: "Asia/Tokyo"},
	{Cron: "*/15 * * * *", TZ: "Europe/London"},
	{Cron: "0 9 * * 1", TZ: "Europe/Berlin"},
}

// Instants around which the differential test runs: DST changes in Los
// Angeles and London, a leap day, a year end.
var starts = []time.Time{
	time.Date(2026, 3, 7, 20, 0, 0, 0, time.UTC),
	time.Date(2026, 10, 31, 20, 0, 0, 0, time.UTC),
	time.Date(2026, 3, 28, 20, 0, 0, 0, time.UTC),
	time.Date(2026, 10, 24, 20, 0, 0, 0, time.UTC),
	time.Date(2028, 2, 27, 20, 0, 0, 0, time.UTC),
	time.Date(2027, 2, 27, 20, 0, 0, 0, time.UTC),
	time.Date(2026, 12, 30, 20, 0, 0, 0, time.UTC),
}

func randomRule(rng *rand.Rand, name string, scale time.Duration) Rule {
	limit := 1 + rng.IntN(6)
	every := time.Duration(1+rng.IntN(20)) * scale
	var l Limit
	switch rng.IntN(5) {
	case 0:
		l = GCRA(gcra.Limit{Rate: float64(limit), Period: every, Burst: 1 + rng.IntN(4)})
	case 1:
		l = FixedWindow{Limit: limit, Every: every}
	case 2:
		c := calendars[rng.IntN(len(calendars))]
		c.Limit = limit * 3
		l = c
	case 3:
		l = SlidingWindow{Limit: limit, Every: every}
	default:
		l = Concurrency{Max: 1 + rng.IntN(3), Lease: time.Duration(1+rng.IntN(30)) * time.Second, Reserved: rng.IntN(2) * rng.IntN(2)}
		if c := l.(Concurrency); c.Reserved >= c.Max {
			l = Concurrency{Max: c.Max, Lease: c.Lease}
		}
	}
	return Rule{Name: name, Limit: l}
}

// held is an admitted decision the test may later refund or whose leases
// it may renew or release.
type held struct {
	set *Set
	req Request
	d   Decision
}

type differ struct {
	ctx   context.Context
	l     *clocked
	m     *model
	rng   *rand.Rand
	sets  []*Set
	held  []held
	ops   int
	scale time.Duration
}

func newDiffer(t testing.TB, c redis.UniversalClient, prefix string, seed uint64) *differ {
	rng := rand.New(rand.NewPCG(seed, 3))
	d := &differ{ctx: context.Background(), m: newModel(), rng: rng}
	d.l = newClocked(t, c, prefix, starts[rng.IntN(len(starts))])
	d.scale = []time.Duration{time.Second, time.Minute, time.Hour}[rng.IntN(3)]
	for i := 0; i < 4; i++ {
		var rules []Rule
		for j := 0; j < 1+rng.IntN(5); j++ {
			rules = append(rules, randomRule(rng, fmt.Sprintf("r%d", j), d.scale))
		}
		s, err := NewSet(rules...)
		if err != nil {
			t.Fatal(err)
		}
		d.sets = append(d.sets, s)
	}
	return d
}

var entities = []string{"", "b1", "b2", "tenant:{7}\n", strings.Repeat("é", 40)}

func (d *differ) step(t testing.TB) {
	t.Helper()
	d.ops++
	switch x := d.rng.IntN(10); {
	case x < 4:
	case x < 8:
		d.l.now = d.l.now.Add(time.Duration(d.rng.Int64N(int64(d.scale) * 2)))
	default:
		d.l.now = d.l.now.Add(time.Duration(d.rng.Int64N(int64(3 * time.Hour))))
	}
	d.l.now = d.l.now.Truncate(time.Microsecond)
	now := d.l.now.UnixMicro()
	s := d.sets[d.rng.IntN(len(d.sets))]
	req := Request{Cost: d.rng.IntN(3), Holder: fmt.Sprintf("task%d", d.rng.IntN(4)), Critical: d.rng.IntN(4) == 0}
	if d.rng.IntN(3) > 0 {
		req.Keys = make([]string, len(s.rules))
		for i := range req.Keys {
			req.Keys[i] = entities[d.rng.IntN(len(entities))]
		}
	}
	calls, err := d.l.bind(s, req, true)
	if err != nil {
		t.Fatal(err)
	}
	n := int64(max(req.Cost, 1))
	compare := func(name string, got Decision, want reply, n int64) {
		t.Helper()
		w := d.l.assemble(s, [][]call{calls}, []reply{want}, params{req: req, n: int(n), nonce: got.nonce})
		if !reflect.DeepEqual(got, w) {
			t.Fatalf("op %d %s at %s on %v keys %q cost %d holder %s:\n redis %+v\n model %+v", d.ops, name,
				d.l.now.Format(time.RFC3339Nano), s.rules, req.Keys, req.Cost, req.Holder, got, w)
		}
	}
	switch x := d.rng.IntN(20); {
	case x < 12:
		got, err := d.l.Allow(d.ctx, s, req)
		if err != nil {
			t.Fatal(err)
		}
		compare("Allow", got, d.m.decide(calls, opAllow, now, n, 0, 0, req.Holder, req.Critical, got.nonce), n)
		if got.Allowed {
			d.held = append(d.held, held{s, req, got})
		}
	case x < 15:
		horizon := time.Duration(d.rng.Int64N(int64(d.scale) * 10))
		got, err := d.l.Reserve(d.ctx, s, req, horizon)
		if err != nil {
			t.Fatal(err)
		}
		compare("Reserve", got, d.m.decide(calls, opReserve, now, n, horizon.Microseconds(), 0, req.Holder, req.Critical, got.nonce), n)
		if got.Allowed {
			d.held = append(d.held, held{s, req, got})
		}
	case x < 15 || d.rng.IntN(3) > 0:
		got, err := d.l.Status(d.ctx, s, req)
		if err != nil {
			t.Fatal(err)
		}
		compare("Status", got, d.m.decide(calls, opStatus, now, 0, 0, 0, req.Holder, req.Critical, ""), 0)
	case x < 16:
		until := d.l.now.Add(time.Duration(d.rng.Int64N(int64(d.scale) * 5)))
		got, err := d.l.Block(d.ctx, s, req, until)
		if err != nil {
			t.Fatal(err)
		}
		d.m.block(calls, now, until.UnixMicro())
		compare("Block", got, d.m.decide(calls, opStatus, now, 0, 0, 0, req.Holder, req.Critical, ""), 0)
	case len(d.held) == 0:
	case x < 18:
		i := d.rng.IntN(len(d.held))
		h := d.held[i]
		d.held = append(d.held[:i], d.held[i+1:]...)
		if err := d.l.Refund(d.ctx, h.set, h.req, h.d); err != nil {
			t.Fatal(err)
		}
		hc, _ := d.l.bind(h.set, h.req, true)
		d.m.refund(hc, now, int64(h.d.cost), h.d.ats, h.d.undo, h.req.Holder, h.d.nonce)
	default:
		h := d.held[d.rng.IntN(len(d.held))]
		if len(h.d.Leases) == 0 {
			return
		}
		ls := h.d.Leases[d.rng.IntN(len(h.d.Leases))]
		hc, _ := d.l.bind(h.set, h.req, true)
		d.m.housekeep(hc, now)
		var got, want bool
		if d.rng.IntN(2) == 0 {
			got, err = d.l.Renew(d.ctx, ls)
			want = d.m.renew(ls.zkey, ls.Holder, ls.Token, ls.Duration.Microseconds(), now)
		} else {
			got, err = d.l.Release(d.ctx, ls)
			want = d.m.release(ls.zkey, ls.Holder, ls.Token)
		}
		if err != nil || got != want {
			t.Fatalf("op %d lease %+v: redis %v %v, model %v", d.ops, ls, got, err, want)
		}
	}
}

// TestDifferential runs random rule sets of every kind through the Lua
// script and the Go model on explicit clocks around DST changes, a leap day
// and a year end, and requires identical decisions.
func TestDifferential(t *testing.T) {
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	redistest.Parallel(t, 8, func(t testing.TB, w int) {
		d := newDiffer(t, c, fmt.Sprintf("%sw%d:", prefix, w), uint64(w+1))
		for i := 0; i < 3000; i++ {
			d.step(t)
		}
	})
	assertAllExpire(t, c, prefix)
}

// assertAllExpire fails if any key under prefix has no TTL.
func assertAllExpire(t *testing.T, c *redis.Client, prefix string) {
	t.Helper()
	ctx := context.Background()
	n := 0
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		n++
		if ttl := c.PTTL(ctx, iter.Val()).Val(); ttl < 0 {
			t.Errorf("key %q has no TTL (%v)", iter.Val(), ttl)
		}
	}
	if n == 0 {
		t.Error("no keys written")
	}
}

// FuzzDifferential drives the Lua script and the model with random rule
// sets and operations from the fuzzer's seed.
func FuzzDifferential(f *testing.F) {
	f.Add(uint64(1), 50)
	f.Add(uint64(2024), 300)
	f.Fuzz(func(t *testing.T, seed uint64, steps int) {
		steps = min(max(steps, 0), 400)
		d := newDiffer(t, redistest.Client(t), redistest.Prefix(t), seed)
		for i := 0; i < steps; i++ {
			d.step(t)
		}
	})
}
