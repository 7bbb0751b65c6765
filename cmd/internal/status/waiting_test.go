package status

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/taskrl"
)

// TestWaiting runs a real asynq server with the middleware under one task
// per 10 s per business: of 3 tasks of b1 and 2 of b2, one of each runs
// (whichever the workers decide first) and the other 3 wait. Waiting lists
// those 3 under the IDs Enqueue returned, with their keys, slots 10 and
// 20 s ahead and the reason; with
// the rule and a key, that key's only; a plain scheduled task of the same
// queue never.
func TestWaiting(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an asynq server")
	}
	c := redistest.Client(t)
	q := redistest.Queue(t, c, "waiting")
	p, err := policy.Parse([]byte(`
rules:
  - name: per-business
    match: {type: job}
    key: "{{.business_id}}"
    gcra: {rate: 1, per: 10s, burst: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := taskrl.New(taskrl.Config{Policy: p, Client: c, Prefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	srv := asynq.NewServerFromRedisClient(c, mw.ServerConfig(asynq.Config{Queues: map[string]int{q: 1}, LogLevel: asynq.FatalLevel, TaskCheckInterval: 50 * time.Millisecond}))
	mux := asynq.NewServeMux()
	mux.Use(mw.Handler)
	mux.HandleFunc("job", func(context.Context, *asynq.Task) error { return nil })
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	client := asynq.NewClientFromRedisClient(c)
	ids := map[string][]string{}
	for _, biz := range []string{"b1", "b1", "b1", "b2", "b2"} {
		info, err := client.Enqueue(asynq.NewTask("job", []byte(`{"business_id":"`+biz+`"}`)), asynq.Queue(q))
		if err != nil {
			t.Fatal(err)
		}
		ids[biz] = append(ids[biz], info.ID)
	}
	if _, err := client.Enqueue(asynq.NewTask("job", []byte(`{"business_id":"b1"}`)), asynq.Queue(q), asynq.ProcessIn(time.Hour)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var all []WaitingTask
	for deadline := time.Now().Add(10 * time.Second); len(all) < 3 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if all, err = Waiting(ctx, c, p, []string{q}, "", "", 100); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	bizOf := map[string]string{}
	for biz, l := range ids {
		for _, id := range l {
			bizOf[id] = biz
		}
	}
	if len(all) != 3 {
		t.Fatalf("Waiting = %+v, want the 3 waiting tasks", all)
	}
	perBiz := map[string]int{}
	for _, w := range all {
		in := w.Until.Sub(now)
		perBiz[bizOf[w.ID]]++
		if bizOf[w.ID] == "" || w.Keys["per-business"] != bizOf[w.ID] || !w.Booked || in < 8*time.Second || in > 21*time.Second ||
			!strings.Contains(w.Reason, `waiting for rule "per-business": booked for `) {
			t.Errorf("waiting task %+v (in %v); want one of the enqueued IDs with its business's key, booked 10 or 20 s ahead, with the rule", w, in)
		}
	}
	if perBiz["b1"] != 2 || perBiz["b2"] != 1 {
		t.Errorf("waiting per business %v; want b1 2, b2 1 (the first of each runs)", perBiz)
	}
	b1, err := Waiting(ctx, c, p, []string{q}, "per-business", "b1", 100)
	if err != nil || len(b1) != 2 || b1[0].Keys["per-business"] != "b1" || b1[1].Keys["per-business"] != "b1" {
		t.Errorf("Waiting(per-business, b1) = %+v, %v; want b1's 2", b1, err)
	}
	if one, _ := Waiting(ctx, c, p, []string{q}, "", "", 1); len(one) != 1 {
		t.Errorf("Waiting(most 1) listed %d", len(one))
	}
	if _, err := Waiting(ctx, c, p, []string{q}, "", "b1", 100); err == nil {
		t.Error("a key without a rule: no error")
	}
	text := WaitingText(all, now)
	if !strings.Contains(text, "per-business=b1") || !strings.Contains(text, "3 waiting") {
		t.Errorf("WaitingText:\n%s", text)
	}
}
