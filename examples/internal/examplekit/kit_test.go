package examplekit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/testkit/fakeapi"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/taskrl"
)

// TestEnvWorkers runs tasks that call the stand-in API through a fleet of
// workers started by StartWorkers, on a real Redis, forces a 429 on the way,
// and checks that Close leaves nothing behind.
func TestEnvWorkers(t *testing.T) {
	env, err := Setup("kittest", "redis://"+redistest.Addr(t), fakeapi.Limits{Global: fakeapi.Limit{Rate: 100, Period: time.Second, Burst: 10}})
	if err != nil {
		t.Fatal(err)
	}
	queue := env.NS
	var out bytes.Buffer
	closed := false
	defer func() {
		if !closed {
			env.Close(context.Background(), &out, queue)
		}
	}()
	policy, err := policy.Parse([]byte("rules:\n  - name: r\n    match: {type: call}\n    gcra: {rate: 50, per: 1s, burst: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var ok, throttled atomic.Int64
	err = env.StartWorkers(Workers{
		N:        2,
		Config:   taskrl.Config{Policy: policy, Prefix: env.Prefix},
		Queues:   map[string]int{queue: 1},
		Handlers: map[string]asynq.Handler{"call": &Caller{URL: env.URL + "/x", Name: "api", OK: &ok, Throttled: &throttled}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Longer than idle workers sleep between looks at their queues (up to
	// 1.5 s at asynq's default TaskCheckInterval): the first calls meet it.
	env.API.ThrottleFor(2500 * time.Millisecond)
	client := asynq.NewClientFromRedisClient(env.Client)
	var ids []string
	for i := 1; i <= 10; i++ {
		id := fmt.Sprintf("%s-%d", env.NS, i)
		ids = append(ids, id)
		if _, err := client.Enqueue(asynq.NewTask("call", []byte(fmt.Sprintf(`{"business_id":"b%d"}`, i%3))), asynq.Queue(queue), asynq.TaskID(id)); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ok.Load() < 10 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	env.Fleet.Stop()
	env.Fleet.Stop() // a second Stop does nothing
	if never, repeated := Answered(env.API, ids); ok.Load() != 10 || never != 0 || repeated != 0 {
		t.Errorf("%d 2xx; %d tasks never answered, %d answered twice", ok.Load(), never, repeated)
	}
	if throttled.Load() == 0 {
		t.Error("no 429 seen during ThrottleFor")
	}
	for _, c := range env.API.Calls() {
		if c.Status == http.StatusOK && c.Business == "" {
			t.Errorf("call %+v without X-Business-ID", c)
		}
	}
	var problems Problems
	if info := problems.CheckQueue(asynq.NewInspectorFromRedisClient(env.Client), queue); len(problems) > 0 || info.Processed == 0 {
		t.Errorf("queue: %v %+v", problems, info)
	}

	env.Close(context.Background(), &out, queue)
	closed = true
	if out.Len() > 0 {
		t.Errorf("Close printed %q", out.String())
	}
	rdb := redistest.Client(t)
	for _, pattern := range []string{env.Prefix + "*", "asynq:{" + queue + "}*"} {
		if keys, err := rdb.Keys(context.Background(), pattern).Result(); err != nil || len(keys) > 0 {
			t.Errorf("left behind %q: %v %v", pattern, keys, err)
		}
	}
}

func TestStartWorkersError(t *testing.T) {
	env, err := Setup("kittest", "", fakeapi.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close(context.Background(), &bytes.Buffer{})
	if !env.Redis.Embedded() || !strings.HasPrefix(env.Prefix, "taskrl-example:kittest-") || !strings.HasPrefix(env.URL, "http://") {
		t.Errorf("env %+v", env)
	}
	if err := env.StartWorkers(Workers{N: 1, Config: taskrl.Config{}}); err == nil {
		t.Error("a middleware without a policy started")
	}
}

func TestSetupError(t *testing.T) {
	if _, err := Setup("kittest", "", fakeapi.Limits{Latency: -1}); err == nil {
		t.Error("bad limits accepted")
	}
}

// TestCaller checks the request a Caller sends and how it maps the answers.
func TestCaller(t *testing.T) {
	var got *http.Request
	status, retryAfter := http.StatusOK, ""
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(status)
	}))
	defer srv.Close()
	var ok, throttled atomic.Int64
	c := &Caller{URL: srv.URL + "/v1", Name: "vendor", OK: &ok, Throttled: &throttled}
	ctx := context.Background()

	if err := c.ProcessTask(ctx, asynq.NewTask("t", []byte(`{"business_id":"b7"}`))); err != nil || ok.Load() != 1 {
		t.Fatalf("2xx: %v, ok %d", err, ok.Load())
	}
	if got.Method != http.MethodPost || got.URL.Path != "/v1" || got.Header.Get("X-Business-ID") != "b7" {
		t.Errorf("request %s %s, X-Business-ID %q", got.Method, got.URL.Path, got.Header.Get("X-Business-ID"))
	}

	c.Method = http.MethodPut
	if err := c.ProcessTask(ctx, asynq.NewTask("t", []byte(`{"id":1}`))); err != nil {
		t.Fatal(err)
	}
	if _, set := got.Header["X-Business-Id"]; got.Method != http.MethodPut || set {
		t.Errorf("request %s, X-Business-ID set %v", got.Method, set)
	}

	status, retryAfter = http.StatusTooManyRequests, "3"
	var te *taskrl.ThrottledError
	if err := c.ProcessTask(ctx, asynq.NewTask("t", []byte(`{}`))); !errors.As(err, &te) || te.RetryAfter != 3*time.Second || throttled.Load() != 1 || !strings.Contains(err.Error(), "vendor: 429") {
		t.Errorf("429: %v (%+v), throttled %d", err, te, throttled.Load())
	}

	status, retryAfter = http.StatusInternalServerError, ""
	if err := c.ProcessTask(ctx, asynq.NewTask("t", []byte(`{}`))); err == nil || errors.Is(err, asynq.SkipRetry) || errors.As(err, &te) {
		t.Errorf("500: %v", err)
	}
	if err := c.ProcessTask(ctx, asynq.NewTask("t", []byte(`not json`))); !errors.Is(err, asynq.SkipRetry) {
		t.Errorf("bad payload: %v", err)
	}
	if ok.Load() != 2 {
		t.Errorf("ok %d", ok.Load())
	}
}

func TestVerdict(t *testing.T) {
	var out bytes.Buffer
	var p Problems
	if err := p.Verdict(&out, "all good."); err != nil || out.String() != "OK: all good.\n" {
		t.Errorf("%v %q", err, out.String())
	}
	out.Reset()
	p = append(p, "interrupted")
	p.Addf("%d lost", 2)
	if err := p.Verdict(&out, "all good."); err == nil || err.Error() != "interrupted; 2 lost" || out.String() != "FAILED: interrupted; 2 lost\n" {
		t.Errorf("%v %q", err, out.String())
	}
}

func TestAnswered(t *testing.T) {
	api, err := fakeapi.New(fakeapi.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"a", "b", "b", "x"} {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header.Set("Idempotency-Key", key)
		api.ServeHTTP(httptest.NewRecorder(), r)
	}
	if never, repeated := Answered(api, []string{"a", "b", "c"}); never != 1 || repeated != 1 {
		t.Errorf("never %d, repeated %d", never, repeated)
	}
}

func TestIndent(t *testing.T) {
	if got := Indent("# c\nrules:\n  - x\n\n"); got != "  # c\n  rules:\n    - x" {
		t.Errorf("%q", got)
	}
}
