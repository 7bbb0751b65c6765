package asynqstore_test

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/asynqstore"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// checkHead checks queue q's pending list, from the end asynq's workers
// take from.
func checkHead(t *testing.T, c redis.UniversalClient, q string, want ...string) {
	t.Helper()
	got := c.LRange(t.Context(), asynqstore.Pending(q), 0, -1).Val()
	slices.Reverse(got)
	if !slices.Equal(got, want) {
		t.Errorf("pending from the head %v, want %v", got, want)
	}
}

// TestAgainstAsynq enqueues tasks with the pinned asynq and reads them back
// through asynqstore's keys and Decode: an asynq that lays out its keys or
// its message differently fails here.
func TestAgainstAsynq(t *testing.T) {
	c := redistest.Client(t)
	q := redistest.Queue(t, c, "msg")
	client := asynq.NewClientFromRedisClient(c)
	deadline := time.Unix(4102444800, 0)
	tasks := []struct {
		task *asynq.Task
		opts []asynq.Option
	}{
		{asynq.NewTask("plain", []byte(`{"business_id":"b1"}`)), nil},
		{asynq.NewTaskWithHeaders("headed", []byte{0, 1, 2, 255}, map[string]string{"taskrl-round": "3", "x": ""}), []asynq.Option{asynq.Deadline(deadline), asynq.MaxRetry(0)}},
		{asynq.NewTask("empty", nil), []asynq.Option{asynq.Timeout(time.Minute), asynq.Retention(time.Hour)}},
	}
	ctx := t.Context()
	for i, tc := range tasks {
		info, err := client.Enqueue(tc.task, append(tc.opts, asynq.Queue(q))...)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := c.LRange(ctx, asynqstore.Pending(q), 0, 0).Result()
		if err != nil || len(ids) != 1 || ids[0] != info.ID {
			t.Fatalf("task %d: the newest of %s is %v (%v), want %s", i, asynqstore.Pending(q), ids, err, info.ID)
		}
		raw, err := c.HGet(ctx, asynqstore.TaskPrefix(q)+info.ID, "msg").Bytes()
		if err != nil {
			t.Fatal(err)
		}
		m, err := asynqstore.Decode(raw)
		if err != nil {
			t.Fatal(err)
		}
		if m.Type != tc.task.Type() || !bytes.Equal(m.Payload, tc.task.Payload()) || m.ID != info.ID {
			t.Errorf("task %d: decoded %q %q %q, want %q %q %q", i, m.Type, m.Payload, m.ID, tc.task.Type(), tc.task.Payload(), info.ID)
		}
		if len(m.Headers) != len(tc.task.Headers()) {
			t.Errorf("task %d: headers %v, want %v", i, m.Headers, tc.task.Headers())
		}
		for k, v := range tc.task.Headers() {
			if got, ok := m.Headers[k]; !ok || got != v {
				t.Errorf("task %d: header %q = %q, want %q", i, k, got, v)
			}
		}
		if want := info.Deadline; want.IsZero() && m.Deadline != 0 || !want.IsZero() && m.Deadline != want.Unix() {
			t.Errorf("task %d: deadline %d, want %v", i, m.Deadline, want)
		}
	}
	// A scheduled task is in the sorted set, scored in Unix seconds.
	at := time.Now().Add(time.Hour).Truncate(time.Second)
	info, err := client.Enqueue(asynq.NewTask("later", nil), asynq.Queue(q), asynq.ProcessAt(at))
	if err != nil {
		t.Fatal(err)
	}
	score, err := c.ZScore(ctx, asynqstore.Scheduled(q), info.ID).Result()
	if err != nil || int64(score) != at.Unix() {
		t.Errorf("scheduled score %v (%v), want %d", score, err, at.Unix())
	}
}

func TestDecodeBad(t *testing.T) {
	for _, b := range [][]byte{{0x0a}, {0x0a, 5, 'a'}, {0x7a, 3, 0x0a, 9, 'k'}, {0x48}, {0xff}} {
		if _, err := asynqstore.Decode(b); err == nil {
			t.Errorf("Decode(%x) = nil error", b)
		}
	}
}

// FuzzDecode: any input decodes or errs, never panics, and a message that
// decodes re-decodes the same after a trailing unknown field.
func FuzzDecode(f *testing.F) {
	f.Add([]byte{0x0a, 1, 'a', 0x12, 2, 'p', 'q', 0x48, 7})
	f.Add([]byte{0x7a, 6, 0x0a, 1, 'k', 0x12, 1, 'v'})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := asynqstore.Decode(b)
		if err != nil {
			return
		}
		m2, err := asynqstore.Decode(append(append([]byte{}, b...), 0x58, 1)) // field 11, varint
		if err != nil || m2.Type != m.Type || !bytes.Equal(m2.Payload, m.Payload) || m2.Deadline != m.Deadline || len(m2.Headers) != len(m.Headers) {
			t.Fatalf("a trailing unknown field changed %+v to %+v (%v)", m, m2, err)
		}
	})
}
