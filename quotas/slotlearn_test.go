package quotas

import (
	"testing"
	"time"
)

// TestSlotLearnBounds: a learned number of slots is read and changed
// within the rule's bounds of the moment: learned up to 8 under max 8,
// the same key under max 3 allows 3, and one overload takes it to 2 (0.7
// of 3), not to 0.7 of the 8 stored.
func TestSlotLearnBounds(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := NewModelOn(func() time.Time { return now })
	wide := mustSet(Rule{Name: "ac", Limit: Concurrency{Adaptive: true, Min: 1, Max: 8, Lease: time.Minute}})
	narrow := mustSet(Rule{Name: "ac", Limit: Concurrency{Adaptive: true, Min: 1, Max: 3, Lease: time.Minute}})
	slots := func(s *Set) int {
		d, err := m.StatusAt(now, s, Request{Holder: "-"})
		if err != nil {
			t.Fatal(err)
		}
		return d.Rules[0].Slots
	}
	// Slow start: every fast call with all the slots in use adds one.
	for slots(wide) < 8 {
		var held []Lease
		for i := range slots(wide) {
			d, err := m.AllowAt(now, wide, Request{Holder: string(rune('a' + i))})
			if err != nil || !d.Allowed {
				t.Fatalf("%+v %v", d, err)
			}
			held = append(held, d.Leases...)
		}
		now = now.Add(50 * time.Millisecond)
		for _, ls := range held {
			if ok, err := m.ReleaseAt(now, ls.Outcome(50*time.Millisecond, false)); !ok || err != nil {
				t.Fatal(ok, err)
			}
		}
	}
	if got := slots(narrow); got != 3 {
		t.Fatalf("under max 3: %d slots", got)
	}
	d, _ := m.AllowAt(now, narrow, Request{Holder: "x"})
	now = now.Add(time.Second)
	m.ReleaseAt(now, d.Leases[0].Outcome(time.Second, true))
	if got := slots(narrow); got != 2 {
		t.Errorf("after an overload under max 3: %d slots, want 2", got)
	}
}
