package asynqstore_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/asynqstore"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// TestParkRewrite parks 300 random tasks, enqueued by the pinned asynq
// with random payloads (bytes that look like protobuf fields among them),
// headers (some of ours among them) and options, and reads each back with
// asynq's own Inspector: the payload, the producer's headers and every
// option are as enqueued, our headers are exactly the park's, LastErr is
// the reason; after Unpark, LastErr is the task's own again and our
// headers stay for the worker.
func TestParkRewrite(t *testing.T) {
	c := redistest.Client(t)
	q := redistest.Queue(t, c, "rewrite")
	prefix := redistest.Prefix(t)
	pace := keys.Pace(prefix, q)
	client := asynq.NewClientFromRedisClient(c)
	insp := asynq.NewInspectorFromRedisClient(c)
	ctx := t.Context()
	r := rand.New(rand.NewPCG(26, 1))
	bytes := func(n int) string {
		b := make([]byte, r.IntN(n+1))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		return string(b)
	}
	str := func(n int) string { // protobuf strings are UTF-8
		rs := make([]rune, r.IntN(n+1))
		for i := range rs {
			rs[i] = []rune{'a', '{', '}', '\n', 0, 0x3a, 'é', '世', 0x1F600}[r.IntN(9)]
		}
		return string(rs)
	}
	for i := range 300 {
		payload := []byte(bytes(300))
		if i%5 == 0 {
			payload = append(payload, 0x3a, 3, 'a', 'b', 'c', 0x7a, 2, 0x0a, 0) // error_msg and header lookalikes
		}
		headers := map[string]string{}
		for range r.IntN(4) {
			headers[str(12)] = str(40)
		}
		if i%3 == 0 {
			headers["taskrl-booked"] = "stale"
		}
		opts := []asynq.Option{asynq.Queue(q), asynq.MaxRetry(r.IntN(30))}
		if i%2 == 0 {
			opts = append(opts, asynq.Timeout(time.Duration(1+r.IntN(1000))*time.Second))
		}
		if i%4 == 1 {
			opts = append(opts, asynq.Deadline(time.Unix(4102444800+int64(r.IntN(1000)), 0)), asynq.Retention(time.Hour))
		}
		if i%7 == 0 {
			opts = append(opts, asynq.Unique(time.Hour))
		}
		task := asynq.NewTaskWithHeaders(fmt.Sprintf("type-%d", i), payload, headers)
		info, err := client.Enqueue(task, opts...)
		if err != nil {
			t.Fatal(err)
		}
		// Taken by a worker, as asynq's dequeue does.
		if err := c.LRem(ctx, asynqstore.Pending(q), 0, info.ID).Err(); err != nil {
			t.Fatal(err)
		}
		c.LPush(ctx, asynqstore.Active(q), info.ID)
		c.ZAdd(ctx, asynqstore.Lease(q), redisZ(info.ID))
		c.HSet(ctx, asynqstore.TaskPrefix(q)+info.ID, "state", "active")

		ours := map[string]string{"taskrl-round": fmt.Sprint(i), "taskrl-due": str(20)}
		reason := "waiting " + str(60)
		sent := reason
		if i%11 == 0 {
			sent += "\xff" // not UTF-8: asynq could not decode it
			reason += "\uFFFD"
		}
		ok, err := asynqstore.Park(ctx, c, asynqstore.Parking{Queue: q, ID: info.ID, Reason: sent, Headers: ours,
			Forward: time.Now().Add(time.Hour), PaceKey: pace, PaceAt: 0, PaceExpire: time.Now().Add(time.Hour).UnixMilli()})
		if err != nil || !ok {
			t.Fatalf("task %d: Park = %v, %v", i, ok, err)
		}
		got, err := insp.GetTaskInfo(q, info.ID)
		if err != nil {
			t.Fatalf("task %d: %v", i, err)
		}
		want := maps.Clone(headers)
		maps.DeleteFunc(want, func(k, _ string) bool { return strings.HasPrefix(k, "taskrl-") })
		maps.Copy(want, ours)
		if got.State != asynq.TaskStateScheduled || got.LastErr != reason || string(got.Payload) != string(payload) || got.Type != task.Type() ||
			!maps.Equal(got.Headers, want) || got.MaxRetry != info.MaxRetry || got.Timeout != info.Timeout || !got.Deadline.Equal(info.Deadline) ||
			got.Retention != info.Retention || got.Retried != 0 {
			t.Fatalf("task %d parked:\n got %+v\nfrom %+v\nwant headers %q", i, got, info, want)
		}
		if u, err := asynqstore.Unpark(ctx, c, asynqstore.Claim{Queue: q, PaceKey: pace, Moved: keys.Moved(prefix, q), Early: keys.Early(prefix, q), Now: -1, Most: 10, Fence: int64(time.Hour / time.Microsecond), Mine: []string{info.ID}}); err != nil || u.Moved != 1 {
			t.Fatalf("task %d: Unpark = %+v, %v", i, u, err)
		}
		back, err := insp.GetTaskInfo(q, info.ID)
		if err != nil || back.State != asynq.TaskStatePending || back.LastErr != "" || !maps.Equal(back.Headers, want) || string(back.Payload) != string(payload) {
			t.Fatalf("task %d moved back: %+v, %v", i, back, err)
		}
		if err := insp.DeleteTask(q, info.ID); err != nil {
			t.Fatal(err)
		}
	}
}

func redisZ(id string) redis.Z {
	return redis.Z{Score: float64(time.Now().Add(30 * time.Second).Unix()), Member: id}
}
