package taskrl

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
)

// TestLimitsClient: the queues on one redis-server, the limits on another
// (Config.LimitsClient), two asynq servers. 24 tasks of two businesses
// under 10/s per business: each business's runs at least 100 ms apart less
// the clocks' grain, every task once, the first task of b1 throttled by its
// API for 300 ms. Afterwards every key of ours on the limits' server
// starts with the prefix, the rules' state and the throttle's markers are
// there, and the queues' server holds no key naming a rule.
func TestLimitsClient(t *testing.T) {
	queues, limits := redistest.StartServer(t), redistest.StartServer(t)
	qc, lc := queues.Client(t), limits.Client(t)
	p, err := policy.Parse([]byte(`
rules:
  - name: per-business
    match: {type: "job:*"}
    key: "{{.b}}"
    gcra: {rate: 10, per: 1s}
  - name: slots
    match: {type: "job:*"}
    concurrency: {max: 4, lease: 30s}
`))
	if err != nil {
		t.Fatal(err)
	}
	prefix := redistest.Prefix(t)
	m, err := New(Config{Policy: p, Client: qc, LimitsClient: lc, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	var mu sync.Mutex
	runs := map[string][]time.Time{}
	seen := map[string]int{}
	throttled := false
	handler := func(ctx context.Context, task *asynq.Task) error {
		b := strings.TrimSuffix(strings.TrimPrefix(string(task.Payload()), `{"b":"`), `"}`)
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		defer mu.Unlock()
		if b == "b1" && !throttled {
			throttled = true
			return Throttled(300*time.Millisecond, errors.New("429"))
		}
		runs[b] = append(runs[b], time.Now())
		seen[id]++
		return nil
	}
	for range 2 {
		s := asynq.NewServerFromRedisClient(qc, m.ServerConfig(asynq.Config{Concurrency: 4, TaskCheckInterval: 50 * time.Millisecond,
			Queues: map[string]int{"lc": 1}, LogLevel: asynq.ErrorLevel}))
		mux := asynq.NewServeMux()
		mux.Use(m.Handler)
		mux.HandleFunc("job:call", handler)
		if err := s.Start(mux); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Shutdown)
	}
	client := asynq.NewClientFromRedisClient(qc)
	for i := range 24 {
		b := []string{"b1", "b2"}[i%2]
		if _, err := client.Enqueue(asynq.NewTask("job:call", []byte(`{"b":"`+b+`"}`)), asynq.Queue("lc"), asynq.MaxRetry(0)); err != nil {
			t.Fatal(err)
		}
	}
	// The throttle's marker lives as long as the throttle and a second:
	// looked for while the tasks run.
	var block bool
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, k := range lc.Keys(context.Background(), prefix+"*block*").Val() {
			block = block || strings.HasSuffix(k, ":per-business")
		}
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n == 24 {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 24 {
		t.Fatalf("%d of 24 tasks ran", len(seen))
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("task %s ran %d times", id, n)
		}
	}
	for b, ts := range runs {
		for i := 1; i < len(ts); i++ {
			if gap := ts[i].Sub(ts[i-1]); gap < 95*time.Millisecond {
				t.Errorf("%s ran twice %v apart under 10/s", b, gap)
			}
		}
	}
	keysOf := func(c *redis.Client) []string {
		ks, err := c.Keys(context.Background(), "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return ks
	}
	var state bool
	for _, k := range keysOf(lc) {
		if !strings.HasPrefix(k, prefix) {
			t.Errorf("the limits' server holds %q, not under the prefix %q", k, prefix)
		}
		state = state || strings.Contains(k, ":per-business:gcra")
	}
	if !state || !block {
		t.Errorf("the limits' server holds the rule's state: %v, the throttle's marker: %v; keys %q", state, block, keysOf(lc))
	}
	for _, k := range keysOf(qc) {
		// The index of waiting tasks (Waiting) is the queues'.
		if (strings.Contains(k, "per-business") || strings.Contains(k, ":slots:")) && !strings.Contains(k, ":waiting:{") {
			t.Errorf("the queues' server holds %q, a key of the limits", k)
		}
	}
}
