package quotas

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/limits"
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
	switch rng.IntN(6) {
	case 0:
		l = GCRA(gcra.Limit{Rate: float64(limit), Period: every, Burst: 1 + rng.IntN(4)})
	case 5:
		l = randomAdaptive(rng, limit, every)
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
		if rng.IntN(3) == 0 {
			l = randomAdaptiveSlots(rng)
		}
	}
	return Rule{Name: name, Limit: l}
}

// randomAdaptive is an adaptive limit up to max per every, starting
// anywhere between its bounds.
func randomAdaptive(rng *rand.Rand, max int, every time.Duration) Adaptive {
	a := Adaptive{Max: float64(max) * 3, Min: float64(rng.IntN(2)), Per: every, Burst: rng.IntN(4)}
	if rng.IntN(2) == 0 {
		a.Start = a.MinRate() + rng.Float64()*(a.Max-a.MinRate())
	}
	return a
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
	mod   *Model // on the Limiter's prefix, so that leases are the same
	rng   *rand.Rand
	sets  []*Set
	held  []held
	ops   int
	scale time.Duration
	// booking: GCRA-heavy sets, some fair, small steps of time and mostly
	// far reservations, so that requests book ahead of each other and take
	// each other's bookings over; taken counts Held answering false.
	booking bool
	taken   int
	// settling: sets whose rate and window rules have room for several
	// charges, and steps that mostly allow, reserve and settle.
	settling bool
	settled  int // Settle calls compared
	// slots: sets with a fair concurrency rule, many holders of weighted
	// flows, steps shorter than a flow's wait, mostly allows and releases;
	// next and behind count the refusals that said RuleStatus.Next and
	// RuleStatus.Behind.
	slots        bool
	next, behind int
}

