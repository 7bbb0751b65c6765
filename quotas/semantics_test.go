package quotas

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/calendar"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

func TestNewSetErrors(t *testing.T) {
	ok := GCRA(gcra.PerSecond(1))
	cases := []struct {
		rules []Rule
		want  string
	}{
		{nil, "at least one rule"},
		{[]Rule{{Name: "", Limit: ok}}, `rule 1: name "" must be 1-64 characters`},
		{[]Rule{{Name: "a b", Limit: ok}}, `name "a b" contains ' '`},
		{[]Rule{{Name: "a", Limit: ok}, {Name: "a", Limit: ok}}, `rule "a": duplicate name`},
		{[]Rule{{Name: "a"}}, `rule "a": no limit`},
		{[]Rule{{Name: "g", Limit: GCRA(gcra.Limit{Rate: -1, Period: time.Second, Burst: 1})}}, `rule "g": gcra: invalid limit -1/1s burst 1: rate must be a positive number`},
		{[]Rule{{Name: "w", Limit: FixedWindow{Limit: 0, Every: time.Second}}}, `rule "w": invalid limit: limit must be at least 1, got 0`},
		{[]Rule{{Name: "w", Limit: FixedWindow{Limit: 1, Every: 0}}}, `window must be at least 1ms, got 0s`},
		{[]Rule{{Name: "s", Limit: SlidingWindow{Limit: 1_000_000, Every: time.Second}}}, `exceeds 100000`},
		{[]Rule{{Name: "c", Limit: CalendarWindow{Limit: 1, Cron: "0 0 * *"}}}, `rule "c": `},
		{[]Rule{{Name: "c", Limit: CalendarWindow{Limit: 1, Cron: "0 0 * * *", TZ: "Mars/Base"}}}, `Mars/Base`},
		{[]Rule{{Name: "k", Limit: Concurrency{Max: 0, Lease: time.Minute}}}, `max must be at least 1`},
		{[]Rule{{Name: "k", Limit: Concurrency{Max: 1, Lease: time.Millisecond}}}, `lease must be at least 1s`},
		{[]Rule{{Name: "k", Limit: Concurrency{Max: 2, Lease: time.Minute, Reserved: 2}}}, `reserved must be between 0 and max-1 (1), got 2`},
		{[]Rule{{Name: "f", Limit: FixedWindow{Limit: 1, Every: time.Second}, Fair: true}}, `rule "f": only a GCRA or Concurrency rule can be fair, not a 1 per 1s (fixed window)`},
		{[]Rule{{Name: "p", Limit: ok, Aging: time.Second}}, `rule "p": aging is only for a fair rule (Rule.Fair)`},
		{[]Rule{{Name: "p", Limit: Concurrency{Max: 2, Lease: time.Minute}, Aging: time.Second}}, `rule "p": aging is only for a fair rule (Rule.Fair)`},
		{[]Rule{{Name: "p", Limit: FixedWindow{Limit: 2, Every: time.Minute}, Fair: true, Aging: time.Second}}, `rule "p": only a GCRA or Concurrency rule can be fair, not a 2 per 1m0s (fixed window)`},
		{[]Rule{{Name: "p", Limit: FixedWindow{Limit: 2, Every: time.Minute}, Aging: time.Second}}, `rule "p": aging is only for a fair GCRA or Concurrency rule, not a 2 per 1m0s (fixed window)`},
		{[]Rule{{Name: "p", Limit: ok, Fair: true, Aging: time.Microsecond}}, `rule "p": aging must be between 1ms and 1h0m0s, got 1µs`},
	}
	for _, c := range cases {
		_, err := NewSet(c.rules...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewSet(%v) = %v, want error containing %q", c.rules, err, c.want)
		}
	}
}

