package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/testkit/fakeapi"
)

// commandStats returns Redis's count of commands processed by name (INFO
// commandstats: calls, which include the commands scripts run) and their
// total; and, under "usec:NAME", the µs Redis spent in each (a script's
// include those of the commands it ran).
func commandStats(t *testing.T, c *redis.Client) (map[string]int64, int64) {
	t.Helper()
	s, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out, total := map[string]int64{}, int64(0)
	for _, l := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				out[strings.TrimPrefix(name, "cmdstat_")] = n
				total += n
			}
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				out["usec:"+strings.TrimPrefix(name, "cmdstat_")] = n
			}
		}
	}
	return out, total
}

// commandCount is how many times a command ran.
type commandCount struct {
	name string
	n    int64
}

// commandDeltas returns the commands that ran between two commandStats
// readings (INFO itself excluded), the most frequent first; with usec, the
// µs spent in them instead, the largest first.
func commandDeltas(before, after map[string]int64, usec bool) []commandCount {
	var top []commandCount
	for key, n := range after {
		name, isUsec := strings.CutPrefix(key, "usec:")
		if isUsec != usec {
			continue
		}
		if d := n - before[key]; d > 0 && name != "info" {
			top = append(top, commandCount{name, d})
		}
	}
	sort.Slice(top, func(i, j int) bool { return top[i].n > top[j].n })
	return top
}

// commandsDuring counts the commands Redis processes in window, after a
// warm-up, while run's processes are up; it returns them per second and
// the busiest commands.
func commandsDuring(t *testing.T, warm, window time.Duration, start func() (stop func())) (float64, string) {
	t.Helper()
	stop := start()
	defer stop()
	time.Sleep(warm)
	before, b := commandStats(t, env.Client)
	time.Sleep(window)
	after, a := commandStats(t, env.Client)
	top := commandDeltas(before, after, false)
	var parts []string
	for _, x := range top[:min(len(top), 8)] {
		parts = append(parts, fmt.Sprintf("%s %.1f/s", x.name, float64(x.n)/window.Seconds()))
	}
	return float64(a-b-1) / window.Seconds(), strings.Join(parts, ", ")
}

// buildWorker builds the main module's cmd/worker into a temporary directory.
func buildWorker(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "worker")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/worker")
	cmd.Dir = ".." // the main module
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// fivePolicy is issue 15's five rules that never bind.
const fivePolicy = `rules:
  - name: peak
    match: {type: "http:call"}
    gcra: {rate: 100000, per: 1s, burst: 1000}
  - name: window
    match: {type: "http:call"}
    quota: {limit: 10000000, every: 10s}
  - name: daily
    match: {type: "http:call"}
    quota: {limit: 100000000, cron: "0 0 * * *", tz: UTC}
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 100000, per: 1s, burst: 1000}
  - name: business-concurrency
    match: {type: "http:call"}
    key: "{{.business_id}}"
    concurrency: {max: 1000, lease: 30s}
`

