package taskrl

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// TestAdaptiveThrottle: by default a throttle teaches the task's adaptive
// rule (its learned rate is cut, once for answers that arrive together)
// and blocks only it: the per-business rule beside it is left alone; the
// learned rate is what every worker reads.
func TestAdaptiveThrottle(t *testing.T) {
	c := redistest.StartServer(t).Client(t)
	learned := quotas.Rule{Name: "vendor-learned", Limit: quotas.Adaptive{Max: 50, Min: 1, Per: time.Second}}
	perBusiness := quotas.Rule{Name: "per-business", Limit: quotas.GCRA(gcra.Limit{Rate: 20, Period: time.Second, Burst: 2})}
	m := newMiddleware(t, c,
		policy.Rule{Name: learned.Name, Match: policy.Match{Type: "job"}, Limit: learned.Limit},
		policy.Rule{Name: perBusiness.Name, Match: policy.Match{Type: "job"}, Key: "{{.b}}", Limit: perBusiness.Limit})
	sp, err := m.split(m.cfg.Policy.Bind("job", "q"))
	if err != nil {
		t.Fatal(err)
	}
	if rs := sp.throttle.Rules(); len(rs) != 1 || rs[0].Name != learned.Name || sp.horizon != adaptiveReserve {
		t.Fatalf("scope %v, horizon %v", rs, sp.horizon)
	}
	// The first three calls are answered 429 together, as calls in flight
	// at once are.
	throttles, together := make(chan struct{}, 3), make(chan struct{})
	var once sync.Once
	runWorkers(t, c, m, 1, 4, "q", func(ctx context.Context, task *asynq.Task) error {
		select {
		case throttles <- struct{}{}:
			if len(throttles) == 3 {
				once.Do(func() { close(together) })
			}
			select {
			case <-together:
			case <-time.After(5 * time.Second):
				t.Error("the three tasks did not run together")
			}
			return Throttled(time.Second, errors.New("429"))
		default:
			return nil
		}
	})
	client := asynq.NewClientFromRedisClient(c)
	for i := 0; i < 3; i++ {
		if _, err := client.Enqueue(asynq.NewTask("job", []byte(`{"b":"b1"}`)), asynq.Queue("q"), asynq.MaxRetry(0)); err != nil {
			t.Fatal(err)
		}
	}
	l, err := quotas.New(quotas.Config{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	set, err := quotas.NewSet(learned, perBusiness)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(throttles) < 3 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // the last throttle's block
	d, err := l.Status(context.Background(), set, quotas.Request{Keys: []string{"", "b1"}})
	if err != nil {
		t.Fatal(err)
	}
	// Three 429s within a second are one congestion event: 50 -> 35.
	if got := float64(time.Second) / float64(d.Rules[0].Interval); got < 34.9 || got > 35.1 {
		t.Errorf("learned rate %.2f/s after 3 throttles together, want 35/s", got)
	}
	if d.Rules[1].Remaining != 2 {
		t.Errorf("per-business was blocked: %+v", d.Rules[1])
	}
}

func TestParseAdaptive(t *testing.T) {
	p, err := policy.Parse([]byte(`
rules:
  - name: vendor-learned
    match: {type: "http:call"}
    adaptive: {max: 40, min: 1, per: 1s}
  - name: per-business-learned
    match: {type: "http:call"}
    key: "{{.business_id}}"
    adaptive: {max: 2.5, min: 0.1, start: 1, per: 1s, burst: 2}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []quotas.Limit{
		quotas.Adaptive{Max: 40, Min: 1, Per: time.Second},
		quotas.Adaptive{Max: 2.5, Min: 0.1, Start: 1, Per: time.Second, Burst: 2},
	}
	for i, r := range p.Rules() {
		if r.Limit != want[i] {
			t.Errorf("rule %s: %#v, want %#v", r.Name, r.Limit, want[i])
		}
	}
}
