package taskrl

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// TestScout: in a queue of 300 tasks of business big under a fair
// concurrency rule, with the tasks of s1 (3) and s2 (60) behind them (and
// a task no rule governs, and a booked one of s3), a look for big's flow
// moves s1's and the oldest scoutPerFlow of s2's to the head of the
// pending list, in their order, and nothing else; a second look finds nothing new; a task of s3
// enqueued later is moved by the next look. No task is lost or doubled. On
// Redis Cluster too, in a queue whose name holds braces.
func TestScout(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		c := redistest.Client(t)
		testScout(t, c, redistest.Queue(t, c, "scout"))
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.Cluster(t)
		testScout(t, c, redistest.Queue(t, c, "a}b{c"))
	})
}

func testScout(t *testing.T, c redis.UniversalClient, q string) {
	p := mustPolicy(t, policy.Rule{Name: "slots", Match: policy.Match{Type: "call"}, Fair: "{{.b}}", Limit: quotas.Concurrency{Max: 2, Lease: 30 * time.Second}})
	m, err := New(Config{Policy: p, Client: c, Prefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	client := asynq.NewClientFromRedisClient(c)
	enqueue := func(task *asynq.Task) string {
		info, err := client.Enqueue(task, asynq.Queue(q))
		if err != nil {
			t.Fatal(err)
		}
		return info.ID
	}
	call := func(b string) *asynq.Task { return asynq.NewTask("call", fmt.Appendf(nil, `{"b":%q}`, b)) }
	var all []string // oldest first
	ids := map[string][]string{}
	add := func(b string, n int) {
		for range n {
			id := enqueue(call(b))
			all = append(all, id)
			ids[b] = append(ids[b], id)
		}
	}
	add("big", 300)
	add("s1", 1)
	all = append(all, enqueue(asynq.NewTask("other", nil)))
	add("s2", scoutPerFlow+10)
	add("s1", 2)
	all = append(all, enqueue(asynq.NewTaskWithHeaders("call", []byte(`{"b":"s3"}`), map[string]string{HeaderBooked: "1"})))
	pending := func() []string { return pendingFromHead(t, c, q) }
	look := func(want ...string) {
		t.Helper()
		if err := m.scout.look(scoutKey{q, "slots"}, "big"); err != nil {
			t.Fatal(err)
		}
		got := pending()
		if !slices.Equal(got[:len(want)], want) || len(got) != len(all) {
			t.Errorf("pending from the head %v... (%d), want %v... (%d)", got[:len(want)+1], len(got), want, len(all))
		}
		rest := slices.DeleteFunc(slices.Clone(all), func(id string) bool { return slices.Contains(want, id) })
		if !slices.Equal(got[len(want):], rest) {
			t.Errorf("the tasks behind those moved are not in their order")
		}
		all = got
	}
	want := append(append([]string{ids["s1"][0]}, ids["s2"][:scoutPerFlow]...), ids["s1"][1:]...)
	look(want...)
	look(ids["s1"][0]) // nothing new: the head as it was
	add("s3", 1)
	look(ids["s3"][0])
}