// startWorkers starts n worker processes of bin on the bench's Redis with
// policy and extra flags; stop interrupts them, waits for them to exit and
// returns the CPU time (user and system) they used.
func startWorkers(t *testing.T, bin string, n int, policy string, flags ...string) (stop func() time.Duration, logs *strings.Builder) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	logs = &strings.Builder{} // written by one stderr copier per process
	var mu sync.Mutex
	var cmds []*exec.Cmd
	for i := 0; i < n; i++ {
		cmd := exec.Command(bin, append([]string{"--redis", env.Client.Options().Addr, "--policy", file}, flags...)...)
		cmd.Stderr = lockedWriter{&mu, logs}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	return func() (cpu time.Duration) {
		for _, c := range cmds {
			_ = c.Process.Signal(os.Interrupt)
		}
		for _, c := range cmds {
			_ = c.Wait()
			if ps := c.ProcessState; ps != nil {
				cpu += ps.UserTime() + ps.SystemTime()
			}
		}
		return cpu
	}, logs
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *strings.Builder
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestPacedStart: 3 idle worker processes (asynq's default
// TaskCheckInterval) and a global rule of 10/s, burst 1; 100 calls
// enqueued at once are booked 100 ms apart, all but the first few far
// enough ahead to be rescheduled and moved back to pending by the pacer
// 1.6 s before their slot. The API sees call k at the first call's
// arrival plus k intervals (the schedule the limit alone gives); the
// p99 of the difference must be at most 5 ms (measured 1.3-1.5 ms; the
// issue asked for 20 ms).
func TestPacedStart(t *testing.T) {
	if os.Getenv("TASKRL_FLEET") == "" {
		t.Skip("set TASKRL_FLEET=1 (make fleet)")
	}
	const n, workers = 100, 3
	em := 100 * time.Millisecond
	// The API allows one call of slack over the policy: a call a millisecond
	// early is not an error of the limit.
	api, err := fakeapi.New(fakeapi.Limits{Global: fakeapi.Limit{Rate: 10, Period: time.Second, Burst: 2}})
	if err != nil {
		t.Fatal(err)
	}
	url, err := api.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close()
	queue := fmt.Sprintf("paced-%d", time.Now().UnixNano())
	stop, logs := startWorkers(t, buildWorker(t), workers, `rules:
  - name: peak
    match: {type: "http:call"}
    gcra: {rate: 10, per: 1s, burst: 1}
`, "--concurrency", "16", "--queues", queue+"=1", "--prefix", queue+":")
	defer stop()
	time.Sleep(2 * time.Second) // the workers are up and idle
	client := asynq.NewClientFromRedisClient(env.Client)
	for i := 0; i < n; i++ {
		payload := fmt.Sprintf(`{"url": %q, "method": "POST", "business_id": "b1"}`, url+"/v1/charge")
		if _, err := client.Enqueue(asynq.NewTask("http:call", []byte(payload)), asynq.Queue(queue), asynq.MaxRetry(0)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(time.Duration(n)*em + 20*time.Second)
	for api.Stats().OK < n && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	st := api.Stats()
	if st.OK < n || st.Throttled > 0 {
		t.Fatalf("%d calls answered 2xx, %d 429, want %d and 0; workers:\n%s", st.OK, st.Throttled, n, logs.String())
	}
	var ats []time.Time
	for _, c := range api.Calls() {
		if c.Status == 200 {
			ats = append(ats, c.At)
		}
	}
	sort.Slice(ats, func(i, j int) bool { return ats[i].Before(ats[j]) })
	var errs []time.Duration
	for k, at := range ats {
		d := at.Sub(ats[0].Add(time.Duration(k) * em))
		errs = append(errs, max(d, -d))
	}
	sort.Slice(errs, func(i, j int) bool { return errs[i] < errs[j] })
	p99 := errs[len(errs)*99/100-1]
	t.Logf("%d calls at 10/s from %d idle workers: start error against the schedule the limit gives: p50 %v, p99 %v, max %v",
		n, workers, errs[len(errs)/2], p99, errs[len(errs)-1])
	if p99 > 5*time.Millisecond {
		t.Errorf("p99 start error %v, over 5ms", p99)
	}
}

// TestIdleFleet compares the Redis commands per second (INFO
// commandstats, which counts the commands scripts run) of 4 idle worker
// processes under issue 15's five rules with those of 4 idle plain asynq
// servers of the same concurrency and one queue, one after the other
// against the same redis-server, 20 s each after 3 s of warm-up: at most
// 1.5x. TASKRL_WORKER_BASE names another worker binary (say, built from
// an earlier commit) to measure in the same run.
func TestIdleFleet(t *testing.T) {
	if os.Getenv("TASKRL_FLEET") == "" {
		t.Skip("set TASKRL_FLEET=1 (make fleet)")
	}
	const workers, concurrency = 4, 16
	window := 20 * time.Second
	bin := buildWorker(t)
	addr := env.Client.Options().Addr
	plain, plainTop := commandsDuring(t, 3*time.Second, window, func() func() {
		var srvs []*asynq.Server
		for i := 0; i < workers; i++ {
			s := asynq.NewServer(asynq.RedisClientOpt{Addr: addr}, asynq.Config{Concurrency: concurrency, Queues: map[string]int{"idle-plain": 1}, LogLevel: asynq.WarnLevel})
			if err := s.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
				t.Fatal(err)
			}
			srvs = append(srvs, s)
		}
		return func() {
			for _, s := range srvs {
				s.Shutdown()
			}
		}
	})
	var logs *strings.Builder
	ours, oursTop := commandsDuring(t, 3*time.Second, window, func() (stop func()) {
		var stopWorkers func() time.Duration
		stopWorkers, logs = startWorkers(t, bin, workers, fivePolicy, "--concurrency", strconv.Itoa(concurrency), "--queues", "idle-taskrl=1")
		return func() { stopWorkers() }
	})
	if ours == 0 {
		t.Fatalf("the workers made no Redis call:\n%s", logs.String())
	}
	t.Logf("%d idle processes, concurrency %d, over %v: plain asynq %.1f commands/s per process (%s)", workers, concurrency, window, plain/workers, plainTop)
	if base := os.Getenv("TASKRL_WORKER_BASE"); base != "" {
		// Another build of the worker (an earlier commit), for the record.
		was, wasTop := commandsDuring(t, 3*time.Second, window, func() (stop func()) {
			stopWorkers, _ := startWorkers(t, base, workers, fivePolicy, "--concurrency", strconv.Itoa(concurrency), "--queues", "idle-base=1")
			return func() { stopWorkers() }
		})
		t.Logf("%s: %.1f commands/s per process (%s): %.2fx", base, was/workers, wasTop, was/plain)
	}
	t.Logf("taskrl worker %.1f commands/s per process (%s): %.2fx", ours/workers, oursTop, ours/plain)
	if ours > 1.5*plain {
		t.Errorf("idle taskrl workers make %.2fx the Redis commands of idle plain asynq servers, over 1.5x", ours/plain)
	}
}

// backlog starts a fake API answering at once (closed with the test) and
// enqueues n http:call tasks to it, with MaxRetry(0), into a fresh queue
// named after name, task i of business b(i mod businesses + 1), while no
// worker runs. It returns the API and the queue.
func backlog(t *testing.T, name string, n, businesses int) (*fakeapi.API, string) {
	t.Helper()
	api, err := fakeapi.New(fakeapi.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	url, err := api.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { api.Close() })
	queue := fmt.Sprintf("%s-%d", name, time.Now().UnixNano())
	client := asynq.NewClientFromRedisClient(env.Client)
	for i := 0; i < n; i++ {
		payload := fmt.Sprintf(`{"url": %q, "method": "POST", "business_id": "b%d"}`, url+"/v1/charge", i%businesses+1)
		if _, err := client.Enqueue(asynq.NewTask("http:call", []byte(payload)), asynq.Queue(queue), asynq.MaxRetry(0)); err != nil {
			t.Fatal(err)
		}
	}
	return api, queue
}

// fleetCost is what one fleetRun measured, per task: Redis commands
// (INFO commandstats, which counts the commands scripts run), Redis's own
// CPU and the workers' CPU; and the tasks per second.
type fleetCost struct {
	commands            float64
	byName              string // commands per task by name, busiest first
	timeByName          string // Redis µs per task by command, largest first
	redisCPU, workerCPU time.Duration
	perSec              float64
}

// fleetRun enqueues n http:call tasks over 1,000 businesses (backlog),
// then starts workers processes of bin (16 slots each) under policy and
// waits until the API has answered all n. It measures while the workers
// run (the enqueue excluded; the workers' CPU includes their start and
// stop), Redis's time per task by command (INFO commandstats: usec, wall
// time inside each command, a script's including the commands it ran) and
// the tasks per second from the first call to the last. With
// TASKRL_FLEET_MONITOR set to a directory it also writes Redis's MONITOR
// stream of the run to DIR/NAME.mon.
func fleetRun(t *testing.T, bin, name, policy string, n, workers int) fleetCost {
	t.Helper()
	api, queue := backlog(t, "cost-"+name, n, 1000)
	if dir := os.Getenv("TASKRL_FLEET_MONITOR"); dir != "" {
		// Every command the run makes, those scripts run included, to
		// tell where they come from (BENCHMARKS.md, session 14).
		host, port, _ := strings.Cut(env.Client.Options().Addr, ":")
		mon := exec.Command("redis-cli", "-h", host, "-p", port, "monitor")
		f, err := os.Create(filepath.Join(dir, name+".mon"))
		if err != nil {
			t.Fatal(err)
		}
		mon.Stdout = f
		if err := mon.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		defer func() { _ = mon.Process.Kill(); _ = mon.Wait(); f.Close() }()
	}
	names0, before := commandStats(t, env.Client)
	cpu0 := redisCPU(t)
	stop, logs := startWorkers(t, bin, workers, policy, "--concurrency", "16", "--queues", queue+"=1", "--prefix", queue+":")
	deadline := time.Now().Add(5 * time.Minute)
	for api.Stats().OK < n && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	names1, after := commandStats(t, env.Client)
	cpu1 := redisCPU(t)
	workerCPU := stop()
	st := api.Stats()
	if st.OK != n || st.DistinctKeys != n || st.Throttled != 0 {
		t.Fatalf("%s: %d calls answered 2xx, %d distinct, %d 429; want %d, %d, 0; workers:\n%s", name, st.OK, st.DistinctKeys, st.Throttled, n, n, logs.String())
	}
	var parts []string
	for _, x := range commandDeltas(names0, names1, false) {
		if f := float64(x.n) / float64(n); f >= 0.05 {
			parts = append(parts, fmt.Sprintf("%s %.2f", x.name, f))
		}
	}
	var times []string
	for _, x := range commandDeltas(names0, names1, true) {
		if f := float64(x.n) / float64(n); f >= 0.5 {
			times = append(times, fmt.Sprintf("%s %.1f", x.name, f))
		}
	}
	return fleetCost{
		commands:   float64(after-before-1) / float64(n),
		byName:     strings.Join(parts, ", "),
		timeByName: strings.Join(times, ", "),
		redisCPU:   (cpu1 - cpu0) / time.Duration(n),
		workerCPU:  workerCPU / time.Duration(n),
		perSec:     float64(n-1) / st.LastOK.Sub(st.FirstOK).Seconds(),
	}
}

// redisCPU returns the CPU time (user and system) the bench's redis-server
// has used so far (INFO cpu).
func redisCPU(t *testing.T) time.Duration {
	t.Helper()
	info, err := env.Client.Info(context.Background(), "cpu").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		for _, f := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, f); ok {
				x, _ := strconv.ParseFloat(v, 64)
				total += x
			}
		}
	}
	return time.Duration(total * float64(time.Second))
}