func newDiffer(t testing.TB, c redis.UniversalClient, prefix string, seed uint64) *differ {
	rng := rand.New(rand.NewPCG(seed, 3))
	d := &differ{ctx: context.Background(), mod: NewModel(), rng: rng}
	d.l = newClocked(t, c, prefix, starts[rng.IntN(len(starts))])
	d.mod.l = d.l.Limiter
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

// newBookingDiffer is a differ whose sets are mostly GCRA rules (with a
// fixed or sliding window now and then) and whose steps mostly reserve far ahead with
// little time passing: requests book slots ahead of each other, out of
// order, and refund them.
func newBookingDiffer(t testing.TB, c redis.UniversalClient, prefix string, seed uint64) *differ {
	d := newDiffer(t, c, prefix, seed)
	d.booking = true
	d.sets = d.sets[:0]
	for i := 0; i < 4; i++ {
		var rules []Rule
		for j := 0; j < 2+d.rng.IntN(3); j++ {
			name := fmt.Sprintf("r%d", j)
			switch d.rng.IntN(8) {
			case 0:
				rules = append(rules, Rule{Name: name, Limit: FixedWindow{Limit: 2 + d.rng.IntN(6), Every: time.Duration(1+d.rng.IntN(10)) * d.scale}})
				continue
			case 1:
				rules = append(rules, Rule{Name: name + "s", Limit: SlidingWindow{Limit: 2 + d.rng.IntN(6), Every: time.Duration(1+d.rng.IntN(10)) * d.scale}})
				continue
			}
			rate := 1 + d.rng.IntN(6)
			if d.rng.IntN(4) == 0 {
				rules = append(rules, Rule{Name: name + "a", Limit: randomAdaptive(d.rng, rate, time.Duration(1+d.rng.IntN(5))*d.scale)})
				continue
			}
			fair := d.rng.IntN(3) == 0
			if fair {
				name += "f"
			}
			// Half the fair rules order their requests by priority, aging
			// from a tenth of the scale to four scales per level (at
			// most MaxAging).
			var aging time.Duration
			if fair && d.rng.IntN(2) == 0 {
				aging = min(time.Duration(1+d.rng.Int64N(40))*d.scale/10, limits.MaxAging)
			}
			rules = append(rules, Rule{Name: name, Fair: fair, Aging: aging, Limit: GCRA(gcra.Limit{Rate: float64(rate), Period: time.Duration(1+d.rng.IntN(5)) * d.scale, Burst: 1 + d.rng.IntN(4)})})
		}
		d.sets = append(d.sets, mustSet(rules...))
	}
	return d
}

var entities = []string{"", "b1", "b2", "tenant:{7}\n", strings.Repeat("é", 40)}

// flows are the values fair rules share among in the tests; slotFlows
// adds, for fair concurrency rules, names that end their tokens hash's
// fixed fields ("~exp", "~seq").
var (
	flows     = []string{"", "f1", "f2", "f3", "f4", strings.Repeat("ü", 300)}
	slotFlows = append(slices.Clone(flows), "xp", "eq")
)

func (d *differ) step(t testing.TB) {
	t.Helper()
	d.ops++
	switch x := d.rng.IntN(10); {
	case x < 4:
	case d.booking:
		d.l.now = d.l.now.Add(time.Duration(d.rng.Int64N(int64(d.scale) / 4)))
	case d.slots:
		d.l.now = d.l.now.Add(time.Duration(d.rng.Int64N(int64(300 * time.Millisecond))))
	case x < 8:
		d.l.now = d.l.now.Add(time.Duration(d.rng.Int64N(int64(d.scale) * 2)))
	default:
		d.l.now = d.l.now.Add(time.Duration(d.rng.Int64N(int64(3 * time.Hour))))
	}
	d.l.now = d.l.now.Truncate(time.Microsecond)
	now := d.l.now.UnixMicro()
	s := d.sets[d.rng.IntN(len(d.sets))]
	req := Request{Cost: d.rng.IntN(3), Holder: fmt.Sprintf("task%d", d.rng.IntN(4)), Critical: d.rng.IntN(4) == 0}
	if d.slots {
		req.Holder, req.Critical = fmt.Sprintf("task%d", d.rng.IntN(16)), d.rng.IntN(16) == 0
	}
	if d.rng.IntN(3) > 0 {
		req.Keys = make([]string, len(s.rules))
		for i := range req.Keys {
			req.Keys[i] = entities[d.rng.IntN(len(entities))]
		}
	}
	if d.rng.IntN(3) == 0 {
		// Per-rule costs, some above a rule's burst or limit.
		req.Costs = make([]int, len(s.rules))
		for i := range req.Costs {
			req.Costs[i] = d.rng.IntN(4)
		}
	}
	if d.booking || d.slots && d.rng.IntN(6) > 0 {
		// (Slots: now and then no flows, Request.Fair nil, the flow "".)
		req.Fair = make([]string, len(s.rules))
		fl := flows
		if d.slots {
			fl = slotFlows
		}
		fi := d.rng.IntN(len(fl))
		for i := range req.Fair {
			req.Fair[i] = fl[fi]
		}
		if d.rng.IntN(2) == 0 {
			// Weighted: mostly the flow's own (1, 2 or 3), now and then
			// another, up to the most.
			w := 1 + fi%3
			if d.rng.IntN(8) == 0 {
				w = d.rng.IntN(limits.MaxWeight + 1)
			}
			req.Weights = make([]int, len(s.rules))
			for i := range req.Weights {
				req.Weights[i] = w
			}
		}
		if (d.booking || d.slots) && d.rng.IntN(4) > 0 {
			// A priority: 0 (the default) to the last level, the first and
			// last most often.
			p := []int{0, 1, 1, 2, 3, 4, 5, 5}[d.rng.IntN(8)]
			req.Priorities = make([]int, len(s.rules))
			for i := range req.Priorities {
				req.Priorities[i] = p
			}
			if d.slots && d.rng.IntN(4) == 0 {
				// A task rescheduled before: waited up to 2 s.
				req.Waited = time.Duration(d.rng.Int64N(int64(2 * time.Second)))
			}
		}
	}
	calls, err := d.l.bind(s, req, true)
	if err != nil {
		t.Fatal(err)
	}
	n := int64(max(req.Cost, 1))
	same := func(name string, got, want Decision, err error) {
		t.Helper()
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("op %d %s at %s on %v keys %q cost %d costs %v holder %s:\n redis %+v\n model %+v %v", d.ops, name,
				d.l.now.Format(time.RFC3339Nano), s.rules, req.Keys, req.Cost, req.Costs, req.Holder, got, want, err)
		}
		for _, r := range got.Rules {
			if r.Next {
				d.next++
			}
			if r.Behind {
				d.behind++
			}
		}
	}
	// Allow and Reserve are compared on the model's state, given the
	// script's nonce: the same names for the same bookings.
	compare := func(name string, got Decision, want reply, n int64) {
		t.Helper()
		same(name, got, d.l.assemble(s, [][]call{calls}, []reply{want}, params{req: req, n: int(n), nonce: got.nonce}), nil)
	}
	x := d.rng.IntN(20)
	if d.settling {
		x = []int{0, 0, 0, 0, 0, 0, 12, 12, 12, 15, 16, 17, 17, 17, 17, 17, 17, 17, 17, 19}[x]
	} else if d.booking {
		// Reserve far ahead (x 12-14) more than half the time, refund
		// (x 16-17) a fifth of it.
		x = []int{0, 0, 0, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 15, 16, 17, 17, 17, 17}[x]
	} else if d.slots {
		// Allow (x 0) more than half the time, renew or release (x 18)
		// a quarter of it.
		x = []int{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 15, 16, 17, 18, 18, 18, 18, 18}[x]
	}
	switch {
	case x < 12:
		// A third of the allows are batches (Limiter.prefetched), whose
		// GCRA charges are placed ahead of now.
		var ahead time.Duration
		if d.rng.IntN(3) == 0 {
			ahead = time.Duration(1 + d.rng.Int64N(int64(d.scale)*3)).Truncate(time.Microsecond)
		}
		got, err := d.l.decideNow(d.ctx, s, req, opAllow, ahead)
		if err != nil {
			t.Fatal(err)
		}
		compare("Allow", got, d.mod.m.decide(calls, opAllow, now, n, ahead.Microseconds(), 0, req.Holder, req.Critical, got.nonce), n)
		if got.Allowed {
			d.held = append(d.held, held{s, req, got})
		}
	case x < 15:
		horizon := time.Duration(d.rng.Int64N(int64(d.scale) * 10))
		if d.booking {
			horizon *= 2
		}
		got, err := d.l.Reserve(d.ctx, s, req, horizon)
		if err != nil {
			t.Fatal(err)
		}
		d.mod.m.victim = ""
		compare("Reserve", got, d.mod.m.decide(calls, opReserve, now, n, horizon.Microseconds(), 0, req.Holder, req.Critical, got.nonce), n)
		if got.Allowed {
			d.held = append(d.held, held{s, req, got})
		}
		if d.mod.m.victim != "" {
			// The owner of the booking taken over learns it.
			for _, h := range d.held {
				if h.d.nonce == d.mod.m.victim {
					d.checkHeld(t, h, now)
				}
			}
		}
	case x < 15 || d.rng.IntN(3) > 0:
		got, err := d.l.Status(d.ctx, s, req)
		if err != nil {
			t.Fatal(err)
		}
		want, err := d.mod.StatusAt(d.l.now, s, req)
		same("Status", got, want, err)
	case x < 16:
		until := d.l.now.Add(time.Duration(d.rng.Int64N(int64(d.scale) * 5)))
		// Half the blocks are of a call decided up to two scales ago
		// (BlockCall): before or after an adaptive rule's last cut.
		var decided time.Time
		if d.rng.IntN(2) == 0 {
			decided = d.l.now.Add(-time.Duration(d.rng.Int64N(int64(d.scale) * 2))).Truncate(time.Microsecond)
		}
		got, err := d.l.BlockCall(d.ctx, s, req, until, decided)
		if err != nil {
			t.Fatal(err)
		}
		want, err := d.mod.BlockCallAt(d.l.now, s, req, until, decided)
		same("Block", got, want, err)
	case len(d.held) == 0:
	case x < 18 && d.booking && d.rng.IntN(3) == 0:
		d.checkHeld(t, d.held[d.rng.IntN(len(d.held))], now)
	case x < 18 && (d.settling || d.rng.IntN(2) == 0):
		// Settle a charge to random actual costs (-1: as charged): the
		// latest one (nothing charged since), the one before it (a charge
		// stacked on it, often at the same moment), or any.
		i := len(d.held) - 1 - d.rng.IntN(min(len(d.held), 2))
		if d.rng.IntN(3) == 0 {
			i = d.rng.IntN(len(d.held))
		}
		h := d.held[i]
		d.held = append(d.held[:i], d.held[i+1:]...)
		if d.rng.IntN(2) == 0 {
			// Two charges of the same request now, the first settled: it
			// finds a charge stacked on its own, made at the same moment.
			hc, err := d.l.bind(h.set, h.req, true)
			if err != nil {
				t.Fatal(err)
			}
			var two [2]Decision
			for k := range two {
				got, err := d.l.Allow(d.ctx, h.set, h.req)
				if err != nil {
					t.Fatal(err)
				}
				want := d.mod.m.decide(hc, opAllow, now, int64(max(h.req.Cost, 1)), 0, 0, h.req.Holder, h.req.Critical, got.nonce)
				same("Allow before Settle", got, d.l.assemble(h.set, [][]call{hc}, []reply{want}, params{req: h.req, n: max(h.req.Cost, 1), nonce: got.nonce}), nil)
				two[k] = got
			}
			if two[0].Allowed {
				h.d = two[0]
			}
			if two[1].Allowed {
				d.held = append(d.held, held{h.set, h.req, two[1]})
			}
		}
		actual := make([]int, len(h.set.rules))
		for j := range actual {
			actual[j] = d.rng.IntN(6) - 1
		}
		if err := d.l.Settle(d.ctx, h.set, h.req, h.d, actual); err != nil {
			t.Fatal(err)
		}
		if err := d.mod.SettleAt(d.l.now, h.set, h.req, h.d, actual); err != nil {
			t.Fatal(err)
		}
		d.settled++
		// The state after it, on the request's keys.
		got, err := d.l.Status(d.ctx, h.set, h.req)
		if err != nil {
			t.Fatal(err)
		}
		want, err := d.mod.StatusAt(d.l.now, h.set, h.req)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("op %d Settle %v of %+v on %v %+v:\n redis %+v\n model %+v %v", d.ops, actual, h.d, h.set.rules, h.req, got, want, err)
		}
	case x < 18:
		i := d.rng.IntN(len(d.held))
		h := d.held[i]
		d.held = append(d.held[:i], d.held[i+1:]...)
		if err := d.l.Refund(d.ctx, h.set, h.req, h.d); err != nil {
			t.Fatal(err)
		}
		if err := d.mod.RefundAt(d.l.now, h.set, h.req, h.d); err != nil {
			t.Fatal(err)
		}
	default:
		// One of the latest decisions: older leases have mostly expired.
		h := d.held[len(d.held)-1-d.rng.IntN(min(len(d.held), 4))]
		if len(h.d.Leases) == 0 {
			return
		}
		ls := h.d.Leases[d.rng.IntN(len(h.d.Leases))]
		var got, want bool
		var merr error
		if d.rng.IntN(2) == 0 {
			got, err = d.l.Renew(d.ctx, ls)
			want, merr = d.mod.RenewAt(d.l.now, ls)
		} else {
			ls = d.outcome(ls)
			got, err = d.l.Release(d.ctx, ls)
			want, merr = d.mod.ReleaseAt(d.l.now, ls)
		}
		if err != nil || merr != nil || got != want {
			t.Fatalf("op %d lease %+v: redis %v %v, model %v %v", d.ops, ls, got, err, want, merr)
		}
	}
}

