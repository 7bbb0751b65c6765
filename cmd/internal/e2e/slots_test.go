package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
	inFlight := func(from, to time.Time) int { return mostInFlight(calls, latency, from, to) }
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

// fairSlotsPolicy shares 12 slots among the businesses with tasks waiting,
// by the weight in their payloads.
const fairSlotsPolicy = `
rules:
  - name: vendor-slots
    match: {type: "http:call"}
    fair: {key: "{{.business_id}}", weight: "{{.weight}}"}
    concurrency: {max: 12, lease: 30s}
`

// TestFairSlots: three worker binaries (10 slots each) share a fair
// concurrency rule of 12 slots by weight, calling an API that answers
// after 500 ms. Business big (weight 1) enqueues 360 calls; 2 s later s1
// (weight 2) and s2 (weight 1) enqueue 90 and 60, behind big's in the
// queue. Alone, big holds at least 8 of the 12 slots on average over the
// last second. The others make their first call within 3 s of their
// enqueue, behind big's backlog (the scout, docs/design.md 1.5). Over the
// 4 s from 2 s after that call, each holds about its share, computed from
// the max and the weights alone (3, 6 and 3): big 0.6-1.75x, s1 and s2 at
// least 0.55x each, the three together at least 9.5. From 1 s after the
// others' last call (for up to 3 s while big calls), big holds at least 8
// of the 12 again: its tasks crowded out come back. At most 30 Redis
// scripts run per task. A rule that is not fair gave big 10.3 of 12 and
// the others 0.85 each (with equal weights): 3.4x of big's share here,
// 0.14x and 0.28x of the others'. Measured in 13 runs: first call
// 0.22-1.02 s after the others came; big 0.86-1.24x, s1 0.73-1.01x, s2
// 0.80-1.14x, together 10.2-11.9; big after the others 9.1-11.9 of 12;
// 12.8-16.6 scripts per task. Without the scout and the pulls (7a3ebe7,
// same session): first call 8.6 s, big after the others 5.2, 11.1
// scripts per task; in sixteen earlier runs 0.97-1.14x, 0.85-1.02x and
// 0.86-1.02x, and one CI run 1.52x, 0.72x and 0.64x. The calls in flight
// never exceed 12; every call is made once, and none answers 429.
func TestFairSlots(t *testing.T) {
	weight := map[string]int{"big": 1, "s1": 2, "s2": 1}
	// Alone: the small flows' tasks ask too seldom beside other tests'
	// load (docs/design.md, fair concurrency).
	const latency = 500 * time.Millisecond
	r := start(t, fakeapi.Limits{Latency: latency}, fairSlotsPolicy, 3)
	payloads := func(name string, n int, businesses ...string) string {
		var b strings.Builder
		for i := range n {
			biz := businesses[i%len(businesses)]
			fmt.Fprintf(&b, "{\"url\": %q, \"method\": \"POST\", \"business_id\": %q, \"weight\": %d}\n", r.url+"/v1/charge", biz, weight[biz])
		}
		file := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return file
	}
	// scripts counts the scripts the Redis server ran (no other test runs
	// meanwhile).
	scripts := func() (n int) {
		info := r.client.Info(context.Background(), "commandstats").Val()
		for _, l := range strings.Split(info, "\n") {
			if strings.HasPrefix(l, "cmdstat_evalsha:") || strings.HasPrefix(l, "cmdstat_eval:") {
				var c int
				fmt.Sscanf(l[strings.Index(l, "calls=")+6:], "%d", &c)
				n += c
			}
		}
		return n
	}
	scripts0 := scripts()
	r.enqueue("--payload-file", payloads("big.jsonl", 360, "big"))
	time.Sleep(2 * time.Second)
	came := time.Now()
	r.enqueue("--payload-file", payloads("small.jsonl", 150, "s1", "s1", "s1", "s2", "s2"))
	st := r.waitKeys(510, 2*time.Minute)
	calls := r.api.Calls()
	// held is each business's calls in flight at the API on average over
	// [from, to): each call from its arrival for latency.
	held := func(from, to time.Time) map[string]float64 {
		out := map[string]float64{}
		for _, c := range calls {
			if c.Status != 200 {
				continue
			}
			s, e := c.At, c.At.Add(latency)
			if s.Before(from) {
				s = from
			}
			if e.After(to) {
				e = to
			}
			if e.After(s) {
				out[c.Business] += float64(e.Sub(s)) / float64(to.Sub(from))
			}
		}
		return out
	}
	before := held(came.Add(-time.Second), came)
	t.Logf("before the others: big held %.2f slots", before["big"])
	if before["big"] < 8 {
		t.Errorf("alone, big held %.2f of 12 slots on average", before["big"])
	}
	var asked, done, bigDone time.Time // the first and the last call of the others, big's last
	for _, c := range calls {
		switch {
		case c.Business == "big":
			bigDone = later(bigDone, c.At)
		case asked.IsZero() || c.At.Before(asked):
			asked = c.At
			fallthrough
		default:
			done = later(done, c.At)
		}
	}
	t.Logf("the others made their first call %v after they came", asked.Sub(came).Round(time.Millisecond))
	if asked.Sub(came) > 3*time.Second {
		t.Errorf("the others made their first call %v after they came, behind big's backlog (bar 3 s)", asked.Sub(came).Round(time.Millisecond))
	}
	// Once the others are done, big's tasks crowded out come back: from 1 s
	// after their last call, for up to 3 s while big calls.
	if from, to := done.Add(time.Second), done.Add(4*time.Second); bigDone.Sub(from) >= time.Second {
		to = earlier(to, bigDone)
		after := held(from, to)["big"]
		t.Logf("from 1 s after the others' last call, for %v: big held %.2f slots", to.Sub(from).Round(time.Millisecond), after)
		if after < 8 {
			t.Errorf("from 1 s after the others' last call, big held %.2f of 12 slots: its tasks crowded out came back late", after)
		}
	} else {
		t.Logf("big's last call came %v after the others'", bigDone.Sub(done).Round(time.Millisecond))
	}
	perTask := float64(scripts()-scripts0) / 510
	t.Logf("Redis scripts per task: %.1f", perTask)
	if perTask > 30 {
		t.Errorf("%.1f Redis scripts per task (bar 30)", perTask)
	}
	shared := held(asked.Add(2*time.Second), asked.Add(6*time.Second))
	sum := 0
	for _, w := range weight {
		sum += w
	}
	inUse := 0.0
	for _, b := range slices.Sorted(maps.Keys(weight)) {
		share := 12 * float64(weight[b]) / float64(sum) // the max and the weights alone
		t.Logf("from 2 s after their first call: %s held %.2f slots (share %.0f, %.2fx)", b, shared[b], share, shared[b]/share)
		inUse += shared[b]
		switch {
		case b == "big" && (shared[b] > 1.75*share || shared[b] < 0.6*share):
			t.Errorf("big held %.2f slots on average while the others asked: its share is %.0f (bars 0.6-1.75x)", shared[b], share)
		case b != "big" && shared[b] < 0.55*share:
			t.Errorf("%s held %.2f slots on average: its share is %.0f (bar 0.55x)", b, shared[b], share)
		}
	}
	if inUse < 9.5 {
		t.Errorf("%.2f of 12 slots in use on average while all asked", inUse)
	}
	most := mostInFlight(calls, latency, time.Time{}, time.Now())
	if most > 12 {
		t.Errorf("%d calls in flight at once; the rule allows 12", most)
	}
	checkCalls(t, st)
	r.stop()
}

