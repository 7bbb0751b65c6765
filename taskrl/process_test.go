package taskrl

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// fleetEnv is what the parent hands each worker process.
type fleetEnv struct {
	Addr, Queue, Prefix string
	Rate                float64
	Burst, Tasks        int
}

// TestFleet runs real asynq servers with the middleware in 3 separate
// processes against one Redis: 1,000 tasks under a 100/s rule, enqueued at
// once (a backlog of 10 s). Every task runs exactly once, executions in any
// second never exceed the limit plus burst, the whole run takes the ideal
// time within 10%, and asynq archives or fails none — the same for the
// half of the tasks enqueued with MaxRetry(0).
func TestFleet(t *testing.T) {
	runFleet(t, "TestFleet", fleetEnv{Rate: 100, Burst: 10, Tasks: 1000})
}

// TestFleetBacklog is TestFleet with a backlog of 20 times the rate (200
// tasks under 10/s; 100 times, 1,000 tasks, with TASKRL_LONG=1): each task
// is still decided about once, not retried while it waits.
func TestFleetBacklog(t *testing.T) {
	if os.Getenv("TASKRL_FLEET") == "" {
		t.Parallel() // light (10/s), on a server of its own
	}
	tasks := 200
	if os.Getenv("TASKRL_LONG") != "" {
		tasks = 1000
	}
	runFleet(t, "TestFleetBacklog", fleetEnv{Rate: 10, Burst: 1, Tasks: tasks})
}

func runFleet(t *testing.T, name string, env fleetEnv) {
	if os.Getenv("TASKRL_FLEET") != "" {
		fleetWorker(t)
		return
	}
	if testing.Short() {
		t.Skip("spawns processes")
	}
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	env.Addr, env.Queue, env.Prefix = srv.Addr(), "fleet", redistest.Prefix(t)
	tasks := env.Tasks
	client := asynq.NewClientFromRedisClient(c)
	for i := 0; i < tasks; i++ {
		// Half with asynq's default retry budget, half with none.
		opts := []asynq.Option{asynq.Queue(env.Queue)}
		if i%2 == 0 {
			opts = append(opts, asynq.MaxRetry(0))
		}
		if _, err := client.Enqueue(asynq.NewTask("job", []byte(strconv.Itoa(i))), opts...); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := json.Marshal(env)
	outs := make([][]byte, 3)
	redistest.Parallel(t, 3, func(t testing.TB, i int) {
		out, err := redistest.Child(name, "TASKRL_FLEET="+string(b)).CombinedOutput()
		outs[i] = out
		if err != nil {
			t.Fatalf("worker %d: %v\n%s", i, err, out)
		}
	})
	if t.Failed() {
		return
	}
	ctx := context.Background()
	var calls, decisions int64
	for _, out := range outs {
		for _, line := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(line, "CALLS "); ok {
				var a, d int64
				fmt.Sscan(v, &a, &d)
				calls += a
				decisions += d
			}
			if v, ok := strings.CutPrefix(line, "KINDS "); ok {
				t.Logf("one worker's Redis calls by kind: %s", v)
			}
		}
	}
	log := c.LRange(ctx, env.Prefix+"ran", 0, -1).Val()
	runs := map[string]int{}
	var at []int64
	late := map[int64]int64{}
	for _, e := range log {
		f := strings.Fields(e)
		runs[f[0]]++
		us, _ := strconv.ParseInt(f[1], 10, 64)
		b, _ := strconv.ParseInt(f[2], 10, 64)
		at = append(at, us)
		if b > 0 {
			late[us] = us - b
		}
	}
	for i := 0; i < tasks; i++ {
		if n := runs[strconv.Itoa(i)]; n != 1 {
			t.Errorf("task %d ran %d times", i, n)
		}
	}
	sort.Slice(at, func(i, j int) bool { return at[i] < at[j] })
	worst, worstAt := 0, 0
	for i := range at {
		n := 0
		for j := i; j < len(at) && at[j]-at[i] < 1e6; j++ {
			n++
		}
		if n > worst {
			worst, worstAt = n, i
		}
	}
	if worst > int(env.Rate)+env.Burst {
		for j := worstAt; j < len(at) && at[j]-at[worstAt] < 1e6; j++ {
			t.Logf("busiest second: execution %d at +%dµs, %dµs after its booked slot", j, at[j]-at[worstAt], late[at[j]])
		}
	}
	span := time.Duration(at[len(at)-1]-at[0]) * time.Microsecond
	ideal := time.Duration(float64(tasks-env.Burst)/env.Rate*1e6) * time.Microsecond
	info, err := asynq.NewInspectorFromRedisClient(c).GetQueueInfo(env.Queue)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d executions in %v (ideal %v, %.1f%% over); busiest second %d (limit %v + burst %d); Redis calls by the middleware per executed task %.2f, limiter decisions per task %.2f; archived %d, failed %d",
		len(at), span, ideal, 100*(float64(span)/float64(ideal)-1), worst, env.Rate, env.Burst, float64(calls)/float64(tasks), float64(decisions)/float64(tasks), info.Archived, info.Failed)
	if worst > int(env.Rate)+env.Burst {
		t.Errorf("%d executions within one second", worst)
	}
	if float64(span) > 1.1*float64(ideal) {
		t.Errorf("took %v, more than 10%% over the ideal %v", span, ideal)
	}
	if per := float64(decisions) / float64(tasks); per > 2 {
		t.Errorf("%.2f limiter decisions per executed task; the bar is 2", per)
	}
	if info.Archived != 0 || info.Failed != 0 {
		t.Errorf("archived %d, failed %d", info.Archived, info.Failed)
	}
}