// checkHeld asks the script and the model whether h's bookings are still
// its own.
func (d *differ) checkHeld(t testing.TB, h held, now int64) {
	t.Helper()
	got, err := d.l.Held(d.ctx, h.set, h.req, h.d)
	if err != nil {
		t.Fatal(err)
	}
	want, err := d.mod.HeldAt(d.l.now, h.set, h.req, h.d)
	if err != nil || got != want {
		t.Fatalf("op %d Held %+v: redis %v, model %v %v", d.ops, h.d, got, want, err)
	}
	if !got {
		d.taken++
	}
}

// TestDifferential runs random rule sets of every kind through the Lua
// script and the Go model on explicit clocks around DST changes, a leap day
// and a year end, and requires identical decisions.
func TestDifferential(t *testing.T) {
	runDiffers(t, newDiffer, 1, 3000, func(*differ) {})
}

// runDiffers runs 8 differs made by newD in parallel, worker w's seeded
// seed+w on a prefix of its own, steps steps each, hands each to done at
// its end, and checks that every key written has a TTL.
func runDiffers(t *testing.T, newD func(testing.TB, redis.UniversalClient, string, uint64) *differ, seed uint64, steps int, done func(*differ)) {
	t.Helper()
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	redistest.Parallel(t, 8, func(t testing.TB, w int) {
		d := newD(t, c, fmt.Sprintf("%sw%d:", prefix, w), seed+uint64(w))
		for i := 0; i < steps; i++ {
			d.step(t)
		}
		done(d)
	})
	assertAllExpire(t, c, prefix)
}

