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
	calls := r.api.Calls()
	for _, c := range calls {
		if at, ok := sent[c.Key]; ok && c.Status == 200 && strings.HasPrefix(c.Key, "p5-") {
			t.Errorf("the priority-5 task %s started %v after its enqueue, ahead of the backlog", c.Key, c.At.Sub(at))
		}
	}
	startedWithin(t, calls, sent, "p1-", urgent, fmt.Sprintf("priority-1 tasks behind %d priority-5 ones", backlog))
	checkCalls(t, r.api.Stats())
	r.stop()
	if _, info := r.accounted(backlog+2*urgent, 0); info.Archived != 0 {
		t.Errorf("archived %d", info.Archived)
	}
}

// TestPrioritySlots: three worker binaries (asynq looking at idle queues
// every 100 ms) share a concurrency cap of 6 whose tasks take their level
// from their asynq queue: bulk (level 5, asynq weight 1) and urgent
// (level 1, weight 6), aging 10 s (the default), calling an API that
// answers after 500 ms. Bulk enqueues 200 calls (17 s of the cap); 2 s
// later, one a second, four urgent tasks arrive. Every urgent task must
// start (its call reach the API) within 1 s of its enqueue: the slot that
// frees next is its, ahead of the bulk tasks waiting in the workers
// (without priority, 2 of 4 had not started within the test). Then 72
// urgent tasks arrive at once (6 s of the cap): from 1 s after the first
// of their calls to the last, the slots stay in use (calls start at 90 %
// of the cap's 12/s at least) and go to urgent: no bulk task has waited
// 4 agings, so by the aging rule none goes first, and bulk makes at most
// 10 % of the calls (a level's wait is seen when its tasks ask, so a slot
// may go to bulk while no urgent task has asked for a moment; when two
// slots freed at once could go to bulk, it made 13 of 85). The calls in
// flight never exceed 6; no call is made twice and none answers 429;
// every bulk task is called or still waiting in asynq, none archived.
func TestPrioritySlots(t *testing.T) {
	t.Parallel() // light: runs beside the other light end-to-end tests (doc.go)
	const bulk, urgent, flood, latency = 200, 4, 72, 500 * time.Millisecond
	// A redis-server of the run's own: its queues' names are known before
	// the workers start.
	const bulkQ, urgentQ = "e2e", "urgent"
	policy := fmt.Sprintf(`
rules:
  - name: smtp
    match: {type: "http:call"}
    priority: {queues: {%s: 5, %s: 1}}
    concurrency: {max: 6, lease: 30s}
`, bulkQ, urgentQ)
	r := startOn(t, fakeapi.Limits{Latency: latency}, policy, 3, own, "--task-check-interval", "100ms", "--queues", bulkQ+"=1,"+urgentQ+"=6")
	line := fmt.Sprintf(`{"url": %q, "method": "POST", "business_id": "b1"}`, r.url+"/v1/charge")
	file := filepath.Join(t.TempDir(), "bulk.jsonl")
	if err := os.WriteFile(file, []byte(strings.Repeat(line+"\n", bulk)), 0o644); err != nil {
		t.Fatal(err)
	}
	r.enqueue("--payload-file", file)
	time.Sleep(2 * time.Second)
	client := asynq.NewClientFromRedisClient(r.client)
	send := func(id string) {
		payload := fmt.Sprintf(`{"url": %q, "method": "POST", "business_id": "u"}`, r.url+"/v1/charge")
		if _, err := client.Enqueue(asynq.NewTask("http:call", []byte(payload)), asynq.Queue(urgentQ), asynq.MaxRetry(0), asynq.TaskID(id)); err != nil {
			t.Fatal(err)
		}
	}
	sent := map[string]time.Time{}
	for i := range urgent {
		id := fmt.Sprintf("urgent-%d", i)
		sent[id] = time.Now()
		send(id)
		time.Sleep(time.Second)
	}
	for i := range flood {
		send(fmt.Sprintf("flood-%d", i))
	}
	var calls []fakeapi.Call
	var first, last time.Time // the flood's first and last calls
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		calls, first, last = r.api.Calls(), time.Time{}, time.Time{}
		n := 0
		for _, c := range calls {
			if strings.HasPrefix(c.Key, "flood-") && c.Status == 200 {
				n++
				if first.IsZero() || c.At.Before(first) {
					first = c.At
				}
				if c.At.After(last) {
					last = c.At
				}
			}
		}
		if n == flood {
			break
		}
	}
	startedWithin(t, calls, sent, "urgent-", urgent, fmt.Sprintf("urgent tasks beside %d bulk ones waiting for 6 slots", bulk))
	from := first.Add(time.Second)
	span := last.Sub(from)
	nb, nu := 0, 0
	for _, c := range calls {
		if c.Status == 200 && !c.At.Before(from) && !c.At.After(last) {
			if c.Business == "b1" {
				nb++
			} else {
				nu++
			}
		}
	}
	t.Logf("during the flood's %v: bulk made %d calls, urgent %d", span.Round(time.Millisecond), nb, nu)
	if nb*10 > nb+nu {
		t.Errorf("bulk made %d of %d calls in %v of the urgent flood: over 10%%", nb, nb+nu, span.Round(time.Millisecond))
	}
	if rate := float64(nb+nu) / span.Seconds(); rate < 0.9*12 {
		t.Errorf("%.1f calls a second started during the flood: the cap allows 12", rate)
	}
	if most := mostInFlight(calls, latency, time.Time{}, time.Now()); most > 6 {
		t.Errorf("%d calls in flight at once; the rule allows 6", most)
	}
	checkCalls(t, r.api.Stats())
	r.stop()
	if _, info := r.accounted(bulk, 0); info.Archived != 0 {
		t.Errorf("archived %d", info.Archived)
	}
}

// startedWithin requires the n tasks sent whose IDs start with prefix to
// have started (their calls answered 2xx) within 1 s of their enqueue
// (sent: ID -> when), and logs after how long, as what's.
func startedWithin(t *testing.T, calls []fakeapi.Call, sent map[string]time.Time, prefix string, n int, what string) {
	t.Helper()
	var lat []time.Duration
	for _, c := range calls {
		if at, ok := sent[c.Key]; ok && c.Status == 200 && strings.HasPrefix(c.Key, prefix) {
			lat = append(lat, c.At.Sub(at))
		}
	}
	slices.Sort(lat)
	t.Logf("%s started after %v", what, lat)
	if len(lat) != n {
		t.Errorf("%d of %d of the %s started", len(lat), n, what)
	} else if lat[n-1] > time.Second {
		t.Errorf("one of the %s started %v after its enqueue, over 1 s", what, lat[n-1])
	}
}
