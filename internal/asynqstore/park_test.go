package asynqstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/asynqstore"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// TestParkAgainstAsynq runs real tasks on a pinned-asynq server whose
// handler parks each on its first run: while parked, asynq's Inspector
// sees the same task (ID, retries, options, user headers) scheduled with
// the reason as LastErr; a second enqueue of its TaskID or Unique key is
// refused; no counter moved. After Unpark it runs again under the same ID,
// with the error it had before, its ResultWriter's result is kept with
// Retention, and asynq counts one run.
func TestParkAgainstAsynq(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an asynq server")
	}
	c := redistest.Client(t)
	q := redistest.Queue(t, c, "park")
	prefix := redistest.Prefix(t)
	pace := keys.Pace(prefix, q)
	client := asynq.NewClientFromRedisClient(c)
	insp := asynq.NewInspectorFromRedisClient(c)
	ctx := t.Context()

	type run struct {
		id      string
		retried int
		headers map[string]string
	}
	var mu sync.Mutex
	var runs []run
	parked := make(chan string, 10)
	srv := asynq.NewServerFromRedisClient(c, asynq.Config{
		Concurrency: 2, Queues: map[string]int{q: 1}, TaskCheckInterval: 20 * time.Millisecond,
		DelayedTaskCheckInterval: 100 * time.Millisecond, LogLevel: asynq.FatalLevel,
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return 0 },
	})
	err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		n, _ := asynq.GetRetryCount(ctx)
		mu.Lock()
		runs = append(runs, run{id, n, task.Headers()})
		mu.Unlock()
		switch {
		case task.Type() == "fails" && n == 0:
			return errors.New("remote said no")
		case task.Headers()["taskrl-round"] != "":
			_, err := task.ResultWriter().Write([]byte("result of " + id))
			return err // the run after its wait
		}
		ok, err := asynqstore.Park(ctx, c, asynqstore.Parking{
			Queue: q, ID: id, Reason: "waiting for rule r",
			Headers: map[string]string{"taskrl-round": "1", "taskrl-booked": "123"},
			Forward: time.Now().Add(time.Hour), PaceKey: pace, PaceAt: 0, PaceExpire: time.Now().Add(time.Hour).UnixMilli(),
		})
		if err != nil || !ok {
			t.Errorf("Park(%s) = %v, %v", id, ok, err)
		}
		parked <- id
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()

	// Retention keeps the completed task for the end; "fails" spends its
	// only retry before it waits; "zero" has none.
	a, err := client.Enqueue(asynq.NewTaskWithHeaders("plain", []byte("a"), map[string]string{"x": "1", "taskrl-old": "stale"}),
		asynq.Queue(q), asynq.TaskID("task-a"), asynq.Retention(time.Hour), asynq.Timeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	b, err := client.Enqueue(asynq.NewTask("fails", []byte("b")), asynq.Queue(q), asynq.MaxRetry(1), asynq.Retention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	z, err := client.Enqueue(asynq.NewTask("zero", []byte("z")), asynq.Queue(q), asynq.MaxRetry(0), asynq.Unique(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for len(got) < 3 {
		select {
		case id := <-parked:
			got[id] = true
		case <-time.After(15 * time.Second):
			t.Fatalf("parked %v of 3", got)
		}
	}
	time.Sleep(200 * time.Millisecond) // asynq's write after each handler

	for _, tc := range []struct {
		info    *asynq.TaskInfo
		retried int
	}{{a, 0}, {b, 1}, {z, 0}} {
		info, err := insp.GetTaskInfo(q, tc.info.ID)
		if err != nil {
			t.Fatalf("%s: %v", tc.info.ID, err)
		}
		if info.State != asynq.TaskStateScheduled || info.LastErr != "waiting for rule r" || info.Retried != tc.retried || info.MaxRetry != tc.info.MaxRetry ||
			info.Timeout != tc.info.Timeout || info.Retention != tc.info.Retention || info.Headers["taskrl-round"] != "1" || info.Headers["taskrl-old"] != "" {
			t.Errorf("parked %s: %+v", tc.info.ID, info)
		}
	}
	if info, _ := insp.GetTaskInfo(q, a.ID); info.Headers["x"] != "1" {
		t.Errorf("user header lost: %v", info.Headers)
	}
	if _, err := client.Enqueue(asynq.NewTask("plain", []byte("a")), asynq.Queue(q), asynq.TaskID("task-a")); !errors.Is(err, asynq.ErrTaskIDConflict) {
		t.Errorf("second enqueue of task-a: %v, want ErrTaskIDConflict", err)
	}
	if _, err := client.Enqueue(asynq.NewTask("zero", []byte("z")), asynq.Queue(q), asynq.Unique(time.Hour)); !errors.Is(err, asynq.ErrDuplicateTask) {
		t.Errorf("second enqueue of the unique task: %v, want ErrDuplicateTask", err)
	}
	qi, err := insp.GetQueueInfo(q)
	if err != nil {
		t.Fatal(err)
	}
	if qi.Processed != 1 || qi.Failed != 1 || qi.Scheduled != 3 || qi.Active != 0 {
		t.Errorf("while parked: processed %d failed %d scheduled %d active %d, want 1 1 3 0 (b's real failure only)", qi.Processed, qi.Failed, qi.Scheduled, qi.Active)
	}

	// Parked a moment ago: no move without naming the task, then its own
	// pacer's claim moves it.
	claim := asynqstore.Claim{Queue: q, PaceKey: pace, Moved: keys.Moved(prefix, q), Early: keys.Early(prefix, q), Now: -1, Most: 100, Lead: 0, Fence: int64(time.Hour / time.Microsecond)}
	if u, err := asynqstore.Unpark(ctx, c, claim); err != nil || u.Looked != 3 || u.Moved != 0 {
		t.Fatalf("Unpark inside the fence = %+v, %v; want 3 looked, 0 moved", u, err)
	}
	if err := insp.DeleteTask(q, z.ID); err != nil {
		t.Fatalf("DeleteTask(parked) = %v", err)
	}
	claim.Mine = []string{a.ID, b.ID, z.ID}
	if u, err := asynqstore.Unpark(ctx, c, claim); err != nil || u.Looked != 3 || u.Moved != 2 {
		t.Fatalf("Unpark = %+v, %v; want 3 looked, 2 moved (z deleted)", u, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ia, _ := insp.GetTaskInfo(q, a.ID)
		ib, _ := insp.GetTaskInfo(q, b.ID)
		if ia != nil && ib != nil && ia.State == asynq.TaskStateCompleted && ib.State == asynq.TaskStateCompleted {
			if ia.LastErr != "" || ib.LastErr != "remote said no" || ib.Retried != 1 {
				t.Errorf("completed: a LastErr %q, b LastErr %q retried %d; want \"\", the failure, 1", ia.LastErr, ib.LastErr, ib.Retried)
			}
			if string(ia.Result) != "result of "+a.ID || string(ib.Result) != "result of "+b.ID {
				t.Errorf("results %q, %q: the run after the wait wrote them with its ResultWriter", ia.Result, ib.Result)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not completed: %+v %+v", ia, ib)
		}
		time.Sleep(50 * time.Millisecond)
	}
	qi, _ = insp.GetQueueInfo(q)
	if qi.Processed != 3 || qi.Failed != 1 || qi.Completed != 2 {
		t.Errorf("at the end: processed %d failed %d completed %d; want 3 1 2", qi.Processed, qi.Failed, qi.Completed)
	}
	mu.Lock()
	defer mu.Unlock()
	count := map[string]int{}
	for _, r := range runs {
		count[r.id]++
		if r.id == a.ID && r.headers["taskrl-round"] == "1" && (r.headers["x"] != "1" || r.headers["taskrl-booked"] != "123") {
			t.Errorf("a's run after its wait had headers %v", r.headers)
		}
	}
	if count[a.ID] != 2 || count[b.ID] != 3 || count[z.ID] != 1 {
		t.Errorf("runs %v; want a 2 (park, run), b 3 (fail, park, run), z 1 (parked, then deleted)", count)
	}
}

// TestParkNotActive: a task that is not in the active list (its lease
// ended, it was deleted) is not parked and nothing changes.
func TestParkNotActive(t *testing.T) {
	c := redistest.Client(t)
	q := redistest.Queue(t, c, "gone")
	info, err := asynq.NewClientFromRedisClient(c).Enqueue(asynq.NewTask("x", nil), asynq.Queue(q))
	if err != nil {
		t.Fatal(err)
	}
	ok, err := asynqstore.Park(t.Context(), c, asynqstore.Parking{Queue: q, ID: info.ID, Forward: time.Now(), PaceKey: "test:pace:{" + q + "}", PaceAt: -1})
	if err != nil || ok {
		t.Fatalf("Park(pending task) = %v, %v; want false, nil", ok, err)
	}
	got, err := asynq.NewInspectorFromRedisClient(c).GetTaskInfo(q, info.ID)
	if err != nil || got.State != asynq.TaskStatePending {
		t.Fatalf("after: %+v, %v", got, err)
	}
}

// TestUnparkOrder: a task due within the busy lead goes to the head of
// pending (the end asynq's workers take from), earliest slot first, ahead
// of tasks not yet decided; one due later goes to the tail, and a claim
// once it is due within the busy lead moves it to the head if no worker
// took it. Tasks an earlier claim put at the head and no worker took stay
// ahead of the next claim's; once a worker has taken the last one moved,
// the next claim's go to the head again.
func TestUnparkOrder(t *testing.T) {
	c := redistest.Client(t)
	q := redistest.Queue(t, c, "order")
	prefix := redistest.Prefix(t)
	pace := keys.Pace(prefix, q)
	ctx := t.Context()
	client := asynq.NewClientFromRedisClient(c)
	for _, id := range []string{"u1", "u2"} {
		if _, err := client.Enqueue(asynq.NewTask("x", nil), asynq.Queue(q), asynq.TaskID(id)); err != nil {
			t.Fatal(err)
		}
	}
	// b1..b8 parked an hour ago (past the fence), as park.lua leaves them.
	now := time.Now()
	for _, id := range []string{"b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8"} {
		if _, err := client.Enqueue(asynq.NewTask("x", nil), asynq.Queue(q), asynq.TaskID(id), asynq.ProcessIn(time.Hour)); err != nil {
			t.Fatal(err)
		}
		c.HSet(ctx, asynqstore.TaskPrefix(q)+id, "taskrl_park", now.Add(-time.Hour).UnixMicro())
	}
	// due gives id its slot d from now.
	due := func(id string, d time.Duration) {
		c.ZAdd(ctx, pace, redis.Z{Score: float64(now.Add(d).UnixMicro()), Member: id})
	}
	// claim claims at now+at (the busy lead and the promotion window are
	// 15 ms, the lead 1 s).
	claim := func(at time.Duration, moved, noted int) {
		t.Helper()
		u, err := asynqstore.Unpark(ctx, c, asynqstore.Claim{Queue: q, PaceKey: pace, Moved: keys.Moved(prefix, q), Early: keys.Early(prefix, q),
			Now: now.Add(at).UnixMicro(), Most: 100, Lead: time.Second.Microseconds(), BusyLead: (15 * time.Millisecond).Microseconds(), Promote: (15 * time.Millisecond).Microseconds(), Fence: 1})
		if err != nil || u.Moved != moved || u.Noted != noted {
			t.Fatalf("Unpark = %+v, %v; want %d moved, %d noted", u, err, moved, noted)
		}
	}
	head := func(want ...string) { t.Helper(); checkHead(t, c, q, want...) }
	due("b2", 0) // b2's slot first
	due("b1", 10*time.Millisecond)
	due("b7", 30*time.Millisecond) // beyond the busy lead: to the tail
	claim(0, 3, 1)
	head("b2", "b1", "u1", "u2", "b7")
	due("b3", 20*time.Millisecond)
	due("b4", 25*time.Millisecond)
	claim(10*time.Millisecond, 2, 0)
	head("b2", "b1", "b3", "b4", "u1", "u2", "b7")
	claim(20*time.Millisecond, 0, 0) // b7 due within the busy lead now
	head("b2", "b1", "b3", "b4", "b7", "u1", "u2")
	// A worker takes b2, b1, b3, b4, b7 (asynq's dequeue: to active),
	// given back before the queue is deleted.
	t.Cleanup(func() {
		for c.LMove(context.Background(), asynqstore.Active(q), asynqstore.Pending(q), "LEFT", "LEFT").Err() == nil {
		}
	})
	take := func(n int) {
		for range n {
			id := c.RPopLPush(ctx, asynqstore.Pending(q), asynqstore.Active(q)).Val()
			c.HSet(ctx, asynqstore.TaskPrefix(q)+id, "state", "active")
		}
	}
	take(5)
	due("b5", 20*time.Millisecond)
	claim(20*time.Millisecond, 1, 0)
	head("b5", "u1", "u2")
	due("b6", 20*time.Millisecond)
	claim(20*time.Millisecond, 1, 0)
	head("b5", "b6", "u1", "u2")
	// Nothing else pending: to the tail, not noted.
	take(4)
	due("b8", 100*time.Millisecond)
	claim(20*time.Millisecond, 1, 0)
	head("b8")
	if n := c.ZCard(ctx, keys.Early(prefix, q)).Val(); n != 0 {
		t.Errorf("early set holds %d, want 0", n)
	}
}
