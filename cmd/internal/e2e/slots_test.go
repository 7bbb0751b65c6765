package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/testkit/fakeapi"
)

// TestKeptSlots: four worker binaries (10 slots each) share a concurrency
// rule of 32, which keeps its slots by itself (a max of 32 or more; no
// prefetch in the policy), calling an API that answers after 100 ms; one
// worker is killed with SIGKILL while it holds slots. The calls in flight
// at the API (each from its arrival for its 100 ms) never exceed 32, and
// reach 28 before the kill (the rule binds: the workers have 40 slots; a
// held slot also covers the worker's own time around the call). Once the
// killed worker's leases have ended (30 s), a second batch runs at least
// 26 at once on the three others (of their 30 slots), which 32 less what
// the dead worker held (about 8, a quarter) would not allow. Nothing is called twice, nothing is archived, and every task
// was called or still waits in asynq (those the killed worker was running
// stay active until asynq's lease gives them back).
func TestKeptSlots(t *testing.T) {
	const first, second, slots, latency, lease = 1200, 600, 32, 100 * time.Millisecond, 30 * time.Second
	policy := fmt.Sprintf(`
rules:
  - name: slots
    match: {type: "http:call"}
    concurrency: {max: %d, lease: %v}
`, slots, lease)
	// A redis-server of its own: the killed worker's tasks stay active.
	r := startOn(t, fakeapi.Limits{Latency: latency}, policy, 4, own)
	r.enqueue("--url", r.url+"/v1/charge", "--count", fmt.Sprint(first), "--businesses", "100")
	for r.api.Stats().Calls < 400 {
		time.Sleep(10 * time.Millisecond)
	}
	if err := r.workers[0].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-r.workers[0].done
	killed := time.Now()
	r.workers = r.workers[1:]
	// Up to 10 tasks the killed worker ran are not called now.
	r.waitKeys(first-10, 2*time.Minute)
	time.Sleep(time.Until(killed.Add(lease + time.Second)))
	again := time.Now()
	r.enqueue("--url", r.url+"/v1/charge", "--count", fmt.Sprint(second), "--businesses", "100")
	st := r.waitKeys(first-10+second, 2*time.Minute)
	calls := r.api.Calls()
	inFlight := func(from, to time.Time) int {
		// The most calls in flight at one moment among those arriving in
		// [from, to): a sweep over arrivals and answers.
		type edge struct {
			at time.Time
			d  int
		}
		var es []edge
		for _, c := range calls {
			if c.Status == 200 && !c.At.Before(from) && c.At.Before(to) {
				es = append(es, edge{c.At, 1}, edge{c.At.Add(latency), -1})
			}
		}
		slices.SortFunc(es, func(a, b edge) int {
			if c := a.at.Compare(b.at); c != 0 {
				return c
			}
			return a.d - b.d // an answer before an arrival at the same moment
		})
		most, n := 0, 0
		for _, e := range es {
			n += e.d
			most = max(most, n)
		}
		return most
	}
	all := inFlight(time.Time{}, time.Now())
	before := inFlight(time.Time{}, killed)
	after := inFlight(again, time.Now())
	t.Logf("API: %d calls, %d distinct keys, %d duplicates; in flight at most %d, before the kill %d, in the batch after the killed worker's leases ended %d",
		st.Calls, st.DistinctKeys, st.Duplicates, all, before, after)
	if all > slots {
		t.Errorf("%d calls in flight at once: the rule allows %d", all, slots)
	}
	if before < slots-4 {
		t.Errorf("before the kill at most %d in flight: the rule of %d did not bind", before, slots)
	}
	if after < 26 {
		t.Errorf("after the killed worker's leases ended, at most %d in flight: the three others' 30 slots were not all usable", after)
	}
	checkCalls(t, st)
	// The live workers finish; the killed worker's tasks stay active.
	var info *asynq.QueueInfo
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var err error
		if info, err = r.insp.GetQueueInfo(r.queue); err != nil {
			t.Fatal(err)
		}
		if info.Pending+info.Scheduled+info.Retry == 0 && info.Active <= 10 || time.Now().After(deadline) {
			break
		}
	}
	// A task the killed worker ran may have been called and be active.
	waiting := info.Pending + info.Scheduled + info.Active + info.Retry
	if made := r.api.Stats().DistinctKeys; made+waiting < first+second || made+waiting > first+second+10 || info.Archived != 0 {
		t.Errorf("%d called, %d waiting (%d active), %d archived: want %d called or waiting (up to 10 more for the killed worker's running tasks)", made, waiting, info.Active, info.Archived, first+second)
	}
	r.stop()
}
