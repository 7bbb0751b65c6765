package taskrl

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// fakeClock is a Clock the test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestFailLocalShares: with a real redis-server stopped mid-run and the
// policy failing local, each process enforces its share of a fixed window
// and of a concurrency rule in memory, on Config.Clock: 6 per hour over 2
// processes is 3 per hour here, 2 slots over 2 processes is 1.
func TestFailLocalShares(t *testing.T) {
	srv := redistest.StartServer(t)
	p, err := policy.New(
		policy.Rule{Name: "hourly", Match: policy.Match{Type: "job"}, Limit: quotas.FixedWindow{Limit: 6, Every: time.Hour}},
		policy.Rule{Name: "slots", Match: policy.Match{Type: "slow"}, Limit: quotas.Concurrency{Max: 2, Lease: time.Minute}},
	)
	if err != nil {
		t.Fatal(err)
	}
	if p, err = p.WithFailureMode(policy.FailLocal); err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{t: time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)}
	m, err := New(Config{Policy: p, Client: srv.Client(t), LocalShare: 2, Clock: clock, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var ran atomic.Int32
	release := make(chan struct{})
	h := m.Handler(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		ran.Add(1)
		if task.Type() == "slow" {
			<-release
		}
		return nil
	}))
	// One task while Redis is up, then Redis goes away.
	if err := h.ProcessTask(context.Background(), asynq.NewTask("job", nil)); err != nil || ran.Load() != 1 {
		t.Fatalf("with Redis: ran %d, %v", ran.Load(), err)
	}
	srv.Stop(t)
	run := func(typ string, d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return h.ProcessTask(ctx, asynq.NewTask(typ, nil))
	}
	ran.Store(0)
	for i := 0; i < 3; i++ {
		if err := run("job", 5*time.Second); err != nil {
			t.Fatalf("task %d of this process's 3 per hour: %v", i, err)
		}
	}
	// The fourth waits for the next hour, past its deadline: not run.
	if err := run("job", 300*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) || ran.Load() != 3 {
		t.Fatalf("fourth task in the hour: ran %d, err %v", ran.Load(), err)
	}
	clock.Add(time.Hour)
	if err := run("job", 5*time.Second); err != nil || ran.Load() != 4 {
		t.Fatalf("next hour: ran %d, err %v", ran.Load(), err)
	}

	// One local slot of the two: a second slow task waits for the first.
	first := make(chan error, 1)
	go func() { first <- run("slow", 20*time.Second) }()
	for end := time.Now().Add(10 * time.Second); ran.Load() != 5; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the first slow task did not start: ran %d", ran.Load())
		}
	}
	if err := run("slow", 500*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) || ran.Load() != 5 {
		t.Fatalf("second slow task while the first holds the slot: ran %d, err %v", ran.Load(), err)
	}
	second := make(chan error, 1)
	go func() { second <- run("slow", 20*time.Second) }()
	time.Sleep(200 * time.Millisecond)
	if ran.Load() != 5 {
		t.Fatal("a second slow task ran beside the first")
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil || ran.Load() != 6 {
		t.Fatalf("after the first released its slot: ran %d, err %v", ran.Load(), err)
	}
}
