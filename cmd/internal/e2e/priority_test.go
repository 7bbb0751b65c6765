package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/testkit/fakeapi"
)

// priorityPolicy orders each business's tasks by the payload's priority
// under its rate of 10/s (the acceptance contract's form).
const priorityPolicy = `
rules:
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    priority: "{{.priority}}"
    gcra: {rate: 10, per: 1s}
`

// TestPriority: three worker binaries (asynq looking at idle queues every
// 100 ms) take 10,000 priority-5 tasks of business b1, enqueued at once:
// 1,000 s of its rate of 10/s, booked or set aside. Then, one every 1.5 s,
// four priority-1 tasks of b1 arrive, each beside a priority-5 task of b1
// enqueued at the same moment. Every priority-1 task must start (its call
// reach the API) within 1 s of its enqueue; every priority-5 one must not
// start at all during the test (it is behind the backlog). The API, at
// b1's 10/s burst 2, answers no 429, no call is made twice, and every task
// is called or still waiting in asynq, none archived: the bookings the
// priority-1 tasks took over were decided again, not lost.
func TestPriority(t *testing.T) {
	const backlog, urgent = 10000, 4
	r := start(t, fakeapi.Limits{Global: fakeapi.Limit{Rate: 100, Period: time.Second, Burst: 10}, PerBusiness: fakeapi.Limit{Rate: 10, Period: time.Second, Burst: 2}},
		priorityPolicy, 3, "--task-check-interval", "100ms")
	line := fmt.Sprintf(`{"url": %q, "method": "POST", "business_id": "b1", "priority": 5}`, r.url+"/v1/charge")
	file := filepath.Join(t.TempDir(), "backlog.jsonl")
	if err := os.WriteFile(file, []byte(strings.Repeat(line+"\n", backlog)), 0o644); err != nil {
		t.Fatal(err)
	}
	r.enqueue("--payload-file", file)
	// The backlog waits once the workers have taken it from the queue.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		info, err := r.insp.GetQueueInfo(r.queue)
		if err != nil {
			t.Fatal(err)
		}
		if info.Pending < 50 {
			t.Logf("backlog waiting: pending %d, scheduled %d, active %d", info.Pending, info.Scheduled, info.Active)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the backlog still pends after 30 s: pending %d, scheduled %d", info.Pending, info.Scheduled)
		}
	}
	client := asynq.NewClientFromRedisClient(r.client)
	sent := map[string]time.Time{}
	for i := range urgent {
		for _, p := range []int{1, 5} {
			id := fmt.Sprintf("p%d-%d", p, i)
			payload := fmt.Sprintf(`{"url": %q, "method": "POST", "business_id": "b1", "priority": %d}`, r.url+"/v1/charge", p)
			sent[id] = time.Now()
			if _, err := client.Enqueue(asynq.NewTask("http:call", []byte(payload)), asynq.Queue(r.queue), asynq.MaxRetry(0), asynq.TaskID(id)); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(1500 * time.Millisecond)
	}
	time.Sleep(time.Second)
	var lat []time.Duration
	for _, c := range r.api.Calls() {
		at, ok := sent[c.Key]
		switch {
		case !ok || c.Status != 200:
		case strings.HasPrefix(c.Key, "p5-"):
			t.Errorf("the priority-5 task %s started %v after its enqueue, ahead of the backlog", c.Key, c.At.Sub(at))
		default:
			lat = append(lat, c.At.Sub(at))
		}
	}
	slices.Sort(lat)
	t.Logf("priority-1 tasks behind %d priority-5 ones started after %v", backlog, lat)
	if len(lat) != urgent {
		t.Errorf("%d of %d priority-1 tasks started", len(lat), urgent)
	} else if lat[urgent-1] > time.Second {
		t.Errorf("a priority-1 task started %v after its enqueue, over 1 s", lat[urgent-1])
	}
	checkCalls(t, r.api.Stats())
	r.stop()
	if _, info := r.accounted(backlog+2*urgent, 0); info.Archived != 0 {
		t.Errorf("archived %d", info.Archived)
	}
}
