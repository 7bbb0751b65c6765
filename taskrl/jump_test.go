package taskrl

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// TestJumpWatch on explicit times: a server clock that keeps pace with the
// local one, with round trips of up to 200 ms, answers out of order and a
// slow call of 3 s, is no jump; one that steps forward 5 s or back 30 s
// is, by about that much, reported once (the new clock is the reference
// from then on).
func TestJumpWatch(t *testing.T) {
	var w jumpWatch
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	skew := 3 * time.Hour // the server's clock is 3 h ahead: no matter
	call := func(sent time.Duration, rtt, serverAt time.Duration) time.Duration {
		return w.see(t0.Add(skew+serverAt), t0.Add(sent), t0.Add(sent+rtt))
	}
	steps := []struct {
		sent, rtt, serverAt time.Duration // serverAt: when the server read TIME, on the local clock
		want                time.Duration
	}{
		{0, 2 * time.Millisecond, time.Millisecond, 0},
		{time.Second, 200 * time.Millisecond, time.Second + 100*time.Millisecond, 0},
		{2 * time.Second, 3 * time.Second, 4 * time.Second, 0},                            // slow: TIME read 2 s into it
		{3 * time.Second, 900 * time.Millisecond, 3*time.Second + 10*time.Millisecond, 0}, // answered late: no jump
		{10 * time.Second, time.Millisecond, 15 * time.Second, 5 * time.Second},           // stepped forward 5 s
		{11 * time.Second, time.Millisecond, 16 * time.Second, 0},                         // the new clock
		{12 * time.Second, time.Millisecond, -13 * time.Second, -30 * time.Second},        // back 30 s
		{13 * time.Second, time.Millisecond, -12 * time.Second, 0},
	}
	for i, s := range steps {
		got := call(s.sent, s.rtt, s.serverAt)
		if (s.want == 0) != (got == 0) || got != 0 && (got-s.want > 300*time.Millisecond || s.want-got > 300*time.Millisecond) {
			t.Errorf("step %d: jump %v, want %v", i+1, got, s.want)
		}
	}
}

// shiftClock is the wall clock moved by a shift the test sets.
type shiftClock struct{ shift atomic.Int64 }

func (c *shiftClock) Now() time.Time { return time.Now().Add(time.Duration(c.shift.Load())) }

// TestClockJumpEvents: a middleware deciding against a real redis-server
// reports a ClockJump event when the two clocks move apart by 10 s
// between decisions (here the worker's clock, as a failover to a server
// whose clock differs would look), once per jump, with its size and sign,
// and none while they keep pace.
func TestClockJumpEvents(t *testing.T) {
	srv := redistest.StartServer(t)
	p, err := policy.New(policy.Rule{Name: "rate", Match: policy.Match{Type: "job"}, Limit: quotas.GCRA{Rate: 1000, Period: time.Second, Burst: 100}})
	if err != nil {
		t.Fatal(err)
	}
	clock := &shiftClock{}
	var mu sync.Mutex
	var jumps []time.Duration
	m, err := New(Config{Policy: p, Client: srv.Client(t), Clock: clock, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Observer: ObserverFunc(func(e Event) {
			if e.Outcome == ClockJump {
				mu.Lock()
				jumps = append(jumps, e.Wait)
				mu.Unlock()
			}
		})})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	h := m.Handler(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))
	run := func(n int) {
		for i := 0; i < n; i++ {
			if err := h.ProcessTask(context.Background(), asynq.NewTask("job", nil)); err != nil {
				t.Fatal(err)
			}
		}
	}
	seen := func() []time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(jumps)
	}
	run(5)
	if j := seen(); len(j) != 0 {
		t.Fatalf("jumps while the clocks keep pace: %v", j)
	}
	clock.shift.Store(int64(10 * time.Second)) // the server now looks 10 s behind
	run(5)
	clock.shift.Store(0) // and 10 s ahead again
	run(5)
	j := seen()
	if len(j) != 2 || j[0] > -9*time.Second || j[0] < -11*time.Second || j[1] < 9*time.Second || j[1] > 11*time.Second {
		t.Errorf("jumps %v, want one of about -10s and one of about +10s", j)
	}
}
