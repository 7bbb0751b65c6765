package quotas

import (
	"context"
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// prioritySet is a fair 10/s shared rate (burst 1) whose requests are
// ordered by priority, aging agingFor per level.
const agingFor = 2 * time.Second

var prioritySet = mustSet(Rule{Name: "vendor", Fair: true, Aging: agingFor, Limit: GCRA(gcra.Limit{Rate: 10, Period: time.Second, Burst: 1})})

func atLevel(flow string, p int) Request {
	return Request{Fair: []string{flow}, Priorities: []int{p}}
}

// TestPriorityJumpsBacklog books a backlog of 600 priority-5 requests of
// one flow (a minute at 10/s), then asks for a priority-1 request of the
// same flow: it takes over the first booking far enough ahead not to have
// started (250 ms), and the owner of that booking learns it (Held false).
// Another priority-5 request of the flow, before or after it, goes behind
// the backlog.
func TestPriorityJumpsBacklog(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	t0 := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	l := newClocked(t, c, redistest.Prefix(t), t0)
	var backlog []Decision
	for range 600 {
		d, err := l.Reserve(ctx, prioritySet, atLevel("b7", 5), 2*time.Minute)
		if err != nil || !d.Allowed {
			t.Fatalf("backlog: %+v %v", d, err)
		}
		backlog = append(backlog, d)
	}
	if last := backlog[len(backlog)-1].Delay; last < 59*time.Second {
		t.Fatalf("the backlog's last booking is %v ahead, want a minute", last)
	}
	l.now = t0.Add(time.Millisecond)
	if d, err := l.Reserve(ctx, prioritySet, atLevel("b7", 5), 2*time.Minute); err != nil || !d.Allowed || d.Delay < 59*time.Second {
		t.Fatalf("priority 5: booked %v ahead (%v), want behind the backlog", d.Delay, err)
	}
	first, err := l.Reserve(ctx, prioritySet, atLevel("b7", 1), 2*time.Minute)
	if err != nil || !first.Allowed {
		t.Fatalf("priority 1: %+v %v", first, err)
	}
	if first.Delay < 250*time.Millisecond || first.Delay > 400*time.Millisecond {
		t.Fatalf("priority 1 booked %v ahead, want the first booking at least 250ms ahead (300ms)", first.Delay)
	}
	// The lost booking gave its flow's finish back, but a request of that
	// flow and level does not take the flow's next booking: it goes
	// behind the backlog still.
	if d, err := l.Reserve(ctx, prioritySet, atLevel("b7", 5), 2*time.Minute); err != nil || !d.Allowed || d.Delay < 59*time.Second {
		t.Fatalf("priority 5 after the take-over: booked %v ahead (%v), want behind the backlog", d.Delay, err)
	}
	lost := 0
	for _, d := range backlog {
		held, err := l.Held(ctx, prioritySet, atLevel("b7", 5), d)
		if err != nil {
			t.Fatal(err)
		}
		if !held {
			lost++
			if d.Delay != first.Delay+time.Millisecond {
				t.Errorf("the booking %v ahead was taken, want the one at %v", d.Delay, first.Delay+time.Millisecond)
			}
		}
	}
	if lost != 1 {
		t.Errorf("%d bookings of the backlog lost, want 1", lost)
	}
}

// TestPriorityAging keeps a rate of 10/s overloaded with priority-1
// requests of one flow, 20 a second booked as they come (2 s after the
// start their bookings reach a second ahead), and lets one request of
// another flow in then, deciding again whenever its
// booking is taken over (as a task does, at its slot). At priority 5 it is
// tagged 4 agings after a priority-1 request made at the same time: the
// priority-1 requests take its bookings until they are tagged later than
// it, so it must wait more than a second (it would run at once at the same
// priority, fairness giving a new flow its turn) and run within 4·aging
// plus a second of arriving. Time is explicit; the bounds come from the
// aging alone.
func TestPriorityAging(t *testing.T) {
	for _, level := range []int{1, 5} {
		waited, taken := agedWait(t, level)
		t.Logf("priority %d beside an overload of priority 1: ran after %v, its booking taken over %d times", level, waited, taken)
		switch {
		case level == 1 && waited > 500*time.Millisecond:
			t.Errorf("at the same priority, the new flow ran after %v, want its fair turn within 500ms", waited)
		case level == 5 && (waited < time.Second || waited > 4*agingFor+time.Second):
			t.Errorf("at priority 5 it ran after %v, want more than 1s and at most 4 agings (%v) and a second", waited, 4*agingFor)
		}
	}
}

// agedWait runs TestPriorityAging's fleet with the request of level and
// returns how long it waited and how often its booking was taken over.
func agedWait(t *testing.T, level int) (time.Duration, int) {
	ctx := context.Background()
	c := redistest.Client(t)
	t0 := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	l := newClocked(t, c, redistest.Prefix(t), t0)
	reserve := func(req Request) Decision {
		t.Helper()
		d, err := l.Reserve(ctx, prioritySet, req, time.Minute)
		if err != nil || !d.Allowed {
			t.Fatalf("reserve %+v: %+v %v", req, d, err)
		}
		return d
	}
	low := atLevel("newsletter", level)
	var lowD Decision
	var lowAt time.Time
	taken := 0
	for step := 0; step < 1500; step++ {
		l.now = t0.Add(time.Duration(step) * 10 * time.Millisecond)
		if step%5 == 0 {
			reserve(atLevel("reset", 1))
		}
		if step == 200 {
			lowD = reserve(low)
			lowAt = lowD.Now.Add(lowD.Delay)
			continue
		}
		if lowAt.IsZero() {
			continue
		}
		held, err := l.Held(ctx, prioritySet, low, lowD)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case !held:
			taken++
			lowD = reserve(low)
			lowAt = lowD.Now.Add(lowD.Delay)
		case !l.now.Before(lowAt):
			return lowAt.Sub(t0.Add(2 * time.Second)), taken
		}
	}
	t.Fatalf("the priority-%d request never ran in 15 s (taken over %d times)", level, taken)
	return 0, 0
}

