package redistest

import (
	"errors"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// Queue returns an asynq queue name unique to the test, ending in tag,
// whose queue is deleted (with its tasks) when the test ends. asynq's keys
// cannot be prefixed, so tests share a server by queue name.
func Queue(t testing.TB, c redis.UniversalClient, tag string) string {
	q := strings.ReplaceAll(strings.TrimSuffix(Prefix(t), ":"), ":", "-") + "-" + tag
	t.Cleanup(func() {
		err := asynq.NewInspectorFromRedisClient(c).DeleteQueue(q, true)
		if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			t.Errorf("delete queue %s: %v", q, err)
		}
	})
	return q
}

// Pending returns every pending task of asynq queue q (none if the queue
// does not exist).
func Pending(t testing.TB, c redis.UniversalClient, q string) []*asynq.TaskInfo {
	t.Helper()
	insp := asynq.NewInspectorFromRedisClient(c)
	var all []*asynq.TaskInfo
	for page := 1; ; page++ {
		ts, err := insp.ListPendingTasks(q, asynq.PageSize(1000), asynq.Page(page))
		if errors.Is(err, asynq.ErrQueueNotFound) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, ts...)
		if len(ts) < 1000 {
			return all
		}
	}
}
