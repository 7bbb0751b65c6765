package taskrl

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/asynqstore"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// TestSweep sets a backlog aside by hand (a noted backlog, one sweep) in a
// queue of 2,500 tasks of one business under 2/s, with other businesses'
// tasks, a task no rule governs, a booked copy and a task whose deadline
// comes before its turn among them. Every task of the backlog but those
// two leaves pending for asynq's scheduled set, due 2 a second in queue
// order from sweepLead before the noted slot plus one interval; every
// other task stays pending, in its order; no task is lost or doubled. A
// second sweep finds nothing more to move, and a sweeper that finds
// another's lock moves nothing. On Redis Cluster too, in a queue whose
// name holds braces (the sweep's keys share asynq's slot).
func TestSweep(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		c := redistest.Client(t)
		testSweep(t, c, redistest.Queue(t, c, "sweep"))
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.Cluster(t)
		testSweep(t, c, redistest.Queue(t, c, "a}b{c"))
	})
}

func testSweep(t *testing.T, c redis.UniversalClient, q string) {
	prefix := redistest.Prefix(t)
	p := mustPolicy(t,
		policy.Rule{Name: "global", Match: policy.Match{Type: "call"}, Limit: quotas.GCRA(gcra.Limit{Rate: 20, Period: time.Second, Burst: 1})},
		policy.Rule{Name: "business", Match: policy.Match{Type: "call"}, Key: "{{.b}}", Limit: quotas.GCRA(gcra.Limit{Rate: 2, Period: time.Second, Burst: 1})})
	m, err := New(Config{Policy: p, Client: c, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	client := asynq.NewClientFromRedisClient(c)
	enqueue := func(task *asynq.Task, opts ...asynq.Option) string {
		info, err := client.Enqueue(task, append(opts, asynq.Queue(q))...)
		if err != nil {
			t.Fatal(err)
		}
		return info.ID
	}
	call := func(b string) *asynq.Task { return asynq.NewTask("call", fmt.Appendf(nil, `{"b":%q}`, b)) }
	var order, noisy, others []string
	rank := map[string]int{} // place in the backlog, oldest first
	for i := 0; i < 2500; i++ {
		var id string
		switch {
		case i%250 == 7:
			id = enqueue(call(fmt.Sprint("quiet", i)))
		case i == 600:
			id = enqueue(asynq.NewTask("other", nil))
		case i == 700:
			id = enqueue(asynq.NewTaskWithHeaders("call", []byte(`{"b":"noisy"}`), map[string]string{HeaderBooked: "1"}))
		case i == 800:
			id = enqueue(call("noisy"), asynq.Deadline(time.Now().Add(30*time.Second)))
		default:
			id = enqueue(call("noisy"))
			noisy = append(noisy, id)
		}
		if i == 800 || len(noisy) > 0 && noisy[len(noisy)-1] == id {
			rank[id] = len(rank)
		}
		if len(noisy) == 0 || noisy[len(noisy)-1] != id {
			others = append(others, id)
		}
		order = append(order, id)
	}
	// Note the backlog as reschedule does: its last slot 100 s ahead.
	b := p.Bind("call", q)
	rq, err := b.Request([]byte(`{"b":"noisy"}`))
	if err != nil {
		t.Fatal(err)
	}
	sp, err := m.split(b.ForKeys(rq.Keys))
	if err != nil {
		t.Fatal(err)
	}
	if sp.spacing != 500*time.Millisecond {
		t.Fatalf("spacing %v, want the business's 500ms", sp.spacing)
	}
	slot := m.serverNow().Add(100 * time.Second)
	start := time.Now()
	m.sweep.remember(q, sp.signature(rq.Keys, nil), sp.spacing, slot)
	if err := m.sweep.sweep(q); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	pending, err := c.LRange(ctx, asynqstore.Pending(q), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(pending) // oldest first
	if !slices.Equal(pending, others) {
		t.Fatalf("pending after the sweep: %d tasks, want the %d others in order", len(pending), len(others))
	}
	insp := asynq.NewInspectorFromRedisClient(c)
	for i, id := range noisy {
		score, err := c.ZScore(ctx, asynqstore.Scheduled(q), id).Result()
		if err != nil {
			t.Fatalf("noisy task %d not scheduled: %v", i, err)
		}
		// Due sweepLead before 100 s + (rank+1) intervals, on the local
		// clock, in whole seconds (the task with a deadline stays pending
		// and takes its place).
		want := start.Add(100*time.Second + time.Duration(rank[id]+1)*500*time.Millisecond - sweepLead)
		if d := score - float64(want.Unix()); d < -1 || d > 0.5 {
			t.Fatalf("noisy task %d due at %v, want about %v", i, time.Unix(int64(score), 0), want)
		}
		if i%500 == 0 {
			info, err := insp.GetTaskInfo(q, id)
			if err != nil || info.State != asynq.TaskStateScheduled || info.NextProcessAt.Unix() != int64(score) {
				t.Fatalf("asynq sees noisy task %d as %+v (%v)", i, info, err)
			}
		}
	}
	if n, _ := c.ZCard(ctx, asynqstore.Scheduled(q)).Result(); int(n) != len(noisy) {
		t.Fatalf("%d scheduled, want %d", n, len(noisy))
	}
	if ttl := c.PTTL(ctx, keys.Sweep(prefix, q)).Val(); ttl < time.Minute || ttl > 25*time.Minute {
		t.Errorf("the sweep's cursors live %v, want a minute past the last estimate (about 21 min)", ttl)
	}
	// A second sweep: nothing left to move.
	if err := m.sweep.sweep(q); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.LLen(ctx, asynqstore.Pending(q)).Result(); int(n) != len(others) {
		t.Fatalf("a second sweep left %d pending, want %d", n, len(others))
	}
	// A task set aside comes back (as asynq's forwarder moves it) behind
	// more of the backlog: the sweep moves the others, not it again.
	if err := insp.RunTask(q, noisy[0]); err != nil {
		t.Fatal(err)
	}
	var more []string
	for i := 0; i < 250; i++ {
		more = append(more, enqueue(call("noisy")))
	}
	if err := m.sweep.sweep(q); err != nil {
		t.Fatal(err)
	}
	for _, id := range more {
		if _, err := c.ZScore(ctx, asynqstore.Scheduled(q), id).Result(); err != nil {
			t.Fatalf("a later task of the backlog was not set aside: %v", err)
		}
	}
	if info, err := insp.GetTaskInfo(q, noisy[0]); err != nil || info.State != asynq.TaskStatePending {
		t.Fatalf("a task set aside once was moved again: %+v %v", info, err)
	}
	if err := insp.DeleteTask(q, noisy[0]); err != nil {
		t.Fatal(err)
	}
	// Another sweeper holds the lock: more of the backlog stays pending.
	for i := 0; i < 300; i++ {
		enqueue(call("noisy"))
	}
	if locked, _, _, err := asynqstore.SweepRead(ctx, c, asynqstore.Look{Queue: q, Lock: keys.Sweep(prefix, q), Now: m.serverNow().UnixMicro(), Token: "other", Hold: sweepLock, Window: 1, Least: 1, Bytes: sweepBytes}); err != nil || !locked {
		t.Fatal(locked, err)
	}
	if err := m.sweep.sweep(q); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.LLen(ctx, asynqstore.Pending(q)).Result(); int(n) != len(others)+300 {
		t.Fatalf("with another's lock held the sweep left %d pending, want %d", n, len(others)+300)
	}
}

// TestSweepEndToEnd starts two asynq servers with the middleware on 5,000
// pending tasks of one business under 2/s, then enqueues a task of each
// of 30 other businesses, one every 50ms: the others all start within 1 s
// of their enqueue (without the sweep, KeepOrder, the first waited 1.6 s
// here, for the fleet to dequeue and reschedule the 5,000 first), the business keeps its 2/s, and every task is
// accounted for: run, pending or scheduled, none twice, none archived.
func TestSweepEndToEnd(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	p := mustPolicy(t,
		policy.Rule{Name: "global", Match: policy.Match{Type: "job"}, Limit: quotas.GCRA(gcra.Limit{Rate: 40, Period: time.Second, Burst: 1})},
		policy.Rule{Name: "business", Match: policy.Match{Type: "job"}, Key: "{{.b}}", Limit: quotas.GCRA(gcra.Limit{Rate: 2, Period: time.Second, Burst: 1})})
	m, err := New(Config{Policy: p, Client: c})
	if err != nil {
		t.Fatal(err)
	}
	type run struct {
		b  string
		at time.Time
	}
	client := asynq.NewClientFromRedisClient(c)
	const noisy, quiet = 5000, 30
	for i := 0; i < noisy; i++ {
		if _, err := client.Enqueue(asynq.NewTask("job", []byte(`{"b":"noisy"}`)), asynq.Queue("q"), asynq.MaxRetry(0)); err != nil {
			t.Fatal(err)
		}
	}
	runs := make(chan run, 10000)
	runWorkers(t, c, m, 2, 10, "q", func(ctx context.Context, task *asynq.Task) error {
		var v struct{ B string }
		_ = json.Unmarshal(task.Payload(), &v)
		runs <- run{v.B, time.Now()}
		return nil
	})
	sent := map[string]time.Time{}
	for i := 0; i < quiet; i++ {
		b := fmt.Sprint("q", i)
		sent[b] = time.Now()
		if _, err := client.Enqueue(asynq.NewTask("job", fmt.Appendf(nil, `{"b":%q}`, b)), asynq.Queue("q"), asynq.MaxRetry(0)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(3 * time.Second)
	var lat []time.Duration
	var noisyRuns []time.Time
	seen := map[string]bool{}
	for len(runs) > 0 {
		r := <-runs
		if at, ok := sent[r.b]; ok {
			if seen[r.b] {
				t.Errorf("%s ran twice", r.b)
			}
			seen[r.b] = true
			lat = append(lat, r.at.Sub(at))
		} else {
			noisyRuns = append(noisyRuns, r.at)
		}
	}
	slices.Sort(lat)
	if len(lat) != quiet {
		t.Fatalf("%d of %d quiet tasks ran", len(lat), quiet)
	}
	t.Logf("quiet start latency p50 %v max %v; noisy ran %d", lat[len(lat)/2], lat[len(lat)-1], len(noisyRuns))
	if lat[len(lat)-1] > time.Second {
		t.Errorf("a quiet task started %v after its enqueue, over 1 s", lat[len(lat)-1])
	}
	insp := asynq.NewInspectorFromRedisClient(c)
	info, err := insp.GetQueueInfo("q")
	if err != nil {
		t.Fatal(err)
	}
	if info.Archived != 0 || info.Retry != 0 {
		t.Errorf("archived %d, retry %d", info.Archived, info.Retry)
	}
	elapsed := noisyRuns[len(noisyRuns)-1].Sub(noisyRuns[0]).Seconds()
	if rate := float64(len(noisyRuns)-1) / elapsed; len(noisyRuns) < 2 || rate < 1.8 || rate > 2.2 {
		t.Errorf("the noisy business ran %d times at %.2f/s, want 2/s", len(noisyRuns), rate)
	}
	// Every noisy task is somewhere: run, or waiting in asynq.
	if left := info.Pending + info.Scheduled + info.Active; left+len(noisyRuns) != noisy {
		t.Errorf("%d ran + %d waiting (pending %d, scheduled %d, active %d), want %d", len(noisyRuns), left, info.Pending, info.Scheduled, info.Active, noisy)
	}
}

// TestSweepLargePayloads: a pass reads at most sweepBytes of messages, so
// a backlog of 600 tasks of 16 KB (9.6 MB) is set aside in several passes,
// all of it, in order.
func TestSweepLargePayloads(t *testing.T) {
	c := redistest.Client(t)
	q := redistest.Queue(t, c, "large")
	p := mustPolicy(t, policy.Rule{Name: "business", Match: policy.Match{Type: "call"}, Key: "{{.b}}", Limit: quotas.GCRA(gcra.Limit{Rate: 2, Period: time.Second, Burst: 1})})
	m, err := New(Config{Policy: p, Client: c, Prefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	payload := fmt.Appendf(nil, `{"b":"big","pad":%q}`, strings.Repeat("x", 16<<10))
	client := asynq.NewClientFromRedisClient(c)
	var ids []string
	for i := 0; i < 600; i++ {
		info, err := client.Enqueue(asynq.NewTask("call", payload), asynq.Queue(q))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
	}
	b := p.Bind("call", q)
	rq, _ := b.Request(payload)
	sp, err := m.split(b.ForKeys(rq.Keys))
	if err != nil {
		t.Fatal(err)
	}
	m.sweep.remember(q, sp.signature(rq.Keys, nil), sp.spacing, m.serverNow().Add(2*time.Minute))
	if err := m.sweep.sweep(q); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if n := c.LLen(ctx, asynqstore.Pending(q)).Val(); n != 0 {
		t.Fatalf("%d of 600 left pending", n)
	}
	prev := 0.0
	for i, id := range ids {
		score, err := c.ZScore(ctx, asynqstore.Scheduled(q), id).Result()
		if err != nil || score < prev {
			t.Fatalf("task %d: due %v after %v (%v): not in queue order", i, score, prev, err)
		}
		prev = score
	}
}