// fleetWorker is one worker process of TestFleet: it serves until every
// task has run (or a minute has passed) and prints how many Redis calls its
// middleware made.
func fleetWorker(t *testing.T) {
	var env fleetEnv
	if err := json.Unmarshal([]byte(os.Getenv("TASKRL_FLEET")), &env); err != nil {
		t.Fatal(err)
	}
	asynqClient := redis.NewClient(&redis.Options{Addr: env.Addr})
	mwClient := redis.NewClient(&redis.Options{Addr: env.Addr})
	hook := &redistest.Counter{}
	mwClient.AddHook(hook)
	decisions := &redistest.Counter{}
	policy := mustPolicy(t, policy.Rule{Name: "rate", Match: policy.Match{Type: "job"}, Limit: quotas.GCRA(gcra.Limit{Rate: env.Rate, Period: time.Second, Burst: env.Burst})})
	m, err := New(Config{Policy: policy, Client: mwClient, Prefix: env.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	// Count the limiter's decisions apart from the rescheduling calls.
	lc := redis.NewClient(&redis.Options{Addr: env.Addr})
	lc.AddHook(decisions)
	lc.AddHook(hook)
	if m.limiter, err = quotas.New(quotas.Config{Client: lc, Prefix: env.Prefix}); err != nil {
		t.Fatal(err)
	}
	srv := asynq.NewServerFromRedisClient(asynqClient, m.ServerConfig(asynq.Config{
		Concurrency: 20,
		Queues:      map[string]int{env.Queue: 1},
		LogLevel:    asynq.ErrorLevel,
	}))
	mux := asynq.NewServeMux()
	mux.Use(m.Handler)
	logKey := env.Prefix + "ran"
	mux.HandleFunc("job", func(ctx context.Context, task *asynq.Task) error {
		b, _ := Booked(ctx)
		return asynqClient.RPush(ctx, logKey, fmt.Sprintf("%s %d %d", task.Payload(), time.Now().UnixMicro(), b.UnixMicro())).Err()
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute + time.Duration(float64(env.Tasks)/env.Rate*float64(time.Second)))
	for time.Now().Before(deadline) && asynqClient.LLen(context.Background(), logKey).Val() < int64(env.Tasks) {
		time.Sleep(100 * time.Millisecond)
	}
	srv.Shutdown()
	m.Close()
	fmt.Printf("CALLS %d %d\n", hook.RoundTrips(), decisions.RoundTrips())
	fmt.Printf("KINDS %s\n", strings.Join(hook.Kinds(), " "))
}
