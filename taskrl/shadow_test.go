package taskrl

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

func TestParseShadow(t *testing.T) {
	p, err := policy.Parse([]byte("rules:\n  - name: a\n    match: {type: job}\n    mode: shadow\n    gcra: {rate: 1, per: 1s}\n  - name: b\n    match: {type: job}\n    mode: enforce\n    gcra: {rate: 1, per: 1s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if rs := p.Rules(); !rs[0].Shadow || rs[1].Shadow {
		t.Fatalf("rules %+v", rs)
	}
	_, err = policy.Parse([]byte("rules:\n  - name: a\n    match: {type: job}\n    mode: dry\n    gcra: {rate: 1, per: 1s}\n"))
	if err == nil || !strings.Contains(err.Error(), `line 4: rule "a": mode: must be enforce or shadow, got "dry"`) {
		t.Fatalf("got %v", err)
	}
}

// TestShadow runs 12 tasks, 4 at a time for 300 ms each, under a shadow
// rate of 3 an hour and a shadow concurrency of 2 beside an enforced
// sliding window of 100 an hour: every task runs at once (none is
// rescheduled), the shadow verdicts are reported (3 would be admitted,
// the others would wait, named by rule), the enforced window counts all
// 12, and the shadow slots are all given back. Config.Shadow makes the
// enforced rule a shadow one too.
func TestShadow(t *testing.T) {
	rate := policy.Rule{Name: "rate", Match: policy.Match{Type: "job"}, Shadow: true, Limit: quotas.GCRA(gcra.Limit{Rate: 3, Period: time.Hour, Burst: 3})}
	slots := policy.Rule{Name: "slots", Match: policy.Match{Type: "job"}, Shadow: true, Limit: quotas.Concurrency{Max: 2, Lease: time.Minute}}
	window := policy.Rule{Name: "window", Match: policy.Match{Type: "job"}, Limit: quotas.SlidingWindow{Limit: 100, Every: time.Hour}}
	for _, all := range []bool{false, true} {
		srv := redistest.StartServer(t)
		c := srv.Client(t)
		var mu sync.Mutex
		outcomes := map[Outcome]int{}
		waitRules := map[string]int{}
		m, err := New(Config{Policy: mustPolicy(t, rate, slots, window), Client: c, Shadow: all, Observer: ObserverFunc(func(e Event) {
			mu.Lock()
			defer mu.Unlock()
			outcomes[e.Outcome]++
			if e.Outcome == WouldWait {
				waitRules[e.Rule]++
				if e.Wait <= 0 {
					t.Errorf("would wait %v", e.Wait)
				}
			}
		})})
		if err != nil {
			t.Fatal(err)
		}
		var ran atomic.Int32
		runWorkers(t, c, m, 1, 4, "q", func(context.Context, *asynq.Task) error {
			time.Sleep(300 * time.Millisecond)
			ran.Add(1)
			return nil
		})
		start := time.Now()
		enqueueJobs(t, c, 12)
		for ran.Load() < 12 && time.Since(start) < 20*time.Second {
			time.Sleep(10 * time.Millisecond)
		}
		took := time.Since(start)
		mu.Lock()
		t.Logf("shadow everything %v: 12 tasks in %v; outcomes %v; would wait by rule %v", all, took.Round(time.Millisecond), outcomes, waitRules)
		wantAdmitted := 12
		if all {
			wantAdmitted = 0 // no rule is enforced: nothing to admit
		}
		if ran.Load() != 12 || outcomes[Rescheduled] != 0 || outcomes[Admitted] != wantAdmitted {
			t.Errorf("ran %d, outcomes %v", ran.Load(), outcomes)
		}
		if outcomes[WouldAdmit] != 3 || outcomes[WouldWait] != 9 || waitRules["rate"] == 0 || waitRules["slots"] == 0 {
			t.Errorf("shadow verdicts %v by rule %v; want 3 would_admit, 9 would_wait over both rules", outcomes, waitRules)
		}
		mu.Unlock()
		// 3 rounds of 4 tasks at 300 ms: nothing waited.
		if took > 5*time.Second {
			t.Errorf("12 tasks took %v", took)
		}
		st, err := m.limiter.Status(context.Background(), bindSet(t, mustPolicy(t, rate, slots, window).Bind("job", "q")), quotas.Request{Keys: []string{"", "", ""}, Holder: "status"})
		if err != nil {
			t.Fatal(err)
		}
		wantWindow := 12
		if all {
			wantWindow = 3 // a shadow rule counts what it would have admitted
		}
		if st.Rules[0].Used != 3 || st.Rules[1].Used != 0 || st.Rules[2].Used != wantWindow {
			t.Errorf("used: rate %d (want 3), slots %d (want 0), window %d (want %d)", st.Rules[0].Used, st.Rules[1].Used, st.Rules[2].Used, wantWindow)
		}
	}
}
