package campaign

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func TestEnqueue(t *testing.T) {
	rdb := redistest.Client(t)
	q := redistest.Queue(t, rdb, "q")
	client := asynq.NewClientFromRedisClient(rdb)
	src := func(i int) (*asynq.Task, []asynq.Option) {
		return asynq.NewTask("job", []byte(strconv.Itoa(i))), []asynq.Option{asynq.Queue(q), asynq.TaskID(fmt.Sprintf("job-%d", i))}
	}
	var done atomic.Int64
	c, err := Enqueue(context.Background(), client, 0, 500, 16, src, &done)
	if err != nil || c != (Counts{Enqueued: 500}) || done.Load() != 500 {
		t.Fatalf("Enqueue: %+v, %v, done %d", c, err, done.Load())
	}
	// Again over an overlapping range: the existing IDs are not errors.
	c, err = Enqueue(context.Background(), client, 400, 600, 0, src, nil)
	if err != nil || c != (Counts{Enqueued: 100, Existing: 100}) {
		t.Fatalf("second Enqueue: %+v, %v", c, err)
	}
	ts := redistest.Pending(t, rdb, q)
	if len(ts) != 600 {
		t.Fatalf("%d pending tasks, want 600", len(ts))
	}
	seen := map[string]bool{}
	for _, ti := range ts {
		if want := "job-" + string(ti.Payload); ti.ID != want || seen[ti.ID] {
			t.Fatalf("task %s with payload %s", ti.ID, ti.Payload)
		}
		seen[ti.ID] = true
	}
}

func TestEnqueueStopsAtError(t *testing.T) {
	rdb := redistest.Client(t)
	q := redistest.Queue(t, rdb, "q")
	client := asynq.NewClientFromRedisClient(rdb)
	// Task 300 has no type, which asynq refuses.
	src := func(i int) (*asynq.Task, []asynq.Option) {
		typ := "job"
		if i == 300 {
			typ = ""
		}
		return asynq.NewTask(typ, nil), []asynq.Option{asynq.Queue(q)}
	}
	c, err := Enqueue(context.Background(), client, 0, 5000, 8, src, nil)
	if err == nil || !strings.Contains(err.Error(), "task 300:") {
		t.Fatalf("error %v, want one naming task 300", err)
	}
	if c.Enqueued < 300 || c.Enqueued >= 5000 {
		t.Errorf("enqueued %d", c.Enqueued)
	}
	// The count is exact: calls in flight were finished, not cut off.
	if n := len(redistest.Pending(t, rdb, q)); n != c.Enqueued {
		t.Errorf("reported %d enqueued, queue holds %d", c.Enqueued, n)
	}
}

func TestEnqueueCancelled(t *testing.T) {
	rdb := redistest.Client(t)
	q := redistest.Queue(t, rdb, "q")
	client := asynq.NewClientFromRedisClient(rdb)
	ctx, cancel := context.WithCancel(context.Background())
	src := func(i int) (*asynq.Task, []asynq.Option) {
		if i == 200 {
			cancel()
		}
		return asynq.NewTask("job", nil), []asynq.Option{asynq.Queue(q)}
	}
	c, err := Enqueue(ctx, client, 0, 100000, 4, src, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	if n := len(redistest.Pending(t, rdb, q)); n != c.Enqueued || n < 200 || n > 300 {
		t.Errorf("reported %d enqueued, queue holds %d", c.Enqueued, n)
	}
}

// BenchmarkEnqueue compares the pooled Enqueue with a plain loop of
// asynq.Client.Enqueue calls, in tasks per second; the sub-benchmark
// "speedup" reports the ratio of the two measured back to back.
func BenchmarkEnqueue(b *testing.B) {
	// A pool as large as the enqueue binary's (--parallel + 4).
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(b), PoolSize: DefaultParallel + 4})
	b.Cleanup(func() { rdb.Close() })
	q := redistest.Queue(b, rdb, "bench")
	client := asynq.NewClientFromRedisClient(rdb)
	payload := Spec{URL: "http://api.example/v1/send", Count: 1, Businesses: 20}
	src := func(i int) (*asynq.Task, []asynq.Option) {
		return asynq.NewTask("http:call", payload.Payload(i)), []asynq.Option{asynq.Queue(q)}
	}
	const batch = 2000
	sequential := func() time.Duration {
		start := time.Now()
		for i := 0; i < batch; i++ {
			task, opts := src(i)
			if _, err := client.Enqueue(task, opts...); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start)
	}
	pooled := func() time.Duration {
		start := time.Now()
		if _, err := Enqueue(context.Background(), client, 0, batch, DefaultParallel, src, nil); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	drain := func() {
		b.StopTimer()
		asynq.NewInspectorFromRedisClient(rdb).DeleteQueue(q, true)
		b.StartTimer()
	}
	b.Run("sequential", func(b *testing.B) {
		var d time.Duration
		for i := 0; i < b.N; i++ {
			d += sequential()
			drain()
		}
		b.ReportMetric(float64(b.N*batch)/d.Seconds(), "tasks/s")
	})
	b.Run("pooled", func(b *testing.B) {
		var d time.Duration
		for i := 0; i < b.N; i++ {
			d += pooled()
			drain()
		}
		b.ReportMetric(float64(b.N*batch)/d.Seconds(), "tasks/s")
	})
	b.Run("speedup", func(b *testing.B) {
		var seq, pool time.Duration
		for i := 0; i < b.N; i++ {
			seq += sequential()
			drain()
			pool += pooled()
			drain()
		}
		b.ReportMetric(seq.Seconds()/pool.Seconds(), "x")
	})
}
