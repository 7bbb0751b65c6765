package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/cmd/internal/campaign"
)

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// processHandle is a started enqueue process.
type processHandle struct {
	cmd  *exec.Cmd
	once sync.Once
	err  error
}

// terminate sends SIGTERM and waits for the process; it must exit 0.
func (p *processHandle) terminate() error {
	p.once.Do(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- p.cmd.Wait() }()
		select {
		case p.err = <-done:
		case <-time.After(20 * time.Second):
			p.cmd.Process.Kill()
			p.err = errors.New("did not exit within 20s of SIGTERM")
			<-done
		}
	})
	return p.err
}

// kill ends the process if terminate was not called (a failed test).
func (p *processHandle) kill() {
	p.once.Do(func() {
		p.cmd.Process.Kill()
		p.cmd.Wait()
	})
}

// worker is an asynq server running the fan-out handler and recording the
// campaign tasks it runs.
type worker struct {
	rdb redis.UniversalClient
	q   string
	srv *asynq.Server

	mu     sync.Mutex
	ticks  map[string]map[string]int // tick -> task index -> runs
	fanned map[string]int            // tick -> fan-outs that fanned out
	dups   int
}

func startWorker(t *testing.T, rdb redis.UniversalClient, q string) *worker {
	w := &worker{rdb: rdb, q: q, ticks: map[string]map[string]int{}, fanned: map[string]int{}}
	mux := asynq.NewServeMux()
	mux.Handle(campaign.TypeFanout, campaign.NewFanoutHandler(rdb, campaign.WithLogger(slog.New(&outcomeLog{w: w}))))
	mux.HandleFunc("http:call", func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		// ID: campaign ":" tick ":" index.
		parts := strings.Split(id, ":")
		if len(parts) != 3 {
			return fmt.Errorf("unexpected task ID %q: %w", id, asynq.SkipRetry)
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.ticks[parts[1]] == nil {
			w.ticks[parts[1]] = map[string]int{}
		}
		w.ticks[parts[1]][parts[2]]++
		return nil
	})
	w.srv = asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Queues:            map[string]int{q: 1},
		Concurrency:       8,
		TaskCheckInterval: 20 * time.Millisecond,
		ShutdownTimeout:   time.Second,
		LogLevel:          asynq.FatalLevel,
	})
	if err := w.srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.srv.Shutdown)
	return w
}

// waitTicks waits until n ticks have been fanned out and at least one
// duplicate fan-out refused, or 3n ticks (then the test's checks say what
// went wrong).
func (w *worker) waitTicks(t *testing.T, n int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for {
		w.mu.Lock()
		got, dups := len(w.fanned), w.dups
		w.mu.Unlock()
		if got >= n && dups > 0 || got >= 3*n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d ticks fanned out and %d duplicates refused within %s", got, n, dups, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// drain waits until the queue is empty and nothing runs.
func (w *worker) drain(t *testing.T) {
	insp := asynq.NewInspectorFromRedisClient(w.rdb)
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := insp.GetQueueInfo(w.q)
		if err == nil && info.Pending+info.Active+info.Scheduled+info.Retry == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue not drained: %+v, %v", info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	w.srv.Shutdown()
	if ts, _ := insp.ListArchivedTasks(w.q); len(ts) > 0 {
		t.Errorf("%d tasks archived, e.g. %s: %s", len(ts), ts[0].ID, ts[0].LastErr)
	}
}

func (w *worker) results() map[string]map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ticks
}

func (w *worker) outcomes() (fanned map[string]int, dups int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fanned, w.dups
}

// outcomeLog is the fan-out handler's logger: it counts outcomes per tick.
type outcomeLog struct {
	w     *worker
	attrs []slog.Attr
}

func (l *outcomeLog) Enabled(context.Context, slog.Level) bool { return true }

func (l *outcomeLog) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{}
	for _, a := range l.attrs {
		m[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	l.w.mu.Lock()
	defer l.w.mu.Unlock()
	switch m["outcome"] {
	case "fanned_out":
		l.w.fanned[m["tick_unix"]]++
	case "duplicate":
		l.w.dups++
	}
	return nil
}

func (l *outcomeLog) WithAttrs(as []slog.Attr) slog.Handler {
	return &outcomeLog{w: l.w, attrs: append(append([]slog.Attr(nil), l.attrs...), as...)}
}

func (l *outcomeLog) WithGroup(string) slog.Handler { return l }