func TestRequestErrors(t *testing.T) {
	l, _ := New(Config{Client: redistest.Client(t), Prefix: redistest.Prefix(t)})
	ctx := context.Background()
	set := mustSet(Rule{Name: "g", Limit: GCRA(gcra.PerSecond(1))}, Rule{Name: "c", Limit: Concurrency{Max: 1, Lease: time.Minute}})
	for req, want := range map[*Request]string{
		{Keys: []string{"a"}, Holder: "h"}:     "Request.Keys has 1 keys for 2 rules",
		{Fair: []string{"a"}, Holder: "h"}:     "Request.Fair has 1 flows for 2 rules",
		{Cost: -1, Holder: "h"}:                "Request.Cost must not be negative",
		{Priorities: []int{1}, Holder: "h"}:    "Request.Priorities has 1 priorities for 2 rules",
		{Priorities: []int{6, 0}, Holder: "h"}: "Request.Priorities must be between 0 and 5, got 6",
		{Waited: -time.Second, Holder: "h"}:    "Request.Waited must not be negative, got -1s",
		{}:                                     `rule "c" is a concurrency rule: Request.Holder is required`,
	} {
		if _, err := l.Allow(ctx, set, *req); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Allow(%+v) = %v, want %q", *req, err, want)
		}
	}
	if _, err := l.Allow(ctx, nil, Request{}); err == nil {
		t.Error("nil set accepted")
	}
	if _, err := New(Config{}); err == nil {
		t.Error("no client accepted")
	}
	if _, err := New(Config{Client: redistest.Client(t), Prefix: "a{b"}); err == nil {
		t.Error("prefix with a brace accepted")
	}
	if _, err := l.Renew(ctx, Lease{}); err == nil {
		t.Error("zero lease renewed")
	}
}

