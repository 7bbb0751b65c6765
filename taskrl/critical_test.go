package taskrl

import (
	"context"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
)

// TestCriticalUsesReservedSlots: a concurrency rule of 4 slots, 1 reserved
// for the policy's critical tasks (queue critical), under a saturating bulk
// load (60 tasks of 200 ms on 16 workers). Bulk tasks never hold more than
// 3 slots at once; the 4th is used, by critical tasks; and each critical
// task, one every 250 ms, starts within 600 ms of its enqueue (the workers
// may all be holding bulk tasks that wait for a slot, for up to MaxHold,
// and asynq looks for new tasks every 50 ms here), not after a bulk task's
// slot comes free.
func TestCriticalUsesReservedSlots(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	p, err := policy.Parse([]byte(`
critical:
  - {queue: critical}
rules:
  - name: slots
    match: {type: "job:*"}
    concurrency: {max: 4, lease: 30s, reserved: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Policy: p, Client: c, Prefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	const bulk, critical = 60, 12
	var bulkNow, allNow, bulkMost, allMost, bulkDone atomic.Int32
	raise := func(most *atomic.Int32, n int32) {
		for old := most.Load(); n > old && !most.CompareAndSwap(old, n); old = most.Load() {
		}
	}
	var mu sync.Mutex
	var waits []time.Duration
	handler := func(ctx context.Context, task *asynq.Task) error {
		n := allNow.Add(1)
		raise(&allMost, n)
		defer allNow.Add(-1)
		if task.Type() == "job:crit" {
			sent, _ := strconv.ParseInt(string(task.Payload()), 10, 64)
			mu.Lock()
			waits = append(waits, time.Since(time.UnixMicro(sent)))
			mu.Unlock()
			time.Sleep(100 * time.Millisecond)
			return nil
		}
		raise(&bulkMost, bulkNow.Add(1))
		time.Sleep(200 * time.Millisecond)
		bulkNow.Add(-1)
		bulkDone.Add(1)
		return nil
	}
	for i := 0; i < 2; i++ {
		// asynq looks for pending tasks every 50 ms when idle (its
		// default is 1 s, which alone would make a critical task wait
		// up to 1.5 s whatever the limits do).
		s := asynq.NewServerFromRedisClient(c, m.ServerConfig(asynq.Config{Concurrency: 8, TaskCheckInterval: 50 * time.Millisecond,
			Queues: map[string]int{"bulk": 1, "critical": 1}, LogLevel: asynq.ErrorLevel}))
		mux := asynq.NewServeMux()
		mux.Use(m.Handler)
		mux.HandleFunc("job:bulk", handler)
		mux.HandleFunc("job:crit", handler)
		if err := s.Start(mux); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Shutdown)
	}
	client := asynq.NewClientFromRedisClient(c)
	for i := 0; i < bulk; i++ {
		if _, err := client.Enqueue(asynq.NewTask("job:bulk", []byte(strconv.Itoa(i))), asynq.Queue("bulk"), asynq.MaxRetry(0)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond) // the bulk work takes its slots
	for i := 0; i < critical; i++ {
		if _, err := client.Enqueue(asynq.NewTask("job:crit", []byte(strconv.FormatInt(time.Now().UnixMicro(), 10))), asynq.Queue("critical"), asynq.MaxRetry(0)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	deadline := time.Now().Add(30 * time.Second)
	for bulkDone.Load() < bulk && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
	t.Logf("bulk: %d done, at most %d at once; all: at most %d at once; critical starts after %v", bulkDone.Load(), bulkMost.Load(), allMost.Load(), waits)
	if bulkDone.Load() != bulk {
		t.Errorf("only %d of %d bulk tasks ran", bulkDone.Load(), bulk)
	}
	if bulkMost.Load() > 3 || allMost.Load() != 4 {
		t.Errorf("at most %d bulk and %d tasks in all ran at once; want 3 and 4", bulkMost.Load(), allMost.Load())
	}
	if len(waits) != critical || waits[len(waits)-1] > 600*time.Millisecond {
		t.Errorf("%d critical tasks started, the slowest after %v", len(waits), waits[len(waits)-1])
	}
}