// newSettleDiffer is a differ whose sets' rate and window rules have room
// for several charges (a settle then often finds charges stacked on its
// own) and whose steps mostly allow, reserve and settle.
func newSettleDiffer(t testing.TB, c redis.UniversalClient, prefix string, seed uint64) *differ {
	d := newDiffer(t, c, prefix, seed)
	d.settling = true
	d.sets = d.sets[:0]
	for i := 0; i < 4; i++ {
		var rules []Rule
		for j := 0; j < 1+d.rng.IntN(3); j++ {
			name := fmt.Sprintf("r%d", j)
			limit, every := 4+d.rng.IntN(12), time.Duration(1+d.rng.IntN(10))*d.scale
			switch d.rng.IntN(6) {
			case 0:
				rules = append(rules, Rule{Name: name, Limit: FixedWindow{Limit: limit, Every: every}})
			case 1:
				rules = append(rules, Rule{Name: name, Limit: SlidingWindow{Limit: limit, Every: every}})
			case 2:
				rules = append(rules, Rule{Name: name + "a", Limit: randomAdaptive(d.rng, limit, every)})
			default:
				fair := d.rng.IntN(3) == 0
				if fair {
					name += "f"
				}
				rules = append(rules, Rule{Name: name, Fair: fair, Limit: GCRA(gcra.Limit{Rate: float64(limit), Period: every, Burst: 3 + d.rng.IntN(8)})})
			}
		}
		d.sets = append(d.sets, mustSet(rules...))
	}
	return d
}

