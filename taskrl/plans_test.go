package taskrl

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
)

// TestPlansNoted: a task whose payload puts its key on a plan leaves the
// plan in Redis for worker status, for a day; a key without a plan, with a
// plan the rule lacks, or whose override wins, leaves none.
func TestPlansNoted(t *testing.T) {
	c := redistest.StartServer(t).Client(t)
	p, err := policy.Parse([]byte(`rules:
  - name: per-business
    match: {type: job}
    key: "{{.business_id}}"
    tier: "{{.plan}}"
    tiers:
      pro: {gcra: {rate: 50, per: 1s}}
    gcra: {rate: 10, per: 1s}
overrides:
  - {rule: per-business, key: b4, gcra: {rate: 20, per: 1s}}
`))
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Policy: p, Client: c, Prefix: "p:"})
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int64
	runWorkers(t, c, m, 1, 4, "q", func(context.Context, *asynq.Task) error { ran.Add(1); return nil })
	client := asynq.NewClientFromRedisClient(c)
	payloads := []string{`{"business_id": "b1", "plan": "pro"}`, `{"business_id": "b1", "plan": "pro"}`, `{"business_id": "b2"}`, `{"business_id": "b3", "plan": "gold"}`, `{"business_id": "b4", "plan": "pro"}`}
	for _, pl := range payloads {
		if _, err := client.Enqueue(asynq.NewTask("job", []byte(pl)), asynq.Queue("q")); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ran.Load() < int64(len(payloads)); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d tasks ran", ran.Load(), len(payloads))
		}
	}
	m.Close() // waits for the notes
	for key, want := range map[string]string{"b1": "pro", "b2": "", "b3": "", "b4": ""} {
		k := keys.Plan("p:", "per-business", key)
		got, _ := c.Get(context.Background(), k).Result()
		ttl := c.PTTL(context.Background(), k).Val()
		if got != want || want != "" && (ttl <= planTTL-time.Minute || ttl > planTTL) {
			t.Errorf("%s: plan %q (TTL %v), want %q", key, got, ttl, want)
		}
	}
	if n := len(m.plans.seen); n != 1 {
		t.Errorf("%d notes remembered, want 1 (b1's, written once for two tasks)", n)
	}
}