// TestFleetCost measures issue 15's per-task figures with the built
// worker, 3 processes of 16 slots, in one run against one redis-server:
// Redis commands per task and throughput for 15,000 tasks under no rule,
// one GCRA rule (prefetching by itself, with prefetch: off, and with
// prefetch: 9ms), three global rules (a rate, a 10 s window, a daily
// quota; prefetching by themselves, and all with prefetch: 9ms),
// one daily quota (prefetching by itself, and with prefetch: off), alone
// and beside a concurrency cap, and five rules that never bind; and commands per
// delivered task for a backlog 10x and 30x a 50/s rule. Each rule case
// logs its commands per task by name too; TASKRL_FLEET_CASES and
// TASKRL_WORKER_BASE (see below) restrict the run and add another build. It fails only if
// a call is lost, doubled or throttled; the figures are logged for
// BENCHMARKS.md (issue 15's bars on them are not met yet).
func TestFleetCost(t *testing.T) {
	if os.Getenv("TASKRL_FLEET") == "" {
		t.Skip("set TASKRL_FLEET=1 (make fleet)")
	}
	const n, workers = 15000, 3
	bin := buildWorker(t)
	none := `rules:
  - name: other
    match: {type: "other"}
    gcra: {rate: 1, per: 1s}
`
	one := `rules:
  - name: peak
    match: {type: "http:call"}
    gcra: {rate: 100000, per: 1s, burst: 1000}
`
	// It prefetches by itself (2.5 ms: a quarter of its burst's worth);
	// with prefetch: off every task is decided in Redis.
	prefetch := strings.Replace(one, "    gcra:", "    prefetch: 9ms\n    gcra:", 1)
	oneOff := strings.Replace(one, "    gcra:", "    prefetch: off\n    gcra:", 1)
	// Three global rules that never bind (the first three of fivePolicy),
	// each prefetching: a rate, a 10 s window and a daily quota.
	threePrefetch := `rules:
  - name: peak
    match: {type: "http:call"}
    prefetch: 9ms
    gcra: {rate: 100000, per: 1s, burst: 1000}
  - name: window
    match: {type: "http:call"}
    prefetch: 9ms
    quota: {limit: 10000000, every: 10s}
  - name: daily
    match: {type: "http:call"}
    prefetch: 9ms
    quota: {limit: 100000000, cron: "0 0 * * *", tz: UTC}
`
	three := strings.ReplaceAll(threePrefetch, "    prefetch: 9ms\n", "")
	// One daily quota that never binds: it prefetches by itself; with
	// prefetch: off it does not.
	daily := `rules:
  - name: daily
    match: {type: "http:call"}
    quota: {limit: 100000000, cron: "0 0 * * *", tz: UTC}
`
	dailyOff := strings.Replace(daily, "    quota:", "    prefetch: off\n    quota:", 1)
	// The daily quota beside a concurrency cap that never binds: the
	// quota leases by itself and the slot takes the task's one call.
	slots := `
  - name: slots
    match: {type: "http:call"}
    concurrency: {max: 1000, lease: 30s}
`
	dailySlots, dailySlotsOff := daily+slots[1:], dailyOff+slots[1:]
	// TASKRL_FLEET_CASES (say "none,five") restricts the run to those
	// cases; TASKRL_WORKER_BASE names another worker binary (say, built
	// from an earlier commit) whose rule cases run too, in the same run.
	cases := os.Getenv("TASKRL_FLEET_CASES")
	want := func(name string) bool {
		return cases == "" || name == "none" || strings.Contains(","+cases+",", ","+name+",")
	}
	base := fleetRun(t, bin, "none", none, n, workers)
	t.Logf("no rule: %.1f commands per task (%s), Redis CPU %v (µs by command: %s) and workers' CPU %v per task, %.0f tasks/s", base.commands, base.byName, base.redisCPU, base.timeByName, base.workerCPU, base.perSec)
	bins := []struct{ label, bin string }{{"", bin}}
	if b := os.Getenv("TASKRL_WORKER_BASE"); b != "" {
		bins = append(bins, struct{ label, bin string }{b + ": ", b})
	}
	for _, c := range []struct{ name, policy string }{{"one", one}, {"one-off", oneOff}, {"one-prefetch", prefetch}, {"three", three}, {"three-prefetch", threePrefetch}, {"daily-off", dailyOff}, {"daily", daily}, {"daily-slots-off", dailySlotsOff}, {"daily-slots", dailySlots}, {"five", fivePolicy}} {
		if !want(c.name) {
			continue
		}
		for _, b := range bins {
			f := fleetRun(t, b.bin, c.name, c.policy, n, workers)
			t.Logf("%s%s: %.1f commands per task (%.2fx no rule; %s), Redis CPU %v (%.2fx; µs by command: %s) and workers' CPU %v (%.2fx) per task, %.0f tasks/s (%.2fx)", b.label, c.name,
				f.commands, f.commands/base.commands, f.byName, f.redisCPU, float64(f.redisCPU)/float64(base.redisCPU), f.timeByName,
				f.workerCPU, float64(f.workerCPU)/float64(base.workerCPU), f.perSec, f.perSec/base.perSec)
		}
	}
	if cases != "" && !want("backlog") {
		return
	}
	backlog := `rules:
  - name: peak
    match: {type: "http:call"}
    gcra: {rate: 50, per: 1s, burst: 1}
`
	for _, x := range []int{10, 30} {
		for _, b := range bins {
			f := fleetRun(t, b.bin, fmt.Sprintf("backlog%d", x), backlog, 50*x, workers)
			t.Logf("%sbacklog %dx a 50/s rule: %.1f commands per delivered task (%.2fx no rule; %s), %.1f tasks/s", b.label, x, f.commands, f.commands/base.commands, f.byName, f.perSec)
		}
	}
}

