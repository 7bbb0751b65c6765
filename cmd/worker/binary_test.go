package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// buildWorker builds the worker binary (see buildBinaries).
func buildWorker(t *testing.T) string {
	t.Helper()
	return buildBinaries(t, ".")[0]
}

// workerAndEnqueue builds both binaries (see buildBinaries), skipping the
// test in -short mode.
func workerAndEnqueue(t *testing.T) (worker, enqueue string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	bins := buildBinaries(t, ".", "../enqueue")
	return bins[0], bins[1]
}

// built caches the binaries buildBinaries built, by package directory, in
// one directory for the whole test binary (removed by TestMain).
var built struct {
	sync.Mutex
	dir  string
	bins map[string]string
}

// buildBinaries builds the commands in the package directories pkgs (".",
// "../enqueue") once per test binary, with the race detector when the
// tests have it, and returns their paths in the same order.
func buildBinaries(t *testing.T, pkgs ...string) []string {
	t.Helper()
	built.Lock()
	defer built.Unlock()
	if built.dir == "" {
		dir, err := os.MkdirTemp("", "taskrl-worker-test-")
		if err != nil {
			t.Fatal(err)
		}
		built.dir, built.bins = dir, map[string]string{}
	}
	var missing []string
	for _, pkg := range pkgs {
		if built.bins[pkg] == "" {
			missing = append(missing, pkg)
		}
	}
	if len(missing) > 0 {
		args := []string{"build", "-o", built.dir + string(filepath.Separator)}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, missing...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		for _, pkg := range missing {
			name := filepath.Base(pkg)
			if pkg == "." {
				name = "worker"
			}
			built.bins[pkg] = filepath.Join(built.dir, name)
		}
	}
	bins := make([]string, len(pkgs))
	for i, pkg := range pkgs {
		bins[i] = built.bins[pkg]
	}
	return bins
}

// workerProc is a worker binary running as a child process.
type workerProc struct {
	cmd  *exec.Cmd
	logs *logBuffer
	done chan struct{}
}

func startWorker(t *testing.T, bin string, args ...string) *workerProc {
	t.Helper()
	p := &workerProc{cmd: exec.Command(bin, args...), logs: &logBuffer{}, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0")
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// stop sends sig and returns the exit status.
func (p *workerProc) stop(t *testing.T, sig os.Signal) int {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	return p.wait(t)
}

func (p *workerProc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("worker did not exit within 60s; log:\n%s", p.logs)
	}
	return p.cmd.ProcessState.ExitCode()
}

// slowAPI answers after a pause while slow is set (or when the request is
// cancelled), at once otherwise, and counts per Idempotency-Key the
// requests started, completed (answered 200) and aborted (cancelled by the
// worker before the answer).
type slowAPI struct {
	*httptest.Server
	slow                        atomic.Bool
	pause                       time.Duration
	mu                          sync.Mutex
	started, completed, aborted map[string]int
}

func newSlowAPI(t *testing.T, pause time.Duration) *slowAPI {
	a := &slowAPI{pause: pause, started: map[string]int{}, completed: map[string]int{}, aborted: map[string]int{}}
	a.slow.Store(true)
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		// Read the body, so the server notices when the worker hangs up.
		io.Copy(io.Discard, r.Body)
		a.count(a.started, key)
		if a.slow.Load() {
			select {
			case <-r.Context().Done():
				a.count(a.aborted, key)
				return
			case <-time.After(a.pause):
			}
		}
		a.count(a.completed, key)
	}))
	t.Cleanup(a.Close)
	return a
}

func (a *slowAPI) count(m map[string]int, key string) {
	a.mu.Lock()
	m[key]++
	a.mu.Unlock()
}

func (a *slowAPI) total(m map[string]int) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func (a *slowAPI) get(m map[string]int, key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return m[key]
}