// mostInFlight is the most calls in flight at one moment among the
// answered calls arriving in [from, to), each from its arrival for
// latency: a sweep over arrivals and answers.
func mostInFlight(calls []fakeapi.Call, latency time.Duration, from, to time.Time) int {
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

// TestFairSlotsManySmall: issue 29's shape. Three worker binaries share a
// fair concurrency rule of 20 slots, calling an API that answers after
// 500 ms. One business enqueues 500 calls; 2 s later 200 businesses
// enqueue one call each, behind them. Round robin among the businesses
// with tasks waiting gives the 200 nearly every slot that frees: the
// ideal, from the limits alone, is 200 calls on 20 slots of 500 ms, 5 s.
// The last of the 200 must call within twice that from their enqueue, the
// first within 3 s. Measured (3 runs): first 0.16-0.40 s, half by
// 2.7-2.9 s, last 5.2-5.4 s (1.04-1.09x the ideal), the big business 7-19
// calls meanwhile; without the scout and the pulls (7a3ebe7, one run),
// first 9.6 s, last 15.2 s (3.0x), the big business 404 calls meanwhile. The calls in flight never exceed 20; every call is made once.
func TestFairSlotsManySmall(t *testing.T) {
	const latency, slots = 500 * time.Millisecond, 20
	r := start(t, fakeapi.Limits{Latency: latency}, `
rules:
  - name: vendor-slots
    match: {type: "http:call"}
    fair: {key: "{{.business_id}}"}
    concurrency: {max: 20, lease: 30s}
`, 3)
	payloads := func(name string, businesses []string) string {
		var b strings.Builder
		for _, biz := range businesses {
			fmt.Fprintf(&b, "{\"url\": %q, \"method\": \"POST\", \"business_id\": %q}\n", r.url+"/v1/charge", biz)
		}
		file := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return file
	}
	r.enqueue("--payload-file", payloads("big.jsonl", slices.Repeat([]string{"big"}, 500)))
	time.Sleep(2 * time.Second)
	var small []string
	for i := range 200 {
		small = append(small, fmt.Sprintf("s%03d", i))
	}
	came := time.Now()
	r.enqueue("--payload-file", payloads("small.jsonl", small))
	st := r.waitKeys(700, 3*time.Minute)
	calls := r.api.Calls()
	var waits []time.Duration
	var last time.Time
	for _, c := range calls {
		if c.Business != "big" {
			waits = append(waits, c.At.Sub(came))
			last = later(last, c.At)
		}
	}
	big := 0
	for _, c := range calls {
		if c.Business == "big" && c.At.After(came) && c.At.Before(last) {
			big++
		}
	}
	slices.Sort(waits)
	ideal := time.Duration(len(small)) * latency / slots // the limits alone
	t.Logf("the 200 businesses' calls from their enqueue: first %v, half by %v, last %v (ideal %v); the big business's calls meanwhile: %d",
		waits[0].Round(time.Millisecond), waits[len(waits)/2].Round(time.Millisecond), waits[len(waits)-1].Round(time.Millisecond), ideal, big)
	if waits[0] > 3*time.Second {
		t.Errorf("the first of the 200 called %v after they came, behind the big business's backlog (bar 3 s)", waits[0].Round(time.Millisecond))
	}
	if waits[len(waits)-1] > 2*ideal {
		t.Errorf("the last of the 200 called %v after they came: more than twice the ideal %v", waits[len(waits)-1].Round(time.Millisecond), ideal)
	}
	if most := mostInFlight(calls, latency, time.Time{}, time.Now()); most > slots {
		t.Errorf("%d calls in flight at once; the rule allows %d", most, slots)
	}
	checkCalls(t, st)
	r.stop()
}
