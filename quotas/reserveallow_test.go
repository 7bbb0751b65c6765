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
