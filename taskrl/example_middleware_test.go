package taskrl_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/taskrl"
)

// An asynq worker whose "email:send" tasks share one limit of 10 a second
// (burst 2) with every other worker on the same Redis.
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.SharedAddr()})
	defer rdb.Close()
	policy, err := policy.Parse([]byte(`
rules:
  - name: email-provider
    match: {type: "email:send"}
    gcra: {rate: 10, per: 1s, burst: 2}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	var admitted atomic.Int32
	mw, err := taskrl.New(taskrl.Config{
		Policy: policy,
		Client: rdb,
		Prefix: redistest.NewPrefix("ExampleNew"), // default "taskrl:"
		Observer: taskrl.ObserverFunc(func(e taskrl.Event) {
			if e.Outcome == taskrl.Admitted {
				admitted.Add(1)
			}
		}),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	queue := "example-new-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	srv := asynq.NewServerFromRedisClient(rdb, mw.ServerConfig(asynq.Config{
		Concurrency: 5,
		Queues:      map[string]int{queue: 1},
		LogLevel:    asynq.FatalLevel,
	}))
	mux := asynq.NewServeMux()
	mux.Use(mw.Handler)
	sent := make(chan time.Time, 6)
	mux.HandleFunc("email:send", func(ctx context.Context, t *asynq.Task) error {
		sent <- time.Now()
		return nil
	})
	if err := srv.Start(mux); err != nil {
		fmt.Println(err)
		return
	}
	client := asynq.NewClientFromRedisClient(rdb)
	for i := 0; i < 6; i++ {
		if _, err := client.Enqueue(asynq.NewTask("email:send", []byte(`{"to": "a@example.com"}`)), asynq.Queue(queue)); err != nil {
			fmt.Println(err)
			return
		}
	}
	first := <-sent
	var last time.Time
	for i := 1; i < 6; i++ {
		last = <-sent
	}
	srv.Shutdown()
	mw.Close()
	_ = asynq.NewInspectorFromRedisClient(rdb).DeleteQueue(queue, true)
	// Two at once (the burst), then one every 100ms.
	fmt.Printf("6 sent, %d admitted; the 6th at least 400ms after the 1st: %v\n", admitted.Load(), last.Sub(first) >= 390*time.Millisecond)
	// Output:
	// 6 sent, 6 admitted; the 6th at least 400ms after the 1st: true
}

// A handler whose remote API answered 429 returns Throttled: every worker
// backs off the task's rules until Retry-After, and the task runs again then
// without spending a retry (it has none here). It keeps its asynq ID, so
// the API sees one Idempotency-Key for both attempts.
func ExampleThrottled() {
	var calls atomic.Int32
	var mu sync.Mutex
	var keys []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		mu.Unlock()
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer api.Close()

	rdb := redis.NewClient(&redis.Options{Addr: redistest.SharedAddr()})
	defer rdb.Close()
	policy, _ := policy.Parse([]byte(`
rules:
  - name: vendor
    match: {type: "vendor:call"}
    gcra: {rate: 20, per: 1s, burst: 5}
`))
	mw, err := taskrl.New(taskrl.Config{Policy: policy, Client: rdb, Prefix: redistest.NewPrefix("ExampleThrottled")})
	if err != nil {
		fmt.Println(err)
		return
	}
	queue := "example-throttled-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	srv := asynq.NewServerFromRedisClient(rdb, mw.ServerConfig(asynq.Config{Queues: map[string]int{queue: 1}, LogLevel: asynq.FatalLevel}))
	mux := asynq.NewServeMux()
	mux.Use(mw.Handler)
	done := make(chan struct{})
	mux.HandleFunc("vendor:call", func(ctx context.Context, t *asynq.Task) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, api.URL, nil)
		id, _ := asynq.GetTaskID(ctx)
		req.Header.Set("Idempotency-Key", id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			return taskrl.Throttled(time.Duration(secs)*time.Second, fmt.Errorf("vendor: %s", resp.Status))
		}
		close(done)
		return nil
	})
	if err := srv.Start(mux); err != nil {
		fmt.Println(err)
		return
	}
	start := time.Now()
	info, err := asynq.NewClientFromRedisClient(rdb).Enqueue(asynq.NewTask("vendor:call", nil), asynq.Queue(queue), asynq.MaxRetry(0))
	if err != nil {
		fmt.Println(err)
		return
	}
	<-done
	waited := time.Since(start)
	srv.Shutdown()
	mw.Close()
	_ = asynq.NewInspectorFromRedisClient(rdb).DeleteQueue(queue, true)
	mu.Lock()
	defer mu.Unlock()
	fmt.Printf("%d calls; second after Retry-After: %v; one Idempotency-Key, the task's ID: %v\n",
		calls.Load(), waited >= time.Second, keys[0] == info.ID && keys[1] == info.ID)
	// Output:
	// 2 calls; second after Retry-After: true; one Idempotency-Key, the task's ID: true
}
