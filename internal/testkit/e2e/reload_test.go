package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/examples/fakeapi"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// peakPolicy is one global GCRA rule of rate/s, burst 1.
func peakPolicy(rate string) string {
	return `rules:
  - name: vendor-peak
    match: {type: "http:call"}
    gcra: {rate: ` + rate + `, per: 1s, burst: 1}
`
}

// TestReload: three workers run calls arriving at 8/s under a policy of
// 12/s. A policy file that does not validate is refused by every worker,
// on change and on SIGHUP, counted in taskrl_policy_reloads_total, and the
// running policy stays (the calls keep their pace). Then the file lowers
// the rule to 3/s: from 2 s after the change no second of calls at the API
// holds more than the new limit allows (3 + its burst of 1), and the calls
// go on at that rate. The change is written as deploy tools do, by
// renaming a new file over the old.
func TestReload(t *testing.T) {
	r := start(t, fakeapi.Limits{Global: apiGlobal}, peakPolicy("12"), 3)
	write := func(policy string) time.Time {
		t.Helper()
		tmp := filepath.Join(filepath.Dir(r.policy), "new.yaml")
		if err := os.WriteFile(tmp, []byte(policy), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, r.policy); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	reloads := func(result string, want float64) {
		t.Helper()
		for i := range r.workers {
			sub := &run{t: t, workers: r.workers[i : i+1]}
			if got := sub.counter("taskrl_policy_reloads_total", `result="`+result+`"`); got != want {
				t.Errorf("worker %d: %v reloads with result %s, want %v:\n%s", i, got, result, want, r.workers[i].logs.String())
			}
		}
	}

	client := asynq.NewClientFromRedisClient(redistest.Client(t))
	begin := time.Now()
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for i := 0; ; i++ {
			payload := fmt.Sprintf(`{"url": %q, "method": "POST", "business_id": "b%d"}`, r.url+"/v1/charge", i)
			if _, err := client.Enqueue(asynq.NewTask("http:call", []byte(payload)), asynq.Queue(r.queue), asynq.MaxRetry(0)); err != nil {
				t.Error(err)
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Until(begin.Add(time.Duration(i+1) * 125 * time.Millisecond))):
			}
		}
	}()
	defer func() { close(stop); <-stopped }()

	time.Sleep(3 * time.Second)
	write(strings.Replace(peakPolicy("12"), "burst: 1", "burst: 0", 1))
	time.Sleep(2500 * time.Millisecond)
	reloads("error", 1)
	for _, w := range r.workers {
		if err := w.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	reloads("error", 2)
	reloads("ok", 0)
	for i, w := range r.workers {
		if logs := w.logs.String(); !strings.Contains(logs, "policy reload refused; keeping the running policy") || !strings.Contains(logs, "line 4") || !strings.Contains(logs, "gcra.burst") {
			t.Errorf("worker %d did not log the refused file's errors:\n%s", i, logs)
		}
	}
	changed := write(peakPolicy("3"))
	time.Sleep(8 * time.Second)
	reloads("ok", 1)

	var before, after []time.Time
	for _, c := range r.api.Calls() {
		switch {
		case c.Status != 200:
		case c.At.After(begin.Add(time.Second)) && c.At.Before(changed):
			before = append(before, c.At)
		case c.At.After(changed.Add(2 * time.Second)):
			after = append(after, c.At)
		}
	}
	checkCalls(t, r.api.Stats())
	span := changed.Sub(begin.Add(time.Second)).Seconds()
	busiest := 0
	for i := range after {
		n := 0
		for j := i; j < len(after) && after[j].Sub(after[i]) < time.Second; j++ {
			n++
		}
		busiest = max(busiest, n)
	}
	rateAfter := float64(len(after)) / time.Since(changed.Add(2*time.Second)).Seconds()
	t.Logf("before the change: %d calls in %.1f s (%.1f/s, arrivals 8/s, limit 12/s); from 2 s after it: %d calls, %.2f/s, busiest second %d (limit 3/s burst 1)",
		len(before), span, float64(len(before))/span, len(after), rateAfter, busiest)
	if float64(len(before)) < 0.8*8*span {
		t.Errorf("before the change (and while a bad file was refused) only %d calls in %.1f s: the 12/s policy did not hold", len(before), span)
	}
	if busiest > 4 {
		t.Errorf("%d calls in one second from 2 s after the limit went to 3/s burst 1", busiest)
	}
	if rateAfter < 0.8*3 {
		t.Errorf("%.2f calls/s after the change, under 80%% of the new limit", rateAfter)
	}
	r.stop()
}
