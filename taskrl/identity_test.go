package taskrl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// identityEnv is what TestWaitingKeepsIdentity hands each worker process.
type identityEnv struct {
	Addr, Queue, Prefix string
}

// identitySpacing is the per-business rule's interval: each business's
// first task runs at once, the others wait 5, 10 and 15 s.
const identitySpacing = 5 * time.Second

// TestWaitingKeepsIdentity is issue 26's table with real asynq servers in 3
// worker processes: 32 tasks of 8 businesses under a per-business rule of
// one task per 5 s, enqueued with TaskID and MaxRetry(0), with Unique,
// with Retention and one retry that a first run spends on a failure, or
// plain. 2.5 s later, while 24 of them wait (one per business has run),
// the producer finds each by
// the ID Enqueue returned (scheduled, the rule and the moment in LastErr),
// enqueues each again (every one refused: ErrTaskIDConflict or
// ErrDuplicateTask) and cancels 6 by ID. Then one worker is killed with
// SIGKILL and Redis restarted (AOF) while they are parked. Every other
// task runs exactly once under its own ID, at its business's pace; none
// is archived; the cancelled ones never run; asynq's processed and failed
// counters count the real runs and the real failures only; and no worker
// logs asynq's complaint about the tasks it made wait.
func TestWaitingKeepsIdentity(t *testing.T) {
	if os.Getenv("TASKRL_IDENTITY") != "" {
		identityWorker(t)
		return
	}
	if testing.Short() {
		t.Skip("spawns processes, restarts Redis")
	}
	srv := redistest.StartServer(t, "--appendonly", "yes", "--appendfsync", "always")
	c := srv.Client(t)
	env := identityEnv{Addr: srv.Addr(), Queue: "identity", Prefix: redistest.Prefix(t)}
	b, _ := json.Marshal(env)
	type worker struct {
		cmd *exec.Cmd
		out *strings.Builder
	}
	workers := make([]worker, 3)
	for i := range workers {
		var out strings.Builder
		cmd := redistest.Child("TestWaitingKeepsIdentity", "TASKRL_IDENTITY="+string(b))
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		workers[i] = worker{cmd, &out}
	}
	defer func() {
		for _, w := range workers {
			_ = w.cmd.Process.Kill()
		}
	}()
	ctx := context.Background()
	for deadline := time.Now().Add(30 * time.Second); c.SCard(ctx, env.Prefix+"up").Val() < 3; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("workers did not start")
		}
	}

	client := asynq.NewClientFromRedisClient(c)
	insp := asynq.NewInspectorFromRedisClient(c)
	type task struct {
		n       int
		id      string
		payload []byte
		kind    int // 0 TaskID+MaxRetry(0), 1 Unique, 2 Retention+one retry spent, 3 plain TaskID
	}
	opts := func(tk task) []asynq.Option {
		o := []asynq.Option{asynq.Queue(env.Queue)}
		switch tk.kind {
		case 0:
			o = append(o, asynq.TaskID(tk.id), asynq.MaxRetry(0))
		case 1:
			o = append(o, asynq.Unique(10*time.Minute))
		case 2:
			o = append(o, asynq.TaskID(tk.id), asynq.Retention(time.Hour), asynq.MaxRetry(1))
		case 3:
			o = append(o, asynq.TaskID(tk.id))
		}
		return o
	}
	var tasks []task
	begin := time.Now()
	for n := range 32 {
		tk := task{n: n, id: fmt.Sprintf("identity-%d", n), kind: n / 8}
		tk.payload, _ = json.Marshal(map[string]any{"b": fmt.Sprintf("b%d", n%8), "n": n, "fail": tk.kind == 2})
		info, err := client.Enqueue(asynq.NewTask("call", tk.payload), opts(tk)...)
		if err != nil {
			t.Fatal(err)
		}
		tk.id = info.ID
		tasks = append(tasks, tk)
	}

	// The producer, 2.5 s later.
	time.Sleep(2500*time.Millisecond - time.Since(begin))
	var waiting []task
	ran := map[int]int{} // per business, tasks done at 2.5 s
	for _, tk := range tasks {
		info, err := insp.GetTaskInfo(env.Queue, tk.id)
		if errors.Is(err, asynq.ErrTaskNotFound) {
			// One task per business ran at once: whichever the
			// workers decided first (usually the first enqueued).
			if ran[tk.n%8]++; ran[tk.n%8] > 1 {
				t.Errorf("business b%d: %d tasks done at 2.5 s; the rule allows one", tk.n%8, ran[tk.n%8])
			}
			continue
		}
		if err != nil {
			t.Fatalf("task %d (%s): %v", tk.n, tk.id, err)
		}
		if info.State != asynq.TaskStateScheduled || !strings.Contains(info.LastErr, `taskrl: waiting for rule "per-business": booked for `) {
			t.Errorf("waiting task %d (%s): state %v, LastErr %q", tk.n, tk.id, info.State, info.LastErr)
		}
		if info.Retried != 0 && tk.kind != 2 || info.MaxRetry != map[int]int{0: 0, 1: 25, 2: 1, 3: 25}[tk.kind] {
			t.Errorf("waiting task %d: retried %d of %d", tk.n, info.Retried, info.MaxRetry)
		}
		waiting = append(waiting, tk)
	}
	// 24, or 25 when a business's first decided task was one that fails
	// once: its retry waits for the slot its failed run took.
	if len(waiting) < 24 || len(waiting) > 25 {
		t.Errorf("%d tasks waiting at 2.5 s, want 24 (or 25)", len(waiting))
	}
	accepted := 0
	cancelled := map[string]bool{}
	for i, tk := range waiting {
		_, err := client.Enqueue(asynq.NewTask("call", tk.payload), opts(tk)...)
		want := asynq.ErrTaskIDConflict
		if tk.kind == 1 {
			want = asynq.ErrDuplicateTask
		}
		if !errors.Is(err, want) {
			accepted++
			t.Errorf("second enqueue of waiting task %d: %v, want %v", tk.n, err, want)
		}
		if i%4 == 1 {
			if err := insp.DeleteTask(env.Queue, tk.id); err != nil {
				t.Errorf("DeleteTask(%s) = %v", tk.id, err)
			}
			cancelled[tk.id] = true
		}
	}
	t.Logf("at %v: %d tasks waiting, %d second enqueues accepted, %d cancelled", time.Since(begin).Round(time.Millisecond), len(waiting), accepted, len(cancelled))

	// A worker killed, and Redis restarted, while they are parked.
	_ = workers[0].cmd.Process.Signal(syscall.SIGKILL)
	_ = workers[0].cmd.Wait()
	srv.Stop(t)
	srv.Start(t)
	t.Logf("at %v: worker 0 killed, Redis restarted", time.Since(begin).Round(time.Millisecond))

	want := len(tasks) - len(cancelled)
	deadline := time.Now().Add(time.Minute)
	for c.LLen(ctx, env.Prefix+"ok").Val() < int64(want) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("at %v: %d runs", time.Since(begin).Round(time.Millisecond), c.LLen(ctx, env.Prefix+"ok").Val())
	time.Sleep(500 * time.Millisecond) // a second run would come now
	c.Set(ctx, env.Prefix+"stop", 1, time.Minute)
	for i, w := range workers[1:] {
		if err := w.cmd.Wait(); err != nil {
			t.Errorf("worker %d: %v\n%s", i+1, err, w.out.String())
		}
	}
	t.Logf("at %v: workers stopped", time.Since(begin).Round(time.Millisecond))
	for i, w := range workers {
		if strings.Contains(w.out.String(), "NOT FOUND") {
			t.Errorf("worker %d logged asynq's complaint about a waiting task:\n%s", i, w.out.String())
		}
	}

	ok := map[string][]int64{}
	fails := 0
	for _, e := range c.LRange(ctx, env.Prefix+"ok", 0, -1).Val() {
		f := strings.Fields(e)
		us, _ := strconv.ParseInt(f[1], 10, 64)
		ok[f[0]] = append(ok[f[0]], us)
	}
	fails = int(c.LLen(ctx, env.Prefix+"failed").Val())
	twice := 0
	for _, tk := range tasks {
		switch n := len(ok[tk.id]); {
		case cancelled[tk.id] && n > 0:
			t.Errorf("cancelled task %d ran %d times", tk.n, n)
		case !cancelled[tk.id] && n != 1:
			t.Errorf("task %d (%s) ran %d times", tk.n, tk.id, n)
			if n > 1 {
				twice++
			}
		}
	}
	if len(ok) != want {
		t.Errorf("%d task IDs ran, want %d (no ID but the producer's)", len(ok), want)
	}
	// Each business's runs at least 6 s apart (less the clocks' jitter).
	for bz := range 8 {
		var at []int64
		for _, tk := range tasks {
			if tk.n%8 == bz && len(ok[tk.id]) == 1 {
				at = append(at, ok[tk.id][0])
			}
		}
		slices.Sort(at)
		var rel []string
		for _, a := range at {
			rel = append(rel, time.UnixMicro(a).Sub(begin).Round(10*time.Millisecond).String())
		}
		t.Logf("business b%d ran at %v", bz, rel)
		for i := 1; i < len(at); i++ {
			if gap := time.Duration(at[i]-at[i-1]) * time.Microsecond; gap < identitySpacing-50*time.Millisecond {
				t.Errorf("business b%d: two runs %v apart; the rule allows one per %v", bz, gap, identitySpacing)
			}
		}
	}
	qi, err := insp.GetQueueInfo(env.Queue)
	if err != nil {
		t.Fatal(err)
	}
	runs := want + fails
	t.Logf("%d runs (%d twice), %d real failures; asynq: processed %d, failed %d, archived %d, completed %d", runs, twice, fails, qi.Processed, qi.Failed, qi.Archived, qi.Completed)
	if qi.Processed != runs || qi.Failed != fails || qi.Archived != 0 {
		t.Errorf("asynq counted processed %d, failed %d, archived %d; want %d, %d, 0", qi.Processed, qi.Failed, qi.Archived, runs, fails)
	}
	wantFails := 0
	for _, tk := range tasks {
		if tk.kind == 2 && !cancelled[tk.id] {
			wantFails++
		}
	}
	if want := wantFails; fails != want {
		t.Errorf("%d real failures, want %d (the first run of each task that fails once, less those cancelled)", fails, want)
	}
	for _, tk := range tasks {
		if tk.kind != 2 || cancelled[tk.id] {
			continue
		}
		info, err := insp.GetTaskInfo(env.Queue, tk.id)
		if err != nil || info.State != asynq.TaskStateCompleted || info.Retried != 1 || info.LastErr != "first run fails" || len(info.Headers) != 0 {
			t.Errorf("task %d with Retention: %+v, %v; want completed, retried once, its own error, no headers", tk.n, info, err)
		}
	}
}