// TestDifferentialSettle runs Settle (and per-rule costs) through the Lua
// script and the Go model: charges settled to less and to more, alone, under
// charges stacked on them at the same moment, and bookings of their own.
func TestDifferentialSettle(t *testing.T) {
	var settled atomic.Int64
	runDiffers(t, newSettleDiffer, 300, 2000, func(d *differ) { settled.Add(int64(d.settled)) })
	t.Logf("%d settles compared", settled.Load())
	if settled.Load() < 1000 {
		t.Errorf("only %d settles", settled.Load())
	}
}

// TestDifferentialBookings runs GCRA-heavy rule sets through the Lua script
// and the Go model with requests reserving far ahead of each other, out of
// order, and refunding: bookings of their own beside the TATs.
func TestDifferentialBookings(t *testing.T) {
	var booked, taken, steals, leaps, cut, burst atomic.Int64
	runDiffers(t, newBookingDiffer, 100, 3000, func(d *differ) {
		leaps.Add(int64(d.mod.m.leaps))
		for _, bs := range d.mod.m.books {
			booked.Add(int64(len(bs)))
		}
		taken.Add(int64(d.taken))
		steals.Add(int64(d.mod.m.steals))
		for _, l := range d.mod.m.learns {
			if l.d > 0 {
				cut.Add(1)
			}
			if l.x > 0 {
				burst.Add(1)
			}
		}
	})
	// The test means something only if requests booked ahead of others and
	// took over each other's bookings.
	t.Logf("%d bookings of their own alive at the end, %d taken over (%d by a higher priority); Held false %d times; %d adaptive keys cut, %d with a failed probe's excess (x)", booked.Load(), steals.Load(), leaps.Load(), taken.Load(), cut.Load(), burst.Load())
	if n := booked.Load(); n < 500 {
		t.Errorf("only %d bookings of their own were made", n)
	}
	if taken.Load() < 10 {
		t.Errorf("Held answered false only %d times", taken.Load())
	}
	if leaps.Load() < 10 {
		t.Errorf("only %d bookings were taken over by a higher priority", leaps.Load())
	}
	if cut.Load() < 10 {
		t.Errorf("only %d adaptive keys were cut", cut.Load())
	}
	if burst.Load() < 5 {
		t.Errorf("only %d adaptive keys saw a failed probe's excess", burst.Load())
	}
}

