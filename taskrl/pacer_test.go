package taskrl

import (
	"container/heap"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/asynqstore"
	"github.com/taskrl/taskrl/internal/clock"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// TestPacerWaitsForTheRun: a task this process parked is claimed once due
// and only after asynq is done with the run that parked it (its done
// channel closed); tasks not due, or whose run goes on, are kept, in
// order.
func TestPacerWaitsForTheRun(t *testing.T) {
	running, over := make(chan struct{}), make(chan struct{})
	close(over)
	var s slots
	for _, o := range []own{{at: 30, id: "later", done: over}, {at: 10, id: "running", done: running}, {at: 20, id: "over", done: over}, {at: 5, id: "no-ctx"}} {
		heap.Push(&s, o)
	}
	ids := func(os []own) []string {
		var out []string
		for _, o := range os {
			out = append(out, o.id)
		}
		return out
	}
	mine, waiting := s.due(25)
	if got := ids(mine); !slices.Equal(got, []string{"no-ctx", "over"}) || !waiting {
		t.Fatalf("due(25) = %v, waiting %v; want [no-ctx over], true", got, waiting)
	}
	close(running)
	mine, waiting = s.due(25)
	if got := ids(mine); !slices.Equal(got, []string{"running"}) || waiting {
		t.Fatalf("after the run: due(25) = %v, waiting %v; want [running], false", got, waiting)
	}
	s.keep(mine)
	if mine, _ = s.due(100); !slices.Equal(ids(mine), []string{"running", "later"}) {
		t.Fatalf("kept: due(100) = %v", ids(mine))
	}
}

// TestPacerPromotes: a task booked 1 s ahead, in a queue with another task
// pending, is moved at once (the lead is 1.6 s) to the tail of pending,
// behind it, and is at the head by its slot less paceBusyLead, the
// pacer's second claim; a worker that frees then takes it before the task
// not yet decided. Without the second claim it stays behind.
func TestPacerPromotes(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Redis")
	}
	c := redistest.Client(t)
	q := redistest.Queue(t, c, "promote")
	prefix := redistest.Prefix(t)
	ctx := t.Context()
	client := asynq.NewClientFromRedisClient(c)
	if _, err := client.Enqueue(asynq.NewTask("x", nil), asynq.Queue(q), asynq.TaskID("undecided")); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Enqueue(asynq.NewTask("x", nil), asynq.Queue(q), asynq.TaskID("booked"), asynq.ProcessIn(time.Hour)); err != nil {
		t.Fatal(err)
	}
	server, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	slot := server.Add(time.Second).UnixMicro()
	c.HSet(ctx, asynqstore.TaskPrefix(q)+"booked", "taskrl_park", server.UnixMicro())
	c.ZAdd(ctx, keys.Pace(prefix, q), redis.Z{Score: float64(slot), Member: "booked"})

	var skew clock.Skew
	skew.Learn(server, time.Now())
	p := newPacer(pacerDeps{client: c, logger: slog.New(slog.DiscardHandler), clock: wallClock{}, skew: &skew, prefix: prefix})
	defer p.close()
	p.setLead(1600 * time.Millisecond)
	p.add(q, "booked", slot, nil)

	order := func() []string { return pendingFromHead(t, c, q) }
	local := func(us int64) time.Time {
		return time.Now().Add(time.Duration(us-skew.Server(time.Now()).UnixMicro()) * time.Microsecond)
	}
	for deadline := time.Now().Add(300 * time.Millisecond); len(order()) < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not moved within 300 ms: pending %v", order())
		}
	}
	if got := order(); !slices.Equal(got, []string{"undecided", "booked"}) {
		t.Fatalf("moved a lead ahead: pending from the head %v, want [undecided booked]", got)
	}
	time.Sleep(time.Until(local(slot - paceBusyLead.Microseconds() + (100 * time.Millisecond).Microseconds())))
	if got := order(); !slices.Equal(got, []string{"booked", "undecided"}) {
		t.Fatalf("%v before its slot: pending from the head %v, want [booked undecided]", paceBusyLead-100*time.Millisecond, got)
	}
}

// pendingFromHead lists queue q's pending tasks from the end asynq's
// workers take from.
func pendingFromHead(t *testing.T, c redis.UniversalClient, q string) []string {
	got := c.LRange(t.Context(), asynqstore.Pending(q), 0, -1).Val()
	slices.Reverse(got)
	return got
}

// TestPacerPull: a task this process parked an hour ahead, pulled, moves
// to pending at once; another parked beside it stays scheduled, and an ID
// the pacing set does not hold is not added to it.
func TestPacerPull(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Redis")
	}
	c := redistest.Client(t)
	q := redistest.Queue(t, c, "pull")
	prefix := redistest.Prefix(t)
	ctx := t.Context()
	client := asynq.NewClientFromRedisClient(c)
	server, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	var skew clock.Skew
	skew.Learn(server, time.Now())
	p := newPacer(pacerDeps{client: c, logger: slog.New(slog.DiscardHandler), clock: wallClock{}, skew: &skew, prefix: prefix})
	defer p.close()
	at := server.Add(time.Hour).UnixMicro()
	for _, id := range []string{"crowded", "other"} {
		if _, err := client.Enqueue(asynq.NewTask("x", nil), asynq.Queue(q), asynq.TaskID(id), asynq.ProcessIn(time.Hour)); err != nil {
			t.Fatal(err)
		}
		c.HSet(ctx, asynqstore.TaskPrefix(q)+id, "taskrl_park", server.UnixMicro())
		c.ZAdd(ctx, keys.Pace(prefix, q), redis.Z{Score: float64(at), Member: id})
		p.add(q, id, at, nil)
	}
	p.pull(q, []string{"crowded", "gone"})
	for deadline := time.Now().Add(300 * time.Millisecond); ; time.Sleep(5 * time.Millisecond) {
		if got := c.LRange(ctx, asynqstore.Pending(q), 0, -1).Val(); slices.Equal(got, []string{"crowded"}) {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("pulled: pending %v within 300 ms, want [crowded]", got)
		}
	}
	if n := c.ZCard(ctx, asynqstore.Scheduled(q)).Val(); n != 1 {
		t.Errorf("%d scheduled, want other alone", n)
	}
	if got := c.ZRange(ctx, keys.Pace(prefix, q), 0, -1).Val(); !slices.Equal(got, []string{"other"}) {
		t.Errorf("pacing set %v, want [other]", got)
	}
}
