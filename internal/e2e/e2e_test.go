package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/estimate"
	"github.com/taskrl/taskrl/internal/fakeapi"
	"github.com/taskrl/taskrl/internal/redistest"
	"github.com/taskrl/taskrl/taskrl"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// policy sits just under the API's published limits below.
const policy = `
rules:
  - name: vendor-peak
    match: {type: "http:call"}
    gcra: {rate: 18, per: 1s, burst: 3}
  - name: vendor-window
    match: {type: "http:call"}
    quota: {limit: 140, every: 10s}
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 1.8, per: 1s, burst: 1}
  - name: business-concurrency
    match: {type: "http:call"}
    key: "{{.business_id}}"
    concurrency: {max: 2, lease: 30s}
`

// TestBinaries builds the worker and enqueue binaries and runs the product
// as the README tells a user to: three worker processes with a policy just
// under a strict API's limits (global 20/s burst 5, 2/s burst 2 per
// business, 150 per 10 s window), and 400 http:call tasks over 20 businesses
// enqueued with MaxRetry(0). The API must see zero 429s, every call exactly
// once by Idempotency-Key, and the whole run within 1.3x of the time the
// policy's limits alone impose; asynq must have archived and failed none;
// each worker must stop cleanly on SIGTERM.
func TestBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	const tasks, businesses = 400, 20
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin, "github.com/taskrl/taskrl/cmd/worker", "github.com/taskrl/taskrl/cmd/enqueue")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	api, err := fakeapi.New(fakeapi.Limits{
		Global:      gcra.Limit{Rate: 20, Period: time.Second, Burst: 5},
		PerBusiness: gcra.Limit{Rate: 2, Period: time.Second, Burst: 2},
		Quota:       fakeapi.Quota{Limit: 150, Every: 10 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	url, err := api.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close()
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	redisURL := "redis://" + redistest.Addr(t)
	prefix := redistest.Prefix(t)
	c := redistest.Client(t)
	queue := redistest.Queue(t, c, "e2e")
	inspector := asynq.NewInspectorFromRedisClient(c)

	type worker struct {
		cmd  *exec.Cmd
		logs *strings.Builder
		done chan error
	}
	workers := make([]*worker, 3)
	for i := range workers {
		cmd := exec.Command(filepath.Join(bin, "worker"), "--policy", policyFile, "--concurrency", "10",
			"--queues", queue+"=1", "--prefix", prefix)
		cmd.Env = append(os.Environ(), "REDIS_URL="+redisURL)
		w := &worker{cmd: cmd, logs: &strings.Builder{}, done: make(chan error, 1)}
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		started := make(chan struct{})
		go func() {
			sc := bufio.NewScanner(stderr)
			once := false
			for sc.Scan() {
				w.logs.WriteString(sc.Text() + "\n")
				if !once && strings.Contains(sc.Text(), "worker started") {
					once = true
					close(started)
				}
			}
			w.done <- cmd.Wait()
		}()
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("worker %d did not start:\n%s", i, w.logs.String())
		}
		workers[i] = w
		defer cmd.Process.Kill()
	}

	start := time.Now()
	enq := exec.Command(filepath.Join(bin, "enqueue"), "--redis", redisURL, "--type", "http:call", "--url", url+"/v1/charge",
		"--count", fmt.Sprint(tasks), "--businesses", fmt.Sprint(businesses), "--queue", queue, "--max-retry", "0")
	if out, err := enq.CombinedOutput(); err != nil {
		t.Fatalf("enqueue: %v\n%s", err, out)
	} else {
		t.Logf("enqueue: %s", strings.TrimSpace(string(out)))
	}
	deadline := time.Now().Add(2 * time.Minute)
	for api.Stats().DistinctKeys < tasks && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	st := api.Stats()

	p, err := taskrl.ParsePolicy([]byte(policy))
	if err != nil {
		t.Fatal(err)
	}
	ideal, err := estimate.Run(p, estimate.Campaign{Type: "http:call", Queue: queue, N: tasks, Payload: func(i int) []byte {
		return []byte(fmt.Sprintf(`{"business_id": "b%d"}`, i%businesses+1))
	}}, estimate.Options{Start: start})
	if err != nil {
		t.Fatal(err)
	}
	took := st.LastOK.Sub(start)
	busiest := st.BusiestSecond()
	t.Logf("API: %d calls, %d answered 2xx, %d distinct keys, %d duplicates, %d 429s %v; busiest second %d; took %v from the enqueue, ideal under the policy %v (binding rule %s), ratio %.3f",
		st.Calls, st.OK, st.DistinctKeys, st.Duplicates, st.Throttled, st.ThrottledBy, busiest.OK+busiest.Throttled,
		took.Round(time.Millisecond), ideal.Duration.Round(time.Millisecond), ideal.Binding, float64(took)/float64(ideal.Duration))
	if st.DistinctKeys != tasks || st.Calls != tasks || st.Duplicates != 0 {
		t.Errorf("want every one of %d tasks called exactly once: %d calls, %d distinct keys, %d duplicates", tasks, st.Calls, st.DistinctKeys, st.Duplicates)
	}
	if st.Throttled != 0 {
		t.Errorf("the API answered 429 %d times", st.Throttled)
	}
	if float64(took) > 1.3*float64(ideal.Duration) {
		t.Errorf("took %v, more than 1.3x the ideal %v", took, ideal.Duration)
	}

	for i, w := range workers {
		if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-w.done:
			if err != nil {
				t.Errorf("worker %d exited with %v after SIGTERM:\n%s", i, err, w.logs.String())
			}
		case <-time.After(45 * time.Second):
			t.Errorf("worker %d did not stop after SIGTERM", i)
		}
	}
	info, err := inspector.GetQueueInfo(queue)
	if err != nil {
		t.Fatal(err)
	}
	if info.Archived != 0 || info.Failed != 0 || info.Retry != 0 || info.Pending != 0 || info.Scheduled != 0 || info.Active != 0 {
		t.Errorf("queue after the run: %+v", info)
	}
}
