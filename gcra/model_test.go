package gcra

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)

func at(us int64) time.Time { return t0.Add(time.Duration(us) * time.Microsecond) }

func mustAllow(t *testing.T, m *Model, us int64, l Limit, n int) Result {
	t.Helper()
	r, err := m.AllowN(at(us), "k", l, n)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestModelSemantics walks through the GCRA semantics of the package doc
// by hand.
func TestModelSemantics(t *testing.T) {
	var m Model
	l := Limit{Rate: 10, Period: time.Second, Burst: 3} // T = 100 ms
	// From idle, Burst requests at once.
	for i := 0; i < 3; i++ {
		r := mustAllow(t, &m, 0, l, 1)
		if !r.Allowed || r.Remaining != 2-i || r.ResetAfter != time.Duration(i+1)*100*time.Millisecond {
			t.Fatalf("request %d: %+v", i, r)
		}
	}
	// Then denied, with the exact wait.
	r := mustAllow(t, &m, 0, l, 1)
	if r.Allowed || r.RetryAfter != 100*time.Millisecond || r.Remaining != 0 || r.ResetAfter != 300*time.Millisecond {
		t.Fatalf("4th request: %+v", r)
	}
	// One microsecond early is still denied, on time is allowed.
	if r := mustAllow(t, &m, 99_999, l, 1); r.Allowed || r.RetryAfter != time.Microsecond {
		t.Fatalf("early: %+v", r)
	}
	if r := mustAllow(t, &m, 100_000, l, 1); !r.Allowed || r.Remaining != 0 {
		t.Fatalf("on time: %+v", r)
	}
	// A cost of 2 waits for two emissions.
	if r := mustAllow(t, &m, 100_000, l, 2); r.Allowed || r.RetryAfter != 200*time.Millisecond {
		t.Fatalf("cost 2: %+v", r)
	}
	// Cost above burst: never, and says so; nothing charged.
	if r := mustAllow(t, &m, 10_000_000, l, 4); r.Allowed || r.RetryAfter != Never || r.Remaining != 3 {
		t.Fatalf("cost 4: %+v", r)
	}
	// Cost 0 peeks without charging.
	for i := 0; i < 5; i++ {
		if r := mustAllow(t, &m, 10_000_000, l, 0); !r.Allowed || r.Remaining != 3 || r.ResetAfter != 0 {
			t.Fatalf("peek: %+v", r)
		}
	}
	// Negative cost is an error, not a denial.
	if _, err := m.AllowN(at(0), "k", l, -1); !errors.Is(err, ErrInvalidCost) {
		t.Fatalf("cost -1: err = %v", err)
	}
	if _, err := m.AllowN(at(0), "k", Limit{}, 1); err == nil {
		t.Fatal("zero Limit accepted")
	}
}

func TestModelReserveRefund(t *testing.T) {
	var m Model
	l := Limit{Rate: 10, Period: time.Second, Burst: 2} // T = 100 ms
	res := func(us int64, n int, horizon time.Duration) Result {
		r, err := m.Reserve(at(us), "k", l, n, horizon)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Burst is booked immediately, then one slot per T.
	for i, want := range []time.Duration{0, 0, 100 * time.Millisecond, 200 * time.Millisecond} {
		if r := res(0, 1, time.Second); !r.Allowed || r.Delay != want {
			t.Fatalf("reservation %d: %+v, want delay %v", i, r, want)
		}
	}
	// Beyond the horizon: not booked, nothing charged, RetryAfter is the wait.
	if r := res(0, 1, 250*time.Millisecond); r.Allowed || r.RetryAfter != 300*time.Millisecond {
		t.Fatalf("beyond horizon: %+v", r)
	}
	// A peek sees that reservations run past the burst.
	if r := mustAllow(t, &m, 0, l, 0); r.Allowed || r.RetryAfter != 200*time.Millisecond {
		t.Fatalf("peek after reservations: %+v", r)
	}
	// Cancelling two reservations frees their slots.
	if r, _ := m.Refund(at(0), "k", l, 2); !r.Allowed || r.ResetAfter != 200*time.Millisecond {
		t.Fatalf("refund: %+v", r)
	}
	if r := res(0, 1, time.Second); !r.Allowed || r.Delay != 100*time.Millisecond {
		t.Fatalf("after refund: %+v", r)
	}
	// Refunding more than was charged leaves the key full, not in credit.
	m.Refund(at(0), "k", l, 100)
	if r := mustAllow(t, &m, 0, l, 0); r.Remaining != 2 {
		t.Fatalf("after over-refund: %+v", r)
	}
	for i := 0; i < 2; i++ {
		mustAllow(t, &m, 0, l, 1)
	}
	if r := mustAllow(t, &m, 0, l, 1); r.Allowed {
		t.Fatalf("over-refund gave credit: %+v", r)
	}
	m.Reset("k")
	if r := mustAllow(t, &m, 0, l, 2); !r.Allowed {
		t.Fatalf("after reset: %+v", r)
	}
}

// TestModelProperties checks, over random traffic, the two promises GCRA
// makes: no window [a, b] ever admits more than Burst + (b−a)/T units, and
// RetryAfter is exact (allowed after it, denied one microsecond before).
func TestModelProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 200; iter++ {
		l := Limit{Rate: float64(1 + rng.IntN(50)), Period: time.Duration(1+rng.IntN(5000)) * time.Millisecond, Burst: 1 + rng.IntN(10)}
		em := l.Interval().Microseconds()
		var m Model
		type grant struct{ at, n int64 }
		var grants []grant
		now := int64(0)
		for i := 0; i < 300; i++ {
			now += rng.Int64N(em * 2)
			n := rng.IntN(l.Burst + 1)
			r := mustAllow(t, &m, now, l, n)
			if r.Allowed && n > 0 {
				grants = append(grants, grant{now, int64(n)})
			}
			if !r.Allowed {
				var probe Model
				probe.tats = map[string]int64{"k": m.tats["k"]}
				wait := r.RetryAfter.Microseconds()
				if p := mustAllow(t, &probe, now+wait-1, l, n); p.Allowed && wait > 0 {
					t.Fatalf("%v: allowed 1µs before RetryAfter %v", l, r.RetryAfter)
				}
				if p := mustAllow(t, &probe, now+wait, l, n); !p.Allowed {
					t.Fatalf("%v: denied after RetryAfter %v: %+v", l, r.RetryAfter, p)
				}
			}
		}
		for i := range grants {
			var sum int64
			for j := i; j < len(grants); j++ {
				sum += grants[j].n
				if bound := int64(l.Burst) + (grants[j].at-grants[i].at)/em; sum > bound {
					t.Fatalf("%v: %d units in [%d, %d]µs, bound %d", l, sum, grants[i].at, grants[j].at, bound)
				}
			}
		}
	}
}
