package taskrl

import (
	"context"
	"io"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// TestRedisRestartMidRun runs a real asynq server with the middleware while
// its Redis (the limits' and asynq's own) is stopped for 2 s mid-run and
// restarted with its data. In every policy mode every task runs, none is
// archived or failed, half of them having MaxRetry(0). Fail closed keeps
// the rate limit all along; fail local keeps it but for the second around
// the switch back, when the local and the shared allowance may add up. Fail
// open may run what was waiting at once when Redis fails.
func TestRedisRestartMidRun(t *testing.T) {
	if testing.Short() {
		t.Skip("stops and restarts Redis")
	}
	// Light (10 tasks a second), each mode on a server of its own: beside
	// the package's other light tests.
	t.Parallel()
	const tasks, rate, burst = 40, 10, 1
	for _, mode := range []policy.FailureMode{policy.FailClosed, policy.FailLocal, policy.FailOpen} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			srv := redistest.StartServer(t, "--appendonly", "yes", "--appendfsync", "always")
			c := srv.Client(t)
			p, err := mustPolicy(t, policy.Rule{Name: "rate", Match: policy.Match{Type: "job"}, Limit: quotas.GCRA(gcra.Limit{Rate: rate, Period: time.Second, Burst: burst})}).WithFailureMode(mode)
			if err != nil {
				t.Fatal(err)
			}
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			m, err := New(Config{Policy: p, Client: c, Prefix: redistest.Prefix(t), Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			queue := "restart-" + string(mode)
			client := asynq.NewClientFromRedisClient(c)
			for i := 0; i < tasks; i++ {
				opts := []asynq.Option{asynq.Queue(queue)}
				if i%2 == 0 {
					opts = append(opts, asynq.MaxRetry(0))
				}
				if _, err := client.Enqueue(asynq.NewTask("job", []byte(strconv.Itoa(i))), opts...); err != nil {
					t.Fatal(err)
				}
			}
			var mu sync.Mutex
			runs := map[string]int{}
			var at []time.Time
			mux := asynq.NewServeMux()
			mux.Use(m.Handler)
			mux.HandleFunc("job", func(ctx context.Context, task *asynq.Task) error {
				mu.Lock()
				runs[string(task.Payload())]++
				at = append(at, time.Now())
				mu.Unlock()
				return nil
			})
			as := asynq.NewServerFromRedisClient(c, m.ServerConfig(asynq.Config{
				Concurrency: 10,
				Queues:      map[string]int{queue: 1},
				Logger:      discardLogger{},
				LogLevel:    asynq.FatalLevel,
			}))
			if err := as.Start(mux); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			time.Sleep(1500 * time.Millisecond)
			down := time.Now()
			srv.Stop(t)
			time.Sleep(2 * time.Second)
			srv.Start(t)
			up := time.Now()
			ran := func() int {
				mu.Lock()
				defer mu.Unlock()
				return len(runs)
			}
			for deadline := time.Now().Add(45 * time.Second); ran() < tasks && time.Now().Before(deadline); {
				time.Sleep(100 * time.Millisecond)
			}
			// Let asynq record the last completions before looking.
			time.Sleep(1500 * time.Millisecond)
			as.Shutdown()
			m.Close()

			mu.Lock()
			defer mu.Unlock()
			dups, during := 0, 0
			for i := 0; i < tasks; i++ {
				switch n := runs[strconv.Itoa(i)]; {
				case n == 0:
					t.Errorf("task %d never ran", i)
				case n > 1:
					dups++
				}
			}
			sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
			worst := 0
			for i := range at {
				n := 0
				for j := i; j < len(at) && at[j].Sub(at[i]) < time.Second; j++ {
					n++
				}
				worst = max(worst, n)
				if at[i].After(down) && at[i].Before(up) {
					during++
				}
			}
			info, err := asynq.NewInspectorFromRedisClient(c).GetQueueInfo(queue)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d executions of %d tasks (%d ran twice) in %v; %d while Redis was down; busiest second %d (limit %d + burst %d); archived %d, failed %d, retry %d",
				mode, len(at), tasks, dups, at[len(at)-1].Sub(start).Round(time.Millisecond), during, worst, rate, burst, info.Archived, info.Failed, info.Retry)
			if info.Archived != 0 || info.Failed != 0 || info.Retry != 0 {
				t.Errorf("archived %d, failed %d, retry %d", info.Archived, info.Failed, info.Retry)
			}
			// Handler timestamps jitter by a few ms around their slots, so
			// slots 1 s apart can land in one second: allow one extra. Fail
			// local: around the switch back to Redis, one second may see
			// this process's local allowance and the shared one.
			bound := map[policy.FailureMode]int{policy.FailClosed: rate + burst + 1, policy.FailLocal: 2*(rate+burst) + 1, policy.FailOpen: tasks}[mode]
			if worst > bound {
				t.Errorf("%d executions within one second; the bound in mode %s is %d", worst, mode, bound)
			}
		})
	}
}

// discardLogger silences asynq, which logs every failed poll while Redis is
// down.
type discardLogger struct{}

func (discardLogger) Debug(...any) {}
func (discardLogger) Info(...any)  {}
func (discardLogger) Warn(...any)  {}
func (discardLogger) Error(...any) {}
func (discardLogger) Fatal(...any) {}
