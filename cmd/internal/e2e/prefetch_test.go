package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/fakeapi"
	"github.com/taskrl/taskrl/internal/testkit/ideal"
)

// TestPrefetch: three worker binaries take a hot rule's units ahead
// (prefetch: 20ms on 400/s burst 40, so that decisions see a burst of
// 32 and a unit may be handed out up to 20 ms late) and call an API that
// answers 429 above 440/s burst 44. 1,200 tasks enqueued at once must
// each reach it exactly once, with no 429, and within 1.1x of the time the
// rule alone allows (package ideal, at its burst of 40): the rule binds
// from the first second, so batches are taken only while it has room and
// never push a span of time past the limit.
func TestPrefetch(t *testing.T) {
	const tasks = 1200
	rule := gcra.Limit{Rate: 400, Period: time.Second, Burst: 40}
	policy := fmt.Sprintf(`
rules:
  - name: hot
    match: {type: "http:call"}
    prefetch: 20ms
    gcra: {rate: %v, per: 1s, burst: %d}
`, rule.Rate, rule.Burst)
	r := start(t, fakeapi.Limits{Global: fakeapi.Limit{Rate: 440, Period: time.Second, Burst: 44}}, policy, 3)
	begin := time.Now()
	r.enqueue("--url", r.url+"/v1/charge", "--count", fmt.Sprint(tasks), "--businesses", "100")
	st := r.waitKeys(tasks, 2*time.Minute)
	begin = firstCall(t, begin, st)
	calls := make([]ideal.Call, tasks)
	for i := range calls {
		calls[i] = ideal.Call{At: begin}
	}
	best := ideal.Last(ideal.Schedule([]ideal.Rule{{GCRA: ideal.Limit(rule)}}, calls)).Sub(begin)
	took := st.LastOK.Sub(begin)
	t.Logf("API: %d calls, %d 429s, %d duplicates; busiest second %d; took %v, the rule allows %v: ratio %.3f",
		st.Calls, st.Throttled, st.Duplicates, st.BusiestSecond().OK, took.Round(time.Millisecond), best.Round(time.Millisecond), float64(took)/float64(best))
	if st.DistinctKeys != tasks || st.Calls != tasks {
		t.Errorf("want every one of %d tasks called exactly once: %d calls, %d distinct keys", tasks, st.Calls, st.DistinctKeys)
	}
	checkCalls(t, st)
	if float64(took) > 1.1*float64(best) {
		t.Errorf("took %v, more than 1.1x the %v the rule allows", took, best)
	}
	r.stop()
}

// TestPrefetchQuota: three worker binaries prefetch a quota rule, with
// prefetch: 20ms and by themselves (no prefetch in the policy: 10ms), on
// 270 per 2 s (batches of at most 8), and call an API that answers 429
// above 275 per 2 s window (both windows aligned to the Unix epoch; the 5
// over are for a call decided at a window's end that arrives in the
// next). 1,200 tasks enqueued at once must each reach it exactly once,
// with no 429 (a batch handed out after its window ended would put up to
// 8 more in the next), every full window between the first and the last
// must take at least 270 less what the three workers can hold at its end
// (3 × 8), and all by the end of the sixth window from the first call:
// the rule alone needs ceil(1200/270) = 5 counting the one of the first
// call, and one more is the slack for what is held at window ends and for
// the first window being partial.
func TestPrefetchQuota(t *testing.T) {
	for _, c := range []struct{ name, prefetch string }{{"explicit", "    prefetch: 20ms\n"}, {"automatic", ""}} {
		t.Run(c.name, func(t *testing.T) { prefetchQuota(t, c.prefetch) })
	}
}

func prefetchQuota(t *testing.T, prefetch string) {
	const tasks, limit, every = 1200, 270, 2 * time.Second
	policy := fmt.Sprintf(`
rules:
  - name: quota
    match: {type: "http:call"}
%s    quota: {limit: %d, every: %v}
`, prefetch, limit, every)
	r := start(t, fakeapi.Limits{Quota: fakeapi.Quota{Limit: 275, Every: every}}, policy, 3)
	begin := time.Now()
	r.enqueue("--url", r.url+"/v1/charge", "--count", fmt.Sprint(tasks), "--businesses", "100")
	st := r.waitKeys(tasks, 2*time.Minute)
	begin = firstCall(t, begin, st)
	window := func(at time.Time) int64 { return at.UnixNano() / int64(every) }
	perWindow := map[int64]int{}
	for _, s := range st.PerSecond {
		perWindow[window(s.Start)-window(begin)] += s.OK
	}
	used := window(st.LastOK) - window(begin) + 1
	t.Logf("API: %d calls, %d 429s, %d duplicates; %d windows from the first call (the rule alone: %d); 2xx per window %v",
		st.Calls, st.Throttled, st.Duplicates, used, (tasks+limit-1)/limit, perWindow)
	if st.DistinctKeys != tasks || st.Calls != tasks {
		t.Errorf("want every one of %d tasks called exactly once: %d calls, %d distinct keys", tasks, st.Calls, st.DistinctKeys)
	}
	checkCalls(t, st)
	for w := int64(1); w < used-1; w++ {
		if perWindow[w] < limit-3*8 {
			t.Errorf("window %d took %d calls; the rule allows %d, less at most %d held at its end", w, perWindow[w], limit, 3*8)
		}
	}
	if want := int64((tasks+limit-1)/limit + 1); used > want {
		t.Errorf("the calls took %d windows; the rule alone needs %d, %d with the slack", used, want-1, want)
	}
	r.stop()
}