// drainRun enqueues n http:call tasks of one business (backlog), starts
// workers processes of bin (10 slots each) under policy, and
// returns how long the backlog took to leave the queue (pending down to
// one) from the workers' start, and the Redis commands per task meanwhile.
func drainRun(t *testing.T, bin, name, policy string, n, workers int) (time.Duration, float64) {
	t.Helper()
	_, queue := backlog(t, "drain-"+name, n, 1)
	insp := asynq.NewInspectorFromRedisClient(env.Client)
	_, before := commandStats(t, env.Client)
	begin := time.Now()
	stop, logs := startWorkers(t, bin, workers, policy, "--concurrency", "10", "--queues", queue+"=1", "--prefix", queue+":")
	defer stop()
	for {
		info, err := insp.GetQueueInfo(queue)
		if err != nil {
			t.Fatal(err)
		}
		if info.Pending <= 1 {
			break
		}
		if time.Since(begin) > 2*time.Minute {
			t.Fatalf("%s: %d tasks still pending after 2 minutes; workers:\n%s", name, info.Pending, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(begin)
	_, after := commandStats(t, env.Client)
	return took, float64(after-before) / float64(n)
}

// TestBacklogDrain measures issue 11's head-of-line figure with the built
// worker, 3 processes of 10 slots, in one run against one redis-server:
// how fast 10,000 tasks of one business leave the queue when its own
// limit (1.8/s beside a global 18/s) defers each of them, against the
// same tasks under no rule, which run at once (an API answering at
// once). It fails only if the backlog does not leave the queue.
func TestBacklogDrain(t *testing.T) {
	if os.Getenv("TASKRL_FLEET") == "" {
		t.Skip("set TASKRL_FLEET=1 (make fleet)")
	}
	const n, workers = 10000, 3
	bin := buildWorker(t)
	none := `rules:
  - name: other
    match: {type: "other"}
    gcra: {rate: 1, per: 1s}
`
	noisy := `rules:
  - name: vendor-peak
    match: {type: "http:call"}
    gcra: {rate: 18, per: 1s, burst: 3}
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 1.8, per: 1s, burst: 1}
`
	base, basePer := drainRun(t, bin, "none", none, n, workers)
	t.Logf("no rule: %d tasks left the queue in %v (%.0f/s), %.1f commands per task", n, base.Round(time.Millisecond), n/base.Seconds(), basePer)
	took, per := drainRun(t, bin, "noisy", noisy, n, workers)
	t.Logf("one business over its limit: %v (%.0f/s, %.2fx the time of no rule), %.1f commands per task (%.2fx)", took.Round(time.Millisecond), n/took.Seconds(), float64(took)/float64(base), per, per/basePer)
}