// enqueueCalls enqueues n http:call tasks to url on queue and returns their
// IDs.
func enqueueCalls(t *testing.T, client *asynq.Client, queue, url string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		b, _ := json.Marshal(map[string]any{"url": url, "business_id": fmt.Sprintf("b%d", i), "body": map[string]int{"i": i}})
		info, err := client.Enqueue(asynq.NewTask("http:call", b), asynq.Queue(queue))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = info.ID
	}
	return ids
}

func queueInfo(t *testing.T, in *asynq.Inspector, queue string) *asynq.QueueInfo {
	t.Helper()
	qi, err := in.GetQueueInfo(queue)
	if err != nil {
		t.Fatal(err)
	}
	return qi
}

// TestBinary runs the built worker binary: --help, a refused policy file,
// and graceful shutdown on SIGTERM, with nothing lost.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildWorker(t)

	t.Run("Help", func(t *testing.T) {
		p := startWorker(t, bin, "--help")
		if code := p.wait(t); code != exitOK || p.logs.String() != usageText {
			t.Errorf("--help: exit %d, printed %q", code, p.logs)
		}
	})

	t.Run("BadPolicy", func(t *testing.T) {
		addr, conns := countingListener(t)
		path := writePolicy(t, "rules:\n  - name: per-business\n    match: {type: \"http:call\"}\n    gcra: {rate: -1, per: 1s}\n")
		p := startWorker(t, bin, "--redis", addr, "--policy", path, "--concurrency", "2")
		if code := p.wait(t); code != exitUsage {
			t.Errorf("exit %d, want %d", code, exitUsage)
		}
		if out := p.logs.String(); !strings.Contains(out, `rule "per-business": gcra.rate`) || !strings.Contains(out, "line 4") {
			t.Errorf("output does not name the line, rule and field:\n%s", out)
		}
		if n := conns.Load(); n != 0 {
			t.Errorf("%d connections to Redis", n)
		}
	})

	policy := writePolicy(t, `rules:
  - name: q-rate
    match: {queue: q}
    gcra: {rate: 100, per: 1s, burst: 10}
`)

	// SIGTERM while tasks run: the running ones finish, the worker exits 0,
	// the rest wait in the queue for the next worker; every task runs
	// exactly once.
	t.Run("SIGTERM", func(t *testing.T) {
		srv := redistest.StartServer(t)
		rc := srv.Client(t)
		api := newSlowAPI(t, time.Second)
		client := asynq.NewClientFromRedisClient(rc)
		inspector := asynq.NewInspectorFromRedisClient(rc)
		ids := enqueueCalls(t, client, "q", api.URL, 6)
		args := []string{"--redis", srv.Addr(), "--policy", policy, "--concurrency", "3", "--queues", "q=1", "--shutdown-timeout", "30s"}

		w1 := startWorker(t, bin, args...)
		eventually(t, "3 tasks running", func() bool { return api.total(api.started) >= 3 })
		if code := w1.stop(t, syscall.SIGTERM); code != exitOK {
			t.Fatalf("exit %d after SIGTERM, want 0; log:\n%s", code, w1.logs)
		}
		if s, c := api.total(api.started), api.total(api.completed); s != 3 || c != 3 {
			t.Errorf("first worker: %d tasks started and %d completed, want 3 and 3", s, c)
		}
		for _, want := range []string{"shutting down", "All workers have finished", `msg="worker stopped"`} {
			if !strings.Contains(w1.logs.String(), want) {
				t.Errorf("first worker's log lacks %q:\n%s", want, w1.logs)
			}
		}
		if qi := queueInfo(t, inspector, "q"); qi.Pending != 3 || qi.Active != 0 {
			t.Errorf("after the first worker: %d pending, %d active; want 3 and 0", qi.Pending, qi.Active)
		}

		api.slow.Store(false)
		w2 := startWorker(t, bin, args...)
		eventually(t, "all tasks completed", func() bool {
			qi := queueInfo(t, inspector, "q")
			return api.total(api.completed) >= len(ids) && qi.Pending+qi.Active == 0
		})
		if code := w2.stop(t, syscall.SIGINT); code != exitOK {
			t.Errorf("second worker: exit %d after SIGINT, want 0; log:\n%s", code, w2.logs)
		}
		for _, id := range ids {
			if s, c := api.get(api.started, id), api.get(api.completed, id); s != 1 || c != 1 {
				t.Errorf("task %s: started %d, completed %d times; want exactly once", id, s, c)
			}
		}
		if qi := queueInfo(t, inspector, "q"); qi.Retry+qi.Archived+qi.Scheduled != 0 {
			t.Errorf("queue left with %+v", qi)
		}
	})

	// SIGTERM with a short --shutdown-timeout: tasks still running then are
	// cancelled and put back in the queue, the worker exits 0, and the next
	// worker runs them under the same Idempotency-Key.
	t.Run("ShutdownTimeout", func(t *testing.T) {
		srv := redistest.StartServer(t)
		rc := srv.Client(t)
		api := newSlowAPI(t, time.Minute)
		client := asynq.NewClientFromRedisClient(rc)
		inspector := asynq.NewInspectorFromRedisClient(rc)
		ids := enqueueCalls(t, client, "q", api.URL, 2)
		args := []string{"--redis", srv.Addr(), "--policy", policy, "--concurrency", "2", "--queues", "q=1", "--shutdown-timeout", "200ms"}

		w1 := startWorker(t, bin, args...)
		eventually(t, "2 tasks running", func() bool { return api.total(api.started) >= 2 })
		if code := w1.stop(t, syscall.SIGTERM); code != exitOK {
			t.Fatalf("exit %d after SIGTERM, want 0; log:\n%s", code, w1.logs)
		}
		eventually(t, "requests aborted", func() bool { return api.total(api.aborted) == 2 })
		if qi := queueInfo(t, inspector, "q"); qi.Pending != 2 || qi.Active != 0 {
			t.Fatalf("after the first worker: %d pending, %d active; want 2 requeued; log:\n%s", qi.Pending, qi.Active, w1.logs)
		}

		api.slow.Store(false)
		w2 := startWorker(t, bin, args...)
		eventually(t, "requeued tasks completed", func() bool {
			qi := queueInfo(t, inspector, "q")
			return api.total(api.completed) >= len(ids) && qi.Pending+qi.Active == 0
		})
		if code := w2.stop(t, syscall.SIGTERM); code != exitOK {
			t.Errorf("second worker: exit %d, want 0; log:\n%s", code, w2.logs)
		}
		for _, id := range ids {
			if s, c := api.get(api.started, id), api.get(api.completed, id); s != 2 || c != 1 {
				t.Errorf("task %s: started %d, completed %d times; want 2 and 1 (same Idempotency-Key)", id, s, c)
			}
		}
	})

	// A second signal during a graceful shutdown ends the process at once;
	// the tasks it was running stay leased in Redis, and asynq's recoverer
	// puts them back when the lease runs out.
	t.Run("SecondSignal", func(t *testing.T) {
		srv := redistest.StartServer(t)
		rc := srv.Client(t)
		api := newSlowAPI(t, time.Minute)
		inspector := asynq.NewInspectorFromRedisClient(rc)
		enqueueCalls(t, asynq.NewClientFromRedisClient(rc), "q", api.URL, 1)
		w := startWorker(t, bin, "--redis", srv.Addr(), "--policy", policy, "--concurrency", "1", "--queues", "q=1", "--shutdown-timeout", "1m")
		eventually(t, "task running", func() bool { return api.total(api.started) >= 1 })
		if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		w.logs.waitFor(t, regexp.MustCompile("Waiting for all workers to finish"), w.done)
		w.stop(t, syscall.SIGTERM)
		if ws, ok := w.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
			t.Errorf("worker ended with %v, want killed by the second SIGTERM", w.cmd.ProcessState)
		}
		if qi := queueInfo(t, inspector, "q"); qi.Active != 1 {
			t.Errorf("%d active tasks after the kill, want 1 (leased, recovered later)", qi.Active)
		}
	})
}
