package taskrl

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// TestSetPolicy: tasks that start after SetPolicy follow the new policy,
// and a rule that keeps its name keeps its Redis state: 3 tasks use up a
// sliding window of 3 an hour, the policy raises it to 5, and exactly 2 of the
// next 4 tasks run.
func TestSetPolicy(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	window := func(n int) policy.Rule {
		return policy.Rule{Name: "hourly", Match: policy.Match{Type: "job"}, Limit: quotas.SlidingWindow{Limit: n, Every: time.Hour}}
	}
	m := newMiddleware(t, c, window(3))
	var ran atomic.Int32
	runWorkers(t, c, m, 1, 4, "q", func(context.Context, *asynq.Task) error { ran.Add(1); return nil })
	insp := asynq.NewInspectorFromRedisClient(c)
	settle := func(want int32, scheduled int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			info, err := insp.GetQueueInfo("q")
			if err == nil && ran.Load() == want && info.Pending == 0 && info.Active == 0 && info.Scheduled == scheduled {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		info, _ := insp.GetQueueInfo("q")
		t.Fatalf("ran %d (want %d), queue %+v (want %d scheduled)", ran.Load(), want, info, scheduled)
	}
	enqueueJobs(t, c, 4)
	settle(3, 1) // the 4th waits for the next window
	if err := m.SetPolicy(nil); err == nil {
		t.Fatal("SetPolicy(nil) did not fail")
	}
	raised := mustPolicy(t, window(5))
	if err := m.SetPolicy(raised); err != nil || m.Policy() != raised {
		t.Fatalf("SetPolicy: %v", err)
	}
	enqueueJobs(t, c, 4)
	settle(5, 3) // a window reset at the change would have run all 4
}