// TestFencing: a redelivered holder replaces its own lease and never holds
// two slots; the stale execution's token can neither renew nor release.
func TestFencing(t *testing.T) {
	c := redistest.Client(t)
	l := newClocked(t, c, redistest.Prefix(t), time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	set := mustSet(Rule{Name: "slots", Limit: Concurrency{Max: 2, Lease: 30 * time.Second}})
	first, _ := l.Allow(ctx, set, Request{Holder: "task-1"})
	again, _ := l.Allow(ctx, set, Request{Holder: "task-1"}) // redelivery
	if !first.Allowed || !again.Allowed || again.Rules[0].Used != 1 {
		t.Fatalf("first %+v again %+v", first, again)
	}
	if again.Leases[0].Token <= first.Leases[0].Token {
		t.Fatalf("tokens %d then %d: not increasing", first.Leases[0].Token, again.Leases[0].Token)
	}
	if ok, _ := l.Renew(ctx, first.Leases[0]); ok {
		t.Fatal("stale token renewed")
	}
	if ok, _ := l.Release(ctx, first.Leases[0]); ok {
		t.Fatal("stale token released the new lease")
	}
	other, _ := l.Allow(ctx, set, Request{Holder: "task-2"})
	if !other.Allowed || other.Rules[0].Used != 2 {
		t.Fatalf("second holder: %+v", other)
	}
	if d, _ := l.Allow(ctx, set, Request{Holder: "task-3"}); d.Allowed || d.RetryAfter != 30*time.Second || d.Rule != "slots" {
		t.Fatalf("third holder: %+v", d)
	}
	// Renewal extends; expiry reclaims; tokens keep growing after the keys
	// are gone.
	l.now = l.now.Add(20 * time.Second)
	if ok, _ := l.Renew(ctx, again.Leases[0]); !ok {
		t.Fatal("renew failed")
	}
	l.now = l.now.Add(15 * time.Second) // task-2 expired, task-1 renewed
	d, _ := l.Allow(ctx, set, Request{Holder: "task-3"})
	if !d.Allowed || d.Rules[0].Used != 2 {
		t.Fatalf("after expiry: %+v", d)
	}
	if ok, _ := l.Release(ctx, other.Leases[0]); ok {
		t.Fatal("expired lease released")
	}
	for _, ls := range append(d.Leases, again.Leases...) {
		if ok, _ := l.Release(ctx, ls); !ok {
			t.Fatalf("release %+v failed", ls)
		}
	}
	last, _ := l.Allow(ctx, set, Request{Holder: "task-1"})
	if last.Leases[0].Token <= d.Leases[0].Token {
		t.Fatalf("token %d after %d: reused", last.Leases[0].Token, d.Leases[0].Token)
	}
}

// TestCriticalReserve: ordinary work leaves the reserved slots free for
// critical work (a fleet-usage load shedder).
func TestCriticalReserve(t *testing.T) {
	l := newClocked(t, redistest.Client(t), redistest.Prefix(t), time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	set := mustSet(Rule{Name: "fleet", Limit: Concurrency{Max: 4, Lease: time.Minute, Reserved: 1}})
	for i, want := range []bool{true, true, true, false} {
		d, _ := l.Allow(ctx, set, Request{Holder: "bulk" + string(rune('0'+i))})
		if d.Allowed != want {
			t.Fatalf("ordinary request %d: %+v", i, d)
		}
	}
	if d, _ := l.Allow(ctx, set, Request{Holder: "pay", Critical: true}); !d.Allowed || d.Rules[0].Remaining != 0 {
		t.Fatalf("critical request: %+v", d)
	}
	if d, _ := l.Allow(ctx, set, Request{Holder: "pay2", Critical: true}); d.Allowed {
		t.Fatalf("critical request beyond max: %+v", d)
	}
}

// TestCalendarOnServerClock: a daily quota's window comes from the Redis
// server's clock even when the worker's clock is days off: the script
// rejects the ticks computed around the wrong time and the limiter retries
// once with ticks around the server's time, then remembers the skew.
func TestCalendarOnServerClock(t *testing.T) {
	c := redistest.Client(t)
	h := &redistest.Counter{}
	c.AddHook(h)
	l, _ := New(Config{Client: c, Prefix: redistest.Prefix(t)})
	ctx := context.Background()
	set := mustSet(Rule{Name: "daily", Limit: CalendarWindow{Limit: 3, Cron: "0 0 * * *", TZ: "America/Los_Angeles"}})
	if err := setProgram.Load(ctx, c); err != nil {
		t.Fatal(err)
	}
	// Worker clock 10 days behind. The ticks sent reach at most about three
	// days past the worker's time (a margin, two days more, and the window
	// holding the end), so they miss the server's time at any hour. With 3
	// days they covered it in the last 10 minutes before midnight in LA.
	l.skew.Learn(time.Now().Add(-10*24*time.Hour), time.Now())
	h.Take()
	d, err := l.Allow(ctx, set, Request{})
	if err != nil || !d.Allowed {
		t.Fatalf("%+v %v", d, err)
	}
	if cmds, _ := h.Take(); cmds != 2 {
		t.Fatalf("%d round trips with a skewed clock, want 2", cmds)
	}
	server := c.Time(ctx).Val()
	h.Take()
	start, end := calendar.MustParse("0 0 * * *", "America/Los_Angeles").Window(server)
	if got := d.Now.Add(d.Rules[0].ResetAfter); !got.Equal(end) || d.Now.Before(start) {
		t.Fatalf("window ends %v, want %v (server time %v)", got, end, server)
	}
	d, _ = l.Allow(ctx, set, Request{})
	if cmds, _ := h.Take(); cmds != 1 || !d.Allowed {
		t.Fatalf("%d round trips once the skew is known, want 1 (%+v)", cmds, d)
	}
	l.Allow(ctx, set, Request{})
	if d, _ := l.Allow(ctx, set, Request{}); d.Allowed || d.Rule != "daily" || d.RetryAfter != d.Rules[0].ResetAfter {
		t.Fatalf("4th request: %+v", d)
	}
}

// TestRefundFutureBooking: refunding a booking that later bookings were
// stacked on gives back at most its own emission, never more, so the next
// booking never lands on a slot already taken.
func TestRefundFutureBooking(t *testing.T) {
	l := newClocked(t, redistest.Client(t), redistest.Prefix(t), time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	set := mustSet(Rule{Name: "rate", Limit: GCRA(gcra.Limit{Rate: 2, Period: time.Second, Burst: 1})}) // T = 500ms
	book := func() Decision {
		d, err := l.Reserve(ctx, set, Request{}, time.Minute)
		if err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
		return d
	}
	book()      // slot 0
	d := book() // slot 500ms: will be refunded
	book()      // slot 1s, stacked on it
	if err := l.Refund(ctx, set, Request{}, d); err != nil {
		t.Fatal(err)
	}
	// The booking at 1s stays where it is, so the refunded slot cannot be
	// reused without two tasks sharing 1s: nothing comes back.
	if next := book(); next.Delay < 1500*time.Millisecond {
		t.Fatalf("booked at %v after the refund: over-credited", next.Delay)
	}
}

// TestReserveNotAcrossLongWindowReset: half an hour before a daily quota
// resets, a request the quota cannot take today is not booked at the reset
// (which would park the GCRA rule there) but told to come back then; so a
// refund later today frees a slot that the next request gets today.
func TestReserveNotAcrossLongWindowReset(t *testing.T) {
	la, _ := time.LoadLocation("America/Los_Angeles")
	l := newClocked(t, redistest.Client(t), redistest.Prefix(t), time.Date(2026, 11, 21, 23, 30, 0, 0, la))
	s := mustSet(
		Rule{Name: "peak", Limit: GCRA(gcra.Limit{Rate: 10, Period: time.Second, Burst: 1})},
		Rule{Name: "daily", Limit: CalendarWindow{Limit: 3, Cron: "0 0 * * *", TZ: "America/Los_Angeles"}},
	)
	ctx := context.Background()
	var today []Decision
	for range 3 {
		d, err := l.Reserve(ctx, s, Request{}, time.Hour)
		if err != nil || !d.Allowed || d.Delay > time.Second {
			t.Fatalf("booking today: %+v %v", d, err)
		}
		today = append(today, d)
	}
	d, err := l.Reserve(ctx, s, Request{}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Rule != "daily" || d.RetryAfter != 30*time.Minute {
		t.Fatalf("quota spent for today: %+v, want not booked, daily, come back in 30m", d)
	}
	if err := l.Refund(ctx, s, Request{}, today[2]); err != nil {
		t.Fatal(err)
	}
	d, err = l.Reserve(ctx, s, Request{}, time.Hour)
	if err != nil || !d.Allowed || d.Delay > time.Second {
		t.Fatalf("after a refund today: %+v %v, want booked today", d, err)
	}
	// A window no longer than the horizon is booked across its reset.
	l.now = l.now.Add(time.Hour)
	s = mustSet(
		Rule{Name: "peak", Limit: GCRA(gcra.Limit{Rate: 10, Period: time.Second, Burst: 1})},
		Rule{Name: "minute", Limit: FixedWindow{Limit: 1, Every: time.Minute}},
	)
	if d, err = l.Reserve(ctx, s, Request{}, time.Hour); err != nil || !d.Allowed {
		t.Fatalf("first in the minute: %+v %v", d, err)
	}
	if d, err = l.Reserve(ctx, s, Request{}, time.Hour); err != nil || !d.Allowed || d.Delay <= 0 || d.Delay > time.Minute {
		t.Fatalf("second: %+v %v, want booked in the next minute", d, err)
	}
}

// TestConcurrencyKeysOutliveLeases: on the server's clock, after every
// acquire, renew and release both keys of a concurrency rule live at least
// until the latest lease ends and at most a quarter lease longer, although
// most acquires set no TTL; with no lease left the tokens hash lives a
// second.
func TestConcurrencyKeysOutliveLeases(t *testing.T) {
	c := redistest.Client(t)
	l, err := New(Config{Client: c, Prefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const lease = 2 * time.Second
	set := mustSet(Rule{Name: "slots", Limit: Concurrency{Max: 100, Lease: lease}})
	check := func(what string, ls Lease) {
		t.Helper()
		// The TTLs are read before the time, so a correct TTL is never
		// below the remaining lease however long the reads take.
		zttl, httl := c.PTTL(ctx, ls.zkey).Val(), c.PTTL(ctx, ls.hkey).Val()
		last := c.ZRangeWithScores(ctx, ls.zkey, -1, -1).Val()
		now := c.Time(ctx).Val()
		if len(last) == 0 {
			if zttl != -2*time.Nanosecond && zttl != -2*time.Millisecond {
				t.Fatalf("%s: holders set without holders, PTTL %v", what, zttl)
			}
			if httl <= 0 || httl > time.Second {
				t.Fatalf("%s: tokens hash PTTL %v with no lease, want (0, 1s]", what, httl)
			}
			return
		}
		// PTTL counts whole milliseconds of Redis's millisecond clock: allow
		// 2ms below the lease's exact end.
		left := time.UnixMicro(int64(last[0].Score)).Sub(now) - 2*time.Millisecond
		for _, ttl := range []time.Duration{zttl, httl} {
			if ttl < left || ttl > lease+lease/4 {
				t.Fatalf("%s: PTTL %v, latest lease ends in %v, want between that and %v", what, ttl, left, lease+lease/4)
			}
		}
	}
	// An acquire sets TTLs only when it moves the keys' end ("~exp"), by a
	// quarter lease past its own lease: at most once per quarter lease
	// after the first.
	var leases []Lease
	extended, exp, start := 0, "", c.Time(ctx).Val()
	for i := range 12 {
		d, err := l.Allow(ctx, set, Request{Holder: fmt.Sprintf("task-%d", i%5)})
		if err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
		leases = append(leases, d.Leases[0])
		check(fmt.Sprintf("acquire %d", i), d.Leases[0])
		if e := c.HGet(ctx, d.Leases[0].hkey, "~exp").Val(); e != exp {
			extended, exp = extended+1, e
		}
		time.Sleep(time.Duration(i%4) * 100 * time.Millisecond)
	}
	elapsed := c.Time(ctx).Val().Sub(start)
	if most := 1 + int(elapsed/(lease/4)); extended > most {
		t.Fatalf("12 acquires in %v set TTLs %d times, want at most %d", elapsed, extended, most)
	}
	if ok, err := l.Renew(ctx, leases[len(leases)-1]); !ok || err != nil {
		t.Fatalf("renew: %v %v", ok, err)
	}
	check("renew", leases[len(leases)-1])
	for _, ls := range leases[len(leases)-5:] {
		if ok, err := l.Release(ctx, ls); !ok || err != nil {
			t.Fatalf("release %+v: %v %v", ls, ok, err)
		}
		check("release "+ls.Holder, ls)
	}
	t.Logf("12 acquires in %v set TTLs %d times", elapsed, extended)
}

// TestConcurrencyKeysOnExplicitClock: on an explicit clock the keys' TTLs
// run in real time while the clock may stand still, so every acquire
// renews them to at least an hour, even when its lease ends before the
// keys' recorded end.
func TestConcurrencyKeysOnExplicitClock(t *testing.T) {
	c := redistest.Client(t)
	l := newClocked(t, c, redistest.Prefix(t), time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	set := mustSet(Rule{Name: "slots", Limit: Concurrency{Max: 10, Lease: time.Minute}})
	d, err := l.Allow(ctx, set, Request{Holder: "a"})
	if err != nil || !d.Allowed {
		t.Fatalf("%+v %v", d, err)
	}
	ls := d.Leases[0]
	// An hour of real time has nearly passed.
	for _, k := range []string{ls.zkey, ls.hkey} {
		c.PExpire(ctx, k, time.Second)
	}
	if d, err := l.Allow(ctx, set, Request{Holder: "b"}); err != nil || !d.Allowed {
		t.Fatalf("%+v %v", d, err)
	}
	for _, k := range []string{ls.zkey, ls.hkey} {
		if ttl := c.PTTL(ctx, k).Val(); ttl < 59*time.Minute {
			t.Fatalf("%s: PTTL %v after an acquire on an explicit clock, want about an hour", k, ttl)
		}
	}
}

// TestHoldersNamedLikeBookkeeping: holders named like the tokens hash's
// bookkeeping fields ("~seq", "~exp", "~blk") take their own slots, get increasing
// tokens and can release them, like any holder.
func TestHoldersNamedLikeBookkeeping(t *testing.T) {
	c := redistest.Client(t)
	l := newClocked(t, c, redistest.Prefix(t), time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	set := mustSet(Rule{Name: "slots", Limit: Concurrency{Max: 10, Lease: time.Minute}})
	var leases []Lease
	for i, h := range []string{"~seq", "~exp", "~blk", "~~seq", "seq", "~"} {
		d, err := l.Allow(ctx, set, Request{Holder: h})
		if err != nil || !d.Allowed {
			t.Fatalf("%q: %+v %v", h, d, err)
		}
		if d.Rules[0].Used != i+1 {
			t.Fatalf("%q: %d slots used, want %d", h, d.Rules[0].Used, i+1)
		}
		if i > 0 && d.Leases[0].Token <= leases[i-1].Token {
			t.Fatalf("%q: token %d after %d", h, d.Leases[0].Token, leases[i-1].Token)
		}
		leases = append(leases, d.Leases[0])
	}
	for _, ls := range leases {
		if ok, err := l.Renew(ctx, ls); !ok || err != nil {
			t.Fatalf("renew %q: %v %v", ls.Holder, ok, err)
		}
		if ok, err := l.Release(ctx, ls); !ok || err != nil {
			t.Fatalf("release %q: %v %v", ls.Holder, ok, err)
		}
	}
	d, err := l.Allow(ctx, set, Request{Holder: "after"})
	if err != nil || !d.Allowed || d.Rules[0].Used != 1 || d.Leases[0].Token <= leases[len(leases)-1].Token {
		t.Fatalf("after: %+v %v, want the only slot, with a later token", d, err)
	}
}

// TestBlockInRuleHashes: a fixed window and a concurrency rule keep a
// Block's end in their own hash ("~blk"): on the server's clock both hashes
// live at least until the block ends, also after the last lease is
// released (which alone would leave the tokens hash a second), and every
// decision meanwhile is denied until then.
func TestBlockInRuleHashes(t *testing.T) {
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	l, err := New(Config{Client: c, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	set := mustSet(
		Rule{Name: "window", Limit: FixedWindow{Limit: 100, Every: time.Second}},
		Rule{Name: "slots", Limit: Concurrency{Max: 10, Lease: time.Minute}},
	)
	d, err := l.Allow(ctx, set, Request{Holder: "a"})
	if err != nil || !d.Allowed {
		t.Fatalf("%+v %v", d, err)
	}
	const block = 5 * time.Second
	if _, err := l.Block(ctx, set, Request{Holder: "a"}, c.Time(ctx).Val().Add(block)); err != nil {
		t.Fatal(err)
	}
	if ok, err := l.Release(ctx, d.Leases[0]); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	ks := c.Keys(ctx, prefix+"*").Val()
	if len(ks) != 2 {
		t.Fatalf("keys %v, want the window's hash and the tokens hash", ks)
	}
	for _, k := range ks {
		if ttl := c.PTTL(ctx, k).Val(); ttl < block-time.Second || ttl > block {
			t.Fatalf("%s: PTTL %v, want about %v", k, ttl, block)
		}
		if c.HGet(ctx, k, "~blk").Val() == "" {
			t.Fatalf("%s: no ~blk field", k)
		}
	}
	d, err = l.Allow(ctx, set, Request{Holder: "b"})
	if err != nil || d.Allowed || d.RetryAfter < block-time.Second {
		t.Fatalf("during the block: %+v %v, want denied for about %v", d, err, block)
	}
}