// TestPrioritySlots shares 3 slots, with priorities aging 2 s a level,
// between flow a at level 1 and flow b at level 5. A slot that frees goes
// to a, though it holds more slots than b (plain fairness would give it
// to b), until b has waited 4 agings (8 s) since it began to wait: then
// b ranks with level 1, holds fewer slots than a, and takes the next
// slot. That ends its wait: the slots after go to a again, two freed at
// once both to a, the only flow before b; but a task of b that waited 4
// agings before (Request.Waited) ranks with level 1 at once. (A flow's
// level is reckoned when it is refused: flows waiting ask again at least
// every second.)
func TestPrioritySlots(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	t0 := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	l := newClocked(t, c, redistest.Prefix(t), t0)
	set := mustSet(Rule{Name: "smtp", Fair: true, Aging: agingFor, Limit: Concurrency{Max: 3, Lease: time.Minute}})
	leases := map[string]Lease{}
	at := func(ms int) { l.now = t0.Add(time.Duration(ms) * time.Millisecond) }
	ask := func(holder, flow string, p int, want bool, waited ...time.Duration) {
		t.Helper()
		req := Request{Fair: []string{flow}, Priorities: []int{p}, Holder: holder}
		if waited != nil {
			req.Waited = waited[0]
		}
		d, err := l.Allow(ctx, set, req)
		if err != nil || d.Allowed != want {
			t.Fatalf("at %v %s (flow %s, level %d): allowed %v (%v), want %v", l.now.Sub(t0), holder, flow, p, d.Allowed, err, want)
		}
		if d.Allowed {
			leases[holder] = d.Leases[0]
		}
	}
	release := func(holder string) {
		t.Helper()
		if ok, err := l.Release(ctx, leases[holder]); err != nil || !ok {
			t.Fatalf("release %s: %v %v", holder, ok, err)
		}
	}
	at(0)
	ask("a1", "a", 1, true)
	ask("a2", "a", 1, true)
	ask("b1", "b", 5, true)
	at(500)
	ask("b2", "b", 5, false) // b waits from 0.5 s
	ask("a3", "a", 1, false)
	at(1000)
	release("b1")
	ask("b2", "b", 5, false) // a, level 1, is before it
	ask("a3", "a", 1, true)
	for ms := 1500; ms <= 6000; ms += 500 {
		at(ms)
		ask("b2", "b", 5, false)
		ask("a4", "a", 1, false)
	}
	at(6500)
	release("a2")
	ask("b2", "b", 5, false) // waited 6 s: level 2, still after a
	ask("a4", "a", 1, true)
	for ms := 7000; ms <= 8000; ms += 500 {
		at(ms)
		ask("b2", "b", 5, false)
		ask("a5", "a", 1, false)
	}
	at(8500)
	ask("b2", "b", 5, false) // none free; b waited 8 s: level 1 from now
	release("a1")
	ask("a5", "a", 1, false) // b holds none, a two
	ask("b2", "b", 5, true)
	at(9000)
	release("a3")
	ask("b3", "b", 5, false) // b's wait ended with its slot: level 5
	ask("a5", "a", 1, true)
	ask("a6", "a", 1, false)
	at(9500)
	release("a4")
	release("a5")
	ask("b3", "b", 5, false) // two free, but a waits: both are a's
	ask("a6", "a", 1, true)
	ask("a7", "a", 1, true)
	at(10000)
	ask("a8", "a", 1, false)
	release("a6")
	ask("b3", "b", 5, false) // b waits from 9 s: level 5
	// A task that says it waited 8 s before (rescheduled) ranks at level
	// 1 at once, and holds no more slots than a: the slot is its.
	ask("b4", "b", 5, true, 8*time.Second)
}
