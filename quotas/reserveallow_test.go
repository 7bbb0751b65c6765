package quotas

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// TestReserveAndAllow: on the server's clock, a request whose rates admit
// now gets its slot in the same call (and a later one is denied the only
// slot, its rates charged all the same), and one whose rates book a later
// moment gets no slot: nothing is taken from the slots.
func TestReserveAndAllow(t *testing.T) {
	c := redistest.Client(t)
	l, err := New(Config{Client: c, Prefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rates := mustSet(
		Rule{Name: "peak", Limit: GCRA(gcra.Limit{Rate: 1, Period: time.Second, Burst: 2})},
		Rule{Name: "window", Limit: FixedWindow{Limit: 100, Every: time.Hour}},
	)
	slots := mustSet(Rule{Name: "slots", Limit: Concurrency{Max: 1, Lease: time.Minute}})
	rd, sd, ok, err := l.ReserveAndAllow(ctx, rates, Request{}, time.Minute, slots, Request{Holder: "a"})
	if err != nil || !ok || !rd.Allowed || rd.Delay != 0 || !sd.Allowed || len(sd.Leases) != 1 || !sd.Now.Equal(rd.Now) {
		t.Fatalf("first: %+v %+v %v %v, want both admitted at one moment", rd, sd, ok, err)
	}
	rd, sd, ok, err = l.ReserveAndAllow(ctx, rates, Request{}, time.Minute, slots, Request{Holder: "b"})
	if err != nil || !ok || !rd.Allowed || rd.Delay != 0 || sd.Allowed || sd.Rule != "slots" {
		t.Fatalf("second: %+v %+v %v %v, want the rates admitted, the slot denied", rd, sd, ok, err)
	}
	rd, _, ok, err = l.ReserveAndAllow(ctx, rates, Request{}, time.Minute, slots, Request{Holder: "c"})
	if err != nil || ok || !rd.Allowed || rd.Delay <= 0 {
		t.Fatalf("third: %+v %v %v, want booked later and the slots not decided", rd, ok, err)
	}
	st, err := l.Status(ctx, slots, Request{})
	if err != nil || st.Rules[0].Used != 1 {
		t.Fatalf("slots: %+v %v, want the first holder's only", st, err)
	}
}

// TestReserveAndAllowMatchesModel: on an explicit clock, ReserveAndAllow
// decides as the model's Reserve followed by Allow at the same moment.
func TestReserveAndAllowMatchesModel(t *testing.T) {
	c := redistest.Client(t)
	l := newClocked(t, c, redistest.Prefix(t), time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC))
	m := NewModel()
	ctx := context.Background()
	rates := mustSet(
		Rule{Name: "peak", Limit: GCRA(gcra.Limit{Rate: 20, Period: time.Second, Burst: 3})},
		Rule{Name: "window", Limit: FixedWindow{Limit: 30, Every: 2 * time.Second}},
		Rule{Name: "daily", Limit: CalendarWindow{Limit: 1000, Cron: "0 0 * * *"}},
	)
	slots := mustSet(Rule{Name: "slots", Limit: Concurrency{Max: 2, Lease: time.Second}})
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		l.now = l.now.Add(time.Duration(rng.IntN(60)) * time.Millisecond)
		holder := fmt.Sprint("h", rng.IntN(4))
		rd, sd, ok, err := l.ReserveAndAllow(ctx, rates, Request{}, 500*time.Millisecond, slots, Request{Holder: holder})
		if err != nil {
			t.Fatal(err)
		}
		wr, err := m.ReserveAt(l.now, rates, Request{}, 500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		same := func(what string, got, want Decision) {
			t.Helper()
			if got.Allowed != want.Allowed || got.Delay != want.Delay || got.RetryAfter != want.RetryAfter || got.Rule != want.Rule || len(got.Rules) != len(want.Rules) {
				t.Fatalf("step %d %s: redis %+v, model %+v", i, what, got, want)
			}
			for j := range got.Rules {
				if g, w := got.Rules[j], want.Rules[j]; g.Used != w.Used || g.Remaining != w.Remaining || g.ResetAfter != w.ResetAfter {
					t.Fatalf("step %d %s rule %d: redis %+v, model %+v", i, what, j, g, w)
				}
			}
		}
		same("rates", rd, wr)
		if want := wr.Allowed && wr.Delay == 0; ok != want {
			t.Fatalf("step %d: slots decided %v, want %v (%+v)", i, ok, want, wr)
		}
		if !ok {
			continue
		}
		ws, err := m.AllowAt(l.now, slots, Request{Holder: holder})
		if err != nil {
			t.Fatal(err)
		}
		same("slots", sd, ws)
		if sd.Allowed && rng.IntN(2) == 0 {
			if _, err := l.Release(ctx, sd.Leases[0]); err != nil {
				t.Fatal(err)
			}
			if _, err := m.ReleaseAt(l.now, ws.Leases[0]); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestReserveAndAllowPrefetch: when the rates prefetch, a request admitted
// from units in hand takes its slots in one call, the only call it makes;
// its slots are decided as without prefetch; a window near its limit
// (the pool paused) is decided with the slots in one call again, and
// nothing is ever counted twice or lost.
func TestReserveAndAllowPrefetch(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	ls, counter := limitersOn(t, 1, &now)
	l := ls[0]
	ctx := context.Background()
	const limit = 640
	rates := mustSet(Rule{Name: "w", Limit: FixedWindow{Limit: limit, Every: time.Hour}, Prefetch: 10 * time.Millisecond})
	slots := mustSet(Rule{Name: "slots", Limit: Concurrency{Max: 2, Lease: time.Minute}})
	if _, err := l.Status(ctx, rates, Request{}); err != nil { // loads the scripts
		t.Fatal(err)
	}
	var held []Lease
	handed, fromPool, denied := 0, 0, 0
	for i := range limit + 10 {
		now = now.Add(10 * time.Microsecond)
		if i%4 == 0 {
			// Between, the slots are full: a request in four frees them.
			for _, ls := range held {
				if ok, err := l.Release(ctx, ls); err != nil || !ok {
					t.Fatalf("release: %v %v", ok, err)
				}
			}
			held = nil
		}
		before := counter.n.Load()
		rd, sd, ok, err := l.ReserveAndAllow(ctx, rates, Request{}, 0, slots, Request{Holder: fmt.Sprint("h", i)})
		if err != nil {
			t.Fatal(err)
		}
		calls := counter.n.Load() - before
		if !rd.Allowed {
			if i < limit {
				t.Fatalf("request %d denied by the window: %+v", i, rd)
			}
			continue
		}
		handed++
		if !ok {
			t.Fatalf("request %d: admitted now but its slots were not decided", i)
		}
		if rd.pf != nil && calls == 1 {
			fromPool++
		}
		if calls > 2 {
			t.Fatalf("request %d took %d calls", i, calls)
		}
		if !sd.Allowed {
			denied++
			if len(held) != 2 || sd.Rule != "slots" {
				t.Fatalf("request %d: slots denied with %d held: %+v", i, len(held), sd)
			}
			continue
		}
		held = append(held, sd.Leases...)
	}
	if handed != limit {
		t.Errorf("the window admitted %d, want its limit %d", handed, limit)
	}
	if fromPool < limit/2 {
		t.Errorf("%d of %d requests were admitted from units in hand with one call for the slots; want at least half", fromPool, limit)
	}
	if denied == 0 {
		t.Error("no request found the slots held: the test does not test their decision")
	}
	if err := l.GiveBack(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := l.Status(ctx, rates, Request{})
	if err != nil || st.Rules[0].Used != limit {
		t.Fatalf("the window counts %+v %v, want %d", st.Rules, err, limit)
	}
	t.Logf("%d admitted, %d from units in hand with one call, %d found the slots held", handed, fromPool, denied)
}

// TestReserveAndAllowKept: slots that keep (Rule.Prefetch) are taken with
// the rates in one call, and, released, kept: the next request decides
// its rates in one call and takes the kept slot without another.
func TestReserveAndAllowKept(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	ls, counter := limitersOn(t, 1, &now)
	l := ls[0]
	ctx := context.Background()
	rates := mustSet(Rule{Name: "peak", Limit: GCRA(gcra.Limit{Rate: 1000, Period: time.Second, Burst: 100})})
	slots := keptSet(64)
	if _, err := l.Status(ctx, rates, Request{}); err != nil { // loads the scripts
		t.Fatal(err)
	}
	var token int64
	for i := range 3 {
		now = now.Add(time.Millisecond)
		before := counter.n.Load()
		rd, sd, ok, err := l.ReserveAndAllow(ctx, rates, Request{}, 0, slots, Request{Holder: fmt.Sprint("h", i)})
		if err != nil || !ok || !rd.Allowed || !sd.Allowed || len(sd.Leases) != 1 {
			t.Fatalf("request %d: %+v %+v %v %v", i, rd, sd, ok, err)
		}
		if n := counter.n.Load() - before; n != 1 {
			t.Errorf("request %d made %d calls, want 1", i, n)
		}
		if i > 0 && sd.Leases[0].Token != token {
			t.Errorf("request %d was not handed the kept slot", i)
		}
		token = sd.Leases[0].Token
		if ok, err := l.Release(ctx, sd.Leases[0]); err != nil || !ok {
			t.Fatalf("release: %v %v", ok, err)
		}
	}
	if got := used(t, l, slots, Request{}); got != 1 {
		t.Errorf("Redis counts %d slots, want the one kept", got)
	}
}
