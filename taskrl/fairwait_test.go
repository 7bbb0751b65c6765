package taskrl

import (
	"testing"
	"time"
)

// TestFairWaiters: while the rule serves other flows first, at most
// crowdWaiters tasks of a flow wait in the workers; the others are crowded
// out to come back one after another, half the flow's time between two
// starts apart (crowdMin from now at the earliest), or when pulled back;
// without another flow first, any number wait. A flow nothing happened to for crowdKeep is
// forgotten.
func TestFairWaiters(t *testing.T) {
	var w fairWaiters
	f, g := fairFlow{"slots", "big"}, fairFlow{"slots", "small"}
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	for i := range 5 {
		if d := w.join(f, now, false, "q", ""); d != 0 {
			t.Fatalf("join %d not behind: crowded out for %v", i, d)
		}
	}
	for range 4 {
		w.leave(f)
	}
	if d := w.join(f, now, true, "q", ""); d != 0 {
		t.Fatalf("second waiter behind: crowded out for %v", d)
	}
	if d := w.join(f, now, true, "q", ""); d != crowdMin {
		t.Fatalf("third task behind: crowded out for %v, want crowdMin %v", d, crowdMin)
	}
	if d := w.join(g, now, true, "q", ""); d != 0 {
		t.Fatalf("another flow's first task: crowded out for %v", d)
	}
	// Starts 100 ms apart: the tasks crowded out come back 50 ms apart.
	for i := range 20 {
		w.started(f, now.Add(time.Duration(i)*100*time.Millisecond))
	}
	now = now.Add(2 * time.Second)
	first := w.join(f, now, true, "q", "a")
	second := w.join(f, now, true, "q", "b")
	if first != crowdMin || second-first < 45*time.Millisecond || second-first > 55*time.Millisecond {
		t.Errorf("crowded out for %v, then %v: want %v, then about 50 ms more", first, second, crowdMin)
	}
	// A task of f that finds a slot free pulls back those crowded out not
	// back yet, the first due first: the one crowded out at the start
	// came back crowdMin after it.
	if got := w.pull(f, now, 2); len(got) != 2 || got[0].id != "a" || got[1].id != "b" || got[0].queue != "q" {
		t.Errorf("pulled %v: want a, then b", got)
	}
	if got := w.pull(f, now, 2); len(got) != 0 {
		t.Errorf("pulled %v again", got)
	}
	w.leave(f)
	if d := w.join(f, now, true, "q", ""); d != 0 {
		t.Errorf("after a waiter left: crowded out for %v", d)
	}
	w.leave(f)
	w.leave(f)
	w.leave(g)
	w.join(fairFlow{"slots", "other"}, now.Add(2*crowdKeep), false, "q", "")
	if _, ok := w.flows[f]; ok || len(w.flows) != 1 {
		t.Errorf("after %v with nothing waiting: %d flows kept", 2*crowdKeep, len(w.flows))
	}
}
