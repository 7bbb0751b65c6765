package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/fakeapi"
	"github.com/taskrl/taskrl/internal/testkit/ideal"
)

// TestShadowRule: a per-business rule tried in shadow mode beside the
// enforced vendor rule, on three worker processes. 60 calls over 3
// businesses run as the vendor rule alone allows (within 1.05x of the
// time computed from it), and the workers report a verdict per task: no
// more would-be admissions per business than the shadow limit allows in
// that time (its burst plus its rate times the time), the rest would wait.
func TestShadowRule(t *testing.T) {
	t.Parallel() // light: runs beside the other light end-to-end tests (doc.go)
	const tasks, businesses = 60, 3
	vendor := gcra.Limit{Rate: 10, Period: time.Second, Burst: 1}
	r := start(t, fakeapi.Limits{Global: apiGlobal}, `rules:
  - name: vendor-peak
    match: {type: "http:call"}
    gcra: {rate: 10, per: 1s, burst: 1}
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    mode: shadow
    gcra: {rate: 1, per: 1s, burst: 1}
`, 3)
	begin := time.Now()
	r.enqueue("--url", r.url+"/v1/charge", "--count", fmt.Sprint(tasks), "--businesses", fmt.Sprint(businesses))
	st := r.waitKeys(tasks, time.Minute)
	begin = firstCall(t, begin, st)
	best := bestTime(begin, tasks, businesses, []ideal.Rule{{GCRA: ideal.Limit(vendor)}})
	took := st.LastOK.Sub(begin)
	admit := r.counter("taskrl_decisions_total", `outcome="would_admit"`)
	wait := r.counter("taskrl_decisions_total", `outcome="would_wait"`, `rule="per-business"`)
	most := businesses * (1 + took.Seconds()*1)
	t.Logf("%d calls in %v (the vendor rule allows %v); shadow per-business: %.0f would be admitted (at most %.1f in that time), %.0f would wait",
		st.OK, took.Round(time.Millisecond), best.Round(time.Millisecond), admit, most, wait)
	checkExact(t, st, tasks, took, best)
	if admit+wait != tasks || admit > most || admit < businesses {
		t.Errorf("shadow verdicts: %.0f would_admit, %.0f would_wait for %d tasks; at most %.1f admissions allowed", admit, wait, tasks, most)
	}
	r.stop()
}

// TestShadowOnLoad: a global rule of 1/s in shadow mode under a load of
// 20 calls a second for 5 s, on three workers: every call runs at the
// load's pace, and the workers count a would-wait for every call but the
// few the rule would have admitted (its burst plus its rate over the run).
func TestShadowOnLoad(t *testing.T) {
	t.Parallel() // light: runs beside the other light end-to-end tests (doc.go)
	r := start(t, fakeapi.Limits{}, `rules:
  - name: vendor-trial
    match: {type: "http:call"}
    mode: shadow
    gcra: {rate: 1, per: 1s, burst: 1}
`, 3)
	begin := time.Now()
	stop := r.arrive(50*time.Millisecond, func(i int) string {
		return fmt.Sprintf(`{"url": %q, "method": "POST", "business_id": "b%d"}`, r.url+"/v1/charge", i)
	})
	time.Sleep(5 * time.Second)
	stop()
	sent := time.Since(begin)
	time.Sleep(time.Second)
	at, _ := r.answered(begin, time.Now(), "")
	last := at[len(at)-1]
	admit := r.counter("taskrl_decisions_total", `outcome="would_admit"`)
	wait := r.counter("taskrl_decisions_total", `outcome="would_wait"`, `rule="vendor-trial"`)
	most := 1 + last.Sub(begin).Seconds()
	t.Logf("%d calls in %v (%.1f/s; arrivals 20/s for %v); shadow 1/s: %.0f would be admitted (at most %.1f), %.0f would wait",
		len(at), last.Sub(begin).Round(time.Millisecond), float64(len(at))/last.Sub(begin).Seconds(), sent.Round(time.Millisecond), admit, most, wait)
	if float64(len(at)) < 0.95*20*sent.Seconds() || last.Sub(begin) > sent+time.Second {
		t.Errorf("%d calls, the last %v after the first arrival: the shadow rule held calls back", len(at), last.Sub(begin))
	}
	if admit+wait != float64(len(at)) || admit > most || admit < 1 {
		t.Errorf("shadow verdicts: %.0f would_admit, %.0f would_wait for %d calls; at most %.1f admissions allowed", admit, wait, len(at), most)
	}
	r.stop()
}