// randomAdaptiveSlots is an adaptive concurrency limit of 1-8 slots at
// most, learning from 1-3 up.
func randomAdaptiveSlots(rng *rand.Rand) Concurrency {
	most := 1 + rng.IntN(8)
	return Concurrency{Adaptive: true, Min: 1 + rng.IntN(min(most, 3)), Max: most, Lease: time.Duration(1+rng.IntN(10)) * time.Second}
}

// outcome is what a call made under a slot showed, drawn for a release:
// mostly a latency near 50 ms, now and then up to four times that, or
// overload; a fifth of releases report nothing.
func (d *differ) outcome(ls Lease) Lease {
	switch x := d.rng.IntN(20); {
	case x < 4:
		return ls
	case x < 5:
		return ls.Outcome(time.Duration(d.rng.Int64N(int64(time.Second))), true)
	default:
		u := d.rng.Float64()
		return ls.Outcome(time.Duration(float64(50*time.Millisecond)*(1+3*u*u*u)), false)
	}
}

// newSlotsDiffer is a differ whose sets have a fair concurrency rule of 1-5
// slots, alone or with another rule (a plain concurrency rule, a GCRA or a
// fixed window), whose requests come from 16 holders of weighted flows,
// and whose steps mostly allow and release, less than a flow's wait apart.
func newSlotsDiffer(t testing.TB, c redis.UniversalClient, prefix string, seed uint64) *differ {
	d := newDiffer(t, c, prefix, seed)
	d.slots, d.scale = true, time.Second
	d.sets = d.sets[:0]
	for i := 0; i < 4; i++ {
		max := 1 + d.rng.IntN(5)
		fair := Rule{Name: "cf", Fair: true, Limit: Concurrency{Max: max, Reserved: d.rng.IntN(max) * d.rng.IntN(2), Lease: time.Duration(1+d.rng.IntN(10)) * time.Second}}
		if d.rng.IntN(2) == 0 {
			// Priorities, aging 50-500 ms a level: flows wait up to a
			// second after their last denial, so some age.
			fair.Aging = time.Duration(1+d.rng.IntN(10)) * 50 * time.Millisecond
		}
		rules := []Rule{fair}
		switch d.rng.IntN(4) {
		case 0:
			rules = append(rules, Rule{Name: "c", Limit: Concurrency{Max: 1 + d.rng.IntN(6), Lease: 5 * time.Second}})
		case 1:
			rules = append(rules, Rule{Name: "g", Limit: GCRA(gcra.Limit{Rate: float64(2 + d.rng.IntN(6)), Period: time.Second, Burst: 1 + d.rng.IntN(4)})})
		case 2:
			rules = append(rules, Rule{Name: "w", Limit: FixedWindow{Limit: 3 + d.rng.IntN(8), Every: time.Second}})
		}
		if d.rng.IntN(2) == 0 {
			slices.Reverse(rules)
		}
		d.sets = append(d.sets, mustSet(rules...))
	}
	return d
}

