package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/testkit/fakeapi"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// costPolicy is a points rule of 30 units a second, burst 30, each task
// charging its payload's units (issue 16, item 4).
const costPolicy = `
rules:
  - name: points
    match: {type: "http:call"}
    cost: "{{.units}}"
    gcra: {rate: 30, per: 1s, burst: 30}
`

// pointsAPI is the API's points limit: the policy's, with one task's worth
// of burst (3 units, 100ms at 30/s) more for the jitter between a slot
// and the call's arrival.
var pointsAPI = fakeapi.Limit{Rate: 30, Period: time.Second, Burst: 33}

// costPayload is an http:call payload of units units that asks the API
// for as many points.
func costPayload(url string, i, units int) string {
	return fmt.Sprintf(`{"url": %q, "business_id": "b%d", "units": %d, "headers": {"X-Cost": "%d"}}`, url+"/v1/points", i%10+1, units, units)
}

// TestCostPerTask: 100 tasks of units 3 under a 30/s rule (burst 30) with
// cost "{{.units}}", on 3 worker processes, run at 10 tasks a second: the
// first 10 at once (the burst), then one per 100ms, so the run takes
// (100·3 − 30)/30 = 9 s from the first call (within 1.10x, and never
// less), and no span d of the API's arrivals holds more than (30 + 30·d)/3
// tasks (one more for the jitter the API's burst allows); the API, which
// charges each call its X-Cost, answers none 429. A task of units 40,
// above the burst, is archived with a reason naming the rule, the cost and
// the burst, and never called.
func TestCostPerTask(t *testing.T) {
	t.Parallel() // light: runs beside the other light end-to-end tests (doc.go)
	const tasks, units = 100, 3
	r := start(t, fakeapi.Limits{Points: pointsAPI}, costPolicy, 3)
	var lines []string
	for i := 0; i < tasks; i++ {
		lines = append(lines, costPayload(r.url, i, units))
		if i == tasks/2 {
			lines = append(lines, costPayload(r.url, i, 40))
		}
	}
	file := filepath.Join(t.TempDir(), "payloads.jsonl")
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.enqueue("--payload-file", file)
	st := r.waitKeys(tasks, time.Minute)
	took := st.LastOK.Sub(st.FirstOK)
	best := time.Duration(tasks*units-30) * time.Second / 30
	var at []time.Time
	for _, c := range r.api.Calls() {
		if c.Status == 200 {
			at = append(at, c.At)
		}
	}
	// The densest span: tasks beyond what (30 + 30·d)/3 allows.
	over, busiest := 0.0, 0
	for i := range at {
		n := 0
		for j := i; j < len(at); j++ {
			d := at[j].Sub(at[i]).Seconds()
			over = max(over, float64(j-i+1)-(30+30*d)/units)
			if d < 1 {
				n++
			}
		}
		busiest = max(busiest, n)
	}
	t.Logf("%d calls, %d 429s; busiest second %d tasks (GCRA allows %d); the densest span held %.2f tasks more than (30+30d)/3; took %v from the first call, the limits allow %v: ratio %.3f",
		st.Calls, st.Throttled, busiest, (30+30)/units, over, took.Round(time.Millisecond), best, float64(took)/float64(best))
	if st.DistinctKeys != tasks || st.Calls != tasks {
		t.Errorf("want every one of %d tasks of cost 3 called exactly once, and the one of cost 40 never: %d calls, %d distinct keys", tasks, st.Calls, st.DistinctKeys)
	}
	checkCalls(t, st)
	if over > 1 {
		t.Errorf("a span held %.2f tasks more than (30+30d)/3 (one allowed for jitter)", over)
	}
	if took < best-100*time.Millisecond || float64(took) > 1.10*float64(best) {
		t.Errorf("took %v; the limits allow no less than %v, and 1.10x of it at most was expected", took, best)
	}
	archived, err := r.insp.ListArchivedTasks(r.queue)
	if err != nil {
		t.Fatal(err)
	}
	want := `taskrl: rule "points": cost 40 is above the rule's burst of 30: the task can never pass`
	if len(archived) != 1 || !strings.HasPrefix(archived[0].LastErr, want) || archived[0].Retried != 0 {
		for _, a := range archived {
			t.Logf("archived %s after %d retries: %s", a.Payload, a.Retried, a.LastErr)
		}
		t.Errorf("want the task of units 40 archived, never retried, with %q", want)
	} else {
		t.Logf("archived: %s", archived[0].LastErr)
	}
	r.stop()
}

// TestSettleActualCost: the same rule, with the settle header
// X-Actual-Cost (http.settle_headers), and an API that answers each call
// of 3 points with an actual cost of 1 (and gives it the 2 back). 60 tasks of units 3 arrive one every 50ms
// (20 a second: 60 units a second at the estimate, twice the rule's 30).
// On the estimate alone the last call could come no sooner than
// (60·3 − 30)/30 = 5 s after the first; settled at 1, each task's net
// charge is 1 unit, 20 a second, and the tasks run as they arrive: the
// run must end well before those 5 s (under 4.5 s; the arrivals
// themselves take 2.95 s), with no 429 from the API and a settle per task.
func TestSettleActualCost(t *testing.T) {
	t.Parallel() // light: runs beside the other light end-to-end tests (doc.go)
	const tasks, units = 60, 3
	policy := "http: {settle_headers: [{rule: points, header: X-Actual-Cost}]}\n" + costPolicy
	r := start(t, fakeapi.Limits{Points: pointsAPI, ActualCost: func(int) int { return 1 }}, policy, 3, "--task-check-interval", "50ms")
	client := asynq.NewClientFromRedisClient(redistest.Client(t))
	begin := time.Now()
	for i := 0; i < tasks; i++ {
		time.Sleep(time.Until(begin.Add(time.Duration(i) * 50 * time.Millisecond)))
		if _, err := client.Enqueue(asynq.NewTask("http:call", []byte(costPayload(r.url, i, units))), asynq.Queue(r.queue), asynq.MaxRetry(0)); err != nil {
			t.Fatal(err)
		}
	}
	st := r.waitKeys(tasks, 30*time.Second)
	took := st.LastOK.Sub(st.FirstOK)
	estimate := time.Duration(tasks*units-30) * time.Second / 30
	// Each task settles once its handler has read the answer.
	settled := 0.0
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if settled = r.counter("taskrl_decisions_total", `outcome="settled"`); settled >= tasks {
			break
		}
	}
	t.Logf("%d calls, %d 429s; took %v from the first call; on the estimate alone the limits allow no less than %v; %v settles",
		st.Calls, st.Throttled, took.Round(time.Millisecond), estimate, settled)
	if st.DistinctKeys != tasks || st.Calls != tasks {
		t.Errorf("want every one of %d tasks called exactly once: %d calls, %d distinct keys", tasks, st.Calls, st.DistinctKeys)
	}
	checkCalls(t, st)
	if took > estimate-500*time.Millisecond {
		t.Errorf("took %v: settling at 1 should end the run well before the %v the estimate alone allows", took, estimate)
	}
	if settled != tasks {
		t.Errorf("%v settles, want one per task, %d", settled, tasks)
	}
	r.stop()
}