// identityWorker is one worker process of TestWaitingKeepsIdentity: an
// asynq server with the middleware whose handler logs each run, and fails
// the first run of a task whose payload says so.
func identityWorker(t *testing.T) {
	var env identityEnv
	if err := json.Unmarshal([]byte(os.Getenv("TASKRL_IDENTITY")), &env); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: env.Addr})
	policy := mustPolicy(t, policy.Rule{Name: "per-business", Match: policy.Match{Type: "call"}, Key: "{{.b}}",
		Limit: quotas.GCRA(gcra.Limit{Rate: 1, Period: identitySpacing, Burst: 1})})
	m, err := New(Config{Policy: policy, Client: c, Prefix: env.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	srv := asynq.NewServerFromRedisClient(c, m.ServerConfig(asynq.Config{
		Concurrency: 8, Queues: map[string]int{env.Queue: 1}, LogLevel: asynq.WarnLevel,
		DelayedTaskCheckInterval: 200 * time.Millisecond,
		RetryDelayFunc:           func(int, error, *asynq.Task) time.Duration { return 100 * time.Millisecond },
	}))
	mux := asynq.NewServeMux()
	mux.Use(m.Handler)
	mux.HandleFunc("call", func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		var p struct{ Fail bool }
		_ = json.Unmarshal(task.Payload(), &p)
		if n, _ := asynq.GetRetryCount(ctx); p.Fail && n == 0 {
			c.RPush(context.WithoutCancel(ctx), env.Prefix+"failed", id)
			return errors.New("first run fails")
		}
		return c.RPush(context.WithoutCancel(ctx), env.Prefix+"ok", fmt.Sprintf("%s %d", id, time.Now().UnixMicro())).Err()
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	c.SAdd(context.Background(), env.Prefix+"up", os.Getpid())
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if c.Exists(context.Background(), env.Prefix+"stop").Val() == 1 {
			break
		}
	}
	srv.Shutdown()
	m.Close()
}