// newSlotLearnDiffer is a slots differ whose sets have an adaptive
// concurrency rule, beside another rule half the time, and whose releases
// mostly report a call's latency (outcome).
func newSlotLearnDiffer(t testing.TB, c redis.UniversalClient, prefix string, seed uint64) *differ {
	d := newDiffer(t, c, prefix, seed)
	d.slots, d.scale = true, time.Second
	d.sets = d.sets[:0]
	for i := 0; i < 4; i++ {
		rules := []Rule{{Name: "ac", Limit: randomAdaptiveSlots(d.rng)}}
		switch d.rng.IntN(4) {
		case 0:
			rules = append(rules, Rule{Name: "c", Limit: Concurrency{Max: 1 + d.rng.IntN(6), Lease: 5 * time.Second}})
		case 1:
			rules = append(rules, Rule{Name: "g", Limit: GCRA(gcra.Limit{Rate: float64(2 + d.rng.IntN(6)), Period: time.Second, Burst: 1 + d.rng.IntN(4)})})
		}
		if d.rng.IntN(2) == 0 {
			slices.Reverse(rules)
		}
		d.sets = append(d.sets, mustSet(rules...))
	}
	return d
}

// TestDifferentialSlotLearning runs adaptive concurrency rules through the
// Lua scripts and the Go model, releases reporting latencies and
// overloads, and requires identical decisions and learned slots (Status
// replies them); it fails unless the learned limits both rose and fell
// many times.
func TestDifferentialSlotLearning(t *testing.T) {
	var raised, cut atomic.Int64
	runDiffers(t, newSlotLearnDiffer, 900, 3000, func(d *differ) {
		raised.Add(int64(d.mod.m.slotRaised))
		cut.Add(int64(d.mod.m.slotCut))
	})
	t.Logf("learned limits raised %d times, lowered %d times", raised.Load(), cut.Load())
	if raised.Load() < 100 || cut.Load() < 50 {
		t.Errorf("learned limits raised %d and lowered %d times: too few to compare", raised.Load(), cut.Load())
	}
}

// TestDifferentialFairSlots runs fair concurrency rules through the Lua
// script and the Go model: flows of weights 1-3 (now and then up to the
// most) and priorities 1-5 (half the rules with Aging; a quarter of the
// requests saying they waited before) asking for few
// slots, waiting, taking turns, their leases released, renewed and ending,
// and requires identical decisions; and that fairness refused allows with
// slots free (left to flows before them) often, and that flows often
// waited at a level their wait had aged to.
func TestDifferentialFairSlots(t *testing.T) {
	var yielded, aged, next, behind atomic.Int64
	runDiffers(t, newSlotsDiffer, 500, 3000, func(d *differ) {
		yielded.Add(int64(d.mod.m.yielded))
		aged.Add(int64(d.mod.m.aged))
		next.Add(int64(d.next))
		behind.Add(int64(d.behind))
	})
	t.Logf("%d allows left a free slot to flows before them; %d denials waited at an earlier level than their own; %d refusals said Next, %d Behind",
		yielded.Load(), aged.Load(), next.Load(), behind.Load())
	if next.Load() < 100 || behind.Load() < 100 {
		t.Errorf("only %d refusals said Next and %d Behind", next.Load(), behind.Load())
	}
	if yielded.Load() < 200 {
		t.Errorf("only %d allows left a free slot to other flows", yielded.Load())
	}
	if aged.Load() < 100 {
		t.Errorf("only %d denials waited at a level their wait had aged to", aged.Load())
	}
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
