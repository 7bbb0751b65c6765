package asynqstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/asynqstore"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// TestScout: a look reads the tasks enqueued since the last look with the
// same mark, newest first, with their messages as asynq wrote them, and
// leaves the mark on the newest; a move puts the tasks named, still
// pending, at the head of the list in the order named, and leaves a task a
// worker took where it is.
func TestScout(t *testing.T) {
	c := redistest.Client(t)
	q := redistest.Queue(t, c, "scout")
	ctx := t.Context()
	client := asynq.NewClientFromRedisClient(c)
	enqueue := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			if _, err := client.Enqueue(asynq.NewTask("x", []byte(id)), asynq.Queue(q), asynq.TaskID(id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	hash := keys.Sweep(redistest.Prefix(t), q)
	look := func(mark string, window int, want ...string) {
		t.Helper()
		got, err := asynqstore.ScoutRead(ctx, c, asynqstore.Scout{Queue: q, Hash: hash, Mark: mark, Window: window, Bytes: 1 << 20, Keep: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, l := range got {
			m, err := asynqstore.Decode([]byte(l.Msg))
			if err != nil || m.ID != l.ID || string(m.Payload) != l.ID {
				t.Errorf("%s: message %+v (%v)", l.ID, m, err)
			}
			ids = append(ids, l.ID)
		}
		if !slices.Equal(ids, want) {
			t.Errorf("look %q: read %v, want %v", mark, ids, want)
		}
	}
	head := func(want ...string) { t.Helper(); checkHead(t, c, q, want...) }
	enqueue("a1", "a2", "a3")
	look("r", 2, "a3", "a2") // the window: the newest two
	enqueue("b1", "b2")
	look("r", 100, "b2", "b1")
	look("r", 100)
	look("other", 100, "b2", "b1", "a3", "a2", "a1") // a mark of its own
	if ttl := c.PTTL(ctx, hash).Val(); ttl < 50*time.Second || ttl > time.Minute {
		t.Errorf("the marks' hash lives %v, want about a minute", ttl)
	}
	// A worker takes a1 (asynq's dequeue); it stays active.
	if id := c.RPopLPush(ctx, asynqstore.Pending(q), asynqstore.Active(q)).Val(); id != "a1" {
		t.Fatalf("took %q, want a1", id)
	}
	t.Cleanup(func() { c.LMove(context.Background(), asynqstore.Active(q), asynqstore.Pending(q), "LEFT", "LEFT") })
	moved, err := asynqstore.ScoutMove(ctx, c, q, []string{"b1", "a1", "b2"})
	if err != nil || moved != 2 {
		t.Fatalf("ScoutMove = %d, %v; want 2 moved", moved, err)
	}
	head("b1", "b2", "a2", "a3")
	if n := c.LLen(ctx, asynqstore.Active(q)).Val(); n != 1 {
		t.Errorf("%d active, want a1 alone", n)
	}
}
