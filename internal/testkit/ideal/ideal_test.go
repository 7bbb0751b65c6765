package ideal

import (
	"testing"
	"time"
)

var epoch = time.Date(2026, 5, 4, 9, 0, 0, 0, time.UTC) // on a whole second

func calls(at time.Time, keys ...string) []Call {
	out := make([]Call, len(keys))
	for i, k := range keys {
		out[i] = Call{At: at, Key: k}
	}
	return out
}

func offsets(ts []time.Time) []time.Duration {
	out := make([]time.Duration, len(ts))
	for i, t := range ts {
		out[i] = t.Sub(epoch)
	}
	return out
}

func same(t *testing.T, got []time.Time, want ...time.Duration) {
	t.Helper()
	g := offsets(got)
	if len(g) != len(want) {
		t.Fatalf("got %v, want %v", g, want)
	}
	for i := range g {
		if g[i] != want[i] {
			t.Fatalf("got %v, want %v", g, want)
		}
	}
}

func TestGCRA(t *testing.T) {
	// 2/s burst 3: three at once, then one every 500ms.
	got := Schedule([]Rule{{GCRA: Limit{Rate: 2, Period: time.Second, Burst: 3}}}, calls(epoch, "", "", "", "", "", ""))
	ms := time.Millisecond
	same(t, got, 0, 0, 0, 500*ms, 1000*ms, 1500*ms)
}

func TestWindow(t *testing.T) {
	// 5 per second, windows on whole seconds, starting 200ms into one.
	got := Schedule([]Rule{{Limit: 5, Every: time.Second}}, calls(epoch.Add(200*time.Millisecond), "", "", "", "", "", "", "", "", "", "", "", ""))
	s, ms := time.Second, 200*time.Millisecond
	same(t, got, ms, ms, ms, ms, ms, s, s, s, s, s, 2*s, 2*s)
}

func TestKeyed(t *testing.T) {
	// 1/s per key beside 10/s burst 2 for all: keys run side by side.
	rules := []Rule{{GCRA: Limit{Rate: 10, Period: time.Second, Burst: 2}}, {GCRA: Limit{Rate: 1, Period: time.Second, Burst: 1}, Keyed: true}}
	got := Schedule(rules, calls(epoch, "a", "a", "a", "b", "b", "b"))
	s := time.Second
	same(t, got, 0, s, 2*s, 0, s, 2*s)
}

func TestMostCallsLeftFirst(t *testing.T) {
	// One call at a time (1/s burst 1): when a key with one call and a key
	// with three can both go, the key with three goes first, so that it is
	// not left to finish alone at its own rate (2/s) at the end.
	rules := []Rule{{GCRA: Limit{Rate: 4, Period: time.Second, Burst: 1}}, {GCRA: Limit{Rate: 2, Period: time.Second, Burst: 1}, Keyed: true}}
	got := Schedule(rules, calls(epoch, "a", "b", "b", "b"))
	ms := time.Millisecond
	same(t, got, 250*ms, 0, 500*ms, 1000*ms)
	if last := Last(got).Sub(epoch); last != time.Second {
		t.Fatalf("last at %v, want 1s", last)
	}
}
