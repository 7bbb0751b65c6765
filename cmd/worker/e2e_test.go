package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// call is one request the stand-in API received.
type call struct {
	Path, Key, Business, ContentType, Test, Body string
}

// api is a stand-in for a third-party API: /ok answers 200, /missing 404,
// /throttle 429 (Retry-After: 1) the first time and 200 after.
type api struct {
	*httptest.Server
	mu        sync.Mutex
	calls     []call
	throttled bool
}

func newAPI(t *testing.T) *api {
	a := &api{}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		a.mu.Lock()
		a.calls = append(a.calls, call{Path: r.URL.Path, Key: r.Header.Get("Idempotency-Key"), Business: r.Header.Get("X-Business-ID"),
			ContentType: r.Header.Get("Content-Type"), Test: r.Header.Get("X-Test"), Body: string(b)})
		first := r.URL.Path == "/throttle" && !a.throttled
		if first {
			a.throttled = true
		}
		a.mu.Unlock()
		switch {
		case r.URL.Path == "/missing":
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"error": "no such account"}`)
		case first:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	t.Cleanup(a.Close)
	return a
}

func (a *api) byPath(path string) []call {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []call
	for _, c := range a.calls {
		if c.Path == path {
			out = append(out, c)
		}
	}
	return out
}

// eventually polls cond until it is true, failing the test after 60s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 60s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// passwordServer starts a private Redis that requires a password.
func passwordServer(t *testing.T, password string) (addr string, client *redis.Client) {
	t.Helper()
	srv := redistest.StartServer(t)
	ctx := context.Background()
	if err := srv.Client(t).ConfigSet(ctx, "requirepass", password).Err(); err != nil {
		t.Fatal(err)
	}
	client = redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: password})
	t.Cleanup(func() {
		// Let the harness stop the server without a password.
		client.ConfigSet(ctx, "requirepass", "")
		client.Close()
	})
	return srv.Addr(), client
}

// TestEndToEnd runs the worker in-process against a password-protected
// Redis and a stand-in API: http:call tasks are sent with the right headers
// and bodies, a 429 reschedules the task with the same Idempotency-Key,
// a 404 is archived with the reason, /metrics and /healthz answer, the
// password never reaches the logs, and cancelling the context stops the
// worker with status 0. Under --allow-hosts, calls to another host, to a
// cloud metadata address (as an IPv4-mapped IPv6 literal too) and through
// a redirect to another host are archived with the reason, never sent.
func TestEndToEnd(t *testing.T) {
	const password = "s3cret-pw"
	addr, rc := passwordServer(t, password)
	a := newAPI(t)
	forbidden := newAPI(t)
	redirector := httptest.NewServer(http.RedirectHandler(forbidden.URL+"/ok", http.StatusFound))
	defer redirector.Close()
	allow := strings.TrimPrefix(a.URL, "http://") + "," + strings.TrimPrefix(redirector.URL, "http://")
	const queue = "e2e"
	policy := writePolicy(t, `rules:
  - name: e2e-global
    match: {queue: `+queue+`}
    gcra: {rate: 200, per: 1s, burst: 20}
  - name: e2e-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 100, per: 1s, burst: 5}
  - name: e2e-concurrency
    match: {type: "http:call"}
    key: "{{.business_id}}"
    concurrency: {max: 2, lease: 30s}
  - name: elsewhere
    match: {queue: not-served}
    gcra: {rate: 1, per: 1s}
`)
	logs := &logBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	var code int
	go func() {
		defer close(done)
		code = cli(ctx, []string{"--redis", "redis://:" + password + "@" + addr + "/0", "--policy", policy, "--concurrency", "4",
			"--queues", queue + "=3,other=1", "--metrics-addr", "127.0.0.1:0", "--prefix", "e2e:", "--max-payload", "64KiB",
			"--allow-hosts", allow}, noEnv, io.Discard, logs)
	}()
	metricsAddr := logs.waitFor(t, regexp.MustCompile(`level=INFO msg="metrics listening" addr=(\S+)`), done)[1]
	started := logs.waitFor(t, regexp.MustCompile(`msg="worker started".*`), done)[0]
	for _, want := range []string{`redis="` + addr + ` db 0"`, `queues="` + queue + `=3,other=1"`, "concurrency=4", "rules=\"[e2e-global e2e-business e2e-concurrency elsewhere]\"", "redis_unavailable=closed"} {
		if !strings.Contains(started, want) {
			t.Errorf("start line %q lacks %q", started, want)
		}
	}
	logs.waitFor(t, regexp.MustCompile(`policy rules match queues this worker does not serve.*not-served`), done)
	logs.waitFor(t, regexp.MustCompile(`msg="http:call may call only the allowed hosts" allow_hosts=.*from=--allow-hosts`), done)

	client := asynq.NewClientFromRedisClient(rc)
	inspector := asynq.NewInspectorFromRedisClient(rc)
	enqueue := func(p map[string]any) string {
		t.Helper()
		b, _ := json.Marshal(p)
		info, err := client.Enqueue(asynq.NewTask("http:call", b), asynq.Queue(queue))
		if err != nil {
			t.Fatal(err)
		}
		return info.ID
	}
	const n = 6
	ids := map[string]int{} // task ID -> n
	for i := 0; i < n; i++ {
		ids[enqueue(map[string]any{"url": a.URL + "/ok", "business_id": fmt.Sprintf("b%d", i%3+1),
			"headers": map[string]string{"X-Test": "yes"}, "body": map[string]any{"n": i}})] = i
	}
	missingID := enqueue(map[string]any{"url": a.URL + "/missing", "business_id": "b1"})
	// Past --max-payload: archived with the reason, never decoded or sent.
	hugeID := enqueue(map[string]any{"url": a.URL + "/huge", "business_id": "b1", "body": strings.Repeat("x", 65<<10)})
	throttleID := enqueue(map[string]any{"url": a.URL + "/throttle", "business_id": "b9", "method": "PUT"})
	// Refused by the egress policy: archived with the reason, never sent.
	refused := map[string]string{
		enqueue(map[string]any{"url": forbidden.URL + "/ok", "business_id": "r1"}):                               "not in the allowed hosts",
		enqueue(map[string]any{"url": redirector.URL + "/go", "business_id": "r2"}):                              "not in the allowed hosts",
		enqueue(map[string]any{"url": "http://169.254.169.254/latest/meta-data/", "business_id": "r3"}):          "link-local address",
		enqueue(map[string]any{"url": "http://[::ffff:169.254.169.254]/latest/meta-data/", "business_id": "r4"}): "link-local address",
	}

	eventually(t, "all tasks called", func() bool {
		return len(a.byPath("/ok")) >= n && len(a.byPath("/throttle")) >= 2 && len(a.byPath("/missing")) >= 1
	})
	eventually(t, "404 task archived", func() bool {
		ti, err := inspector.GetTaskInfo(queue, missingID)
		return err == nil && ti.State == asynq.TaskStateArchived
	})

	// Every task was called once, with its own ID as Idempotency-Key.
	seen := map[string]bool{}
	for _, c := range a.byPath("/ok") {
		i, ok := ids[c.Key]
		switch {
		case !ok:
			t.Errorf("call with Idempotency-Key %q, not a task ID", c.Key)
		case seen[c.Key]:
			t.Errorf("task %s called twice", c.Key)
		case c.Business != fmt.Sprintf("b%d", i%3+1) || c.ContentType != "application/json" || c.Test != "yes" || c.Body != fmt.Sprintf(`{"n":%d}`, i):
			t.Errorf("task %d: request %+v", i, c)
		}
		seen[c.Key] = true
	}
	// The throttled task came back under its own ID, the same
	// Idempotency-Key.
	for _, c := range a.byPath("/throttle") {
		if c.Key != throttleID || c.Business != "b9" {
			t.Errorf("throttled task's call %+v, want Idempotency-Key %s", c, throttleID)
		}
	}
	ti, err := inspector.GetTaskInfo(queue, missingID)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ti.LastErr, "404 Not Found") || !strings.Contains(ti.LastErr, "no such account") {
		t.Errorf("404 archived with reason %q", ti.LastErr)
	}
	eventually(t, "the task past --max-payload archived", func() bool {
		ti, err := inspector.GetTaskInfo(queue, hugeID)
		return err == nil && ti.State == asynq.TaskStateArchived
	})
	if ti, err := inspector.GetTaskInfo(queue, hugeID); err != nil || !strings.Contains(ti.LastErr, "is larger than --max-payload (65536 bytes); not decoded") {
		t.Errorf("the task past --max-payload: %v, %+v", err, ti)
	}
	if calls := a.byPath("/huge"); len(calls) != 0 {
		t.Errorf("the task past --max-payload was sent %d times", len(calls))
	}
	// A task the limits held back is archived under its own ID.
	archived := func(id string) *asynq.TaskInfo {
		l, _ := inspector.ListArchivedTasks(queue)
		for _, ti := range l {
			if ti.ID == id {
				return ti
			}
		}
		return nil
	}
	for id, why := range refused {
		eventually(t, "the refused call archived", func() bool { return archived(id) != nil })
		if ti := archived(id); !strings.Contains(ti.LastErr, "egress refused") || !strings.Contains(ti.LastErr, why) || ti.Retried != 0 {
			t.Errorf("refused call archived with reason %q after %d retries; want one saying %q", ti.LastErr, ti.Retried, why)
		}
	}
	if n := len(forbidden.byPath("/ok")); n != 0 {
		t.Errorf("the host not on --allow-hosts got %d calls", n)
	}
	qi, err := inspector.GetQueueInfo(queue)
	if err != nil {
		t.Fatal(err)
	}
	if qi.Archived != 6 || qi.Retry != 0 {
		t.Errorf("queue has %d archived and %d retry tasks, want 6 and 0", qi.Archived, qi.Retry)
	}

	// Metrics: every documented name, with the counts of this run.
	wantLines := []string{
		`taskrl_http_calls_total{code="2xx"} 7`,
		`taskrl_http_calls_total{code="429"} 1`,
		`taskrl_http_calls_total{code="4xx"} 1`,
		`taskrl_http_calls_total{code="refused"} 4`,
		`taskrl_decisions_total{outcome="upstream_throttled",queue="` + queue + `",rule="none",type="http:call"} 1`,
		`taskrl_redis_errors_total 0`,
	}
	var body string
	ok := false
	deadline := time.Now().Add(20 * time.Second)
	for !ok && time.Now().Before(deadline) {
		_, body = get(t, "http://"+metricsAddr+"/metrics")
		ok = true
		for _, l := range wantLines {
			ok = ok && strings.Contains(body, l+"\n")
		}
		if !ok {
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, l := range wantLines {
		if !strings.Contains(body, l+"\n") {
			t.Errorf("/metrics lacks %s:\n%s", l, body)
		}
	}
	for _, name := range []string{"taskrl_decisions_total{", "taskrl_hold_seconds_bucket{", "taskrl_reschedule_delay_seconds_count", "taskrl_upstream_throttle_seconds_count 1",
		`taskrl_quota_remaining{rule="e2e-global"}`, `taskrl_quota_remaining{rule="e2e-business"}`, "go_goroutines", "process_resident_memory_bytes"} {
		if !strings.Contains(body, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	// Healthy; the test's Redis runs without persistence, a detail.
	if code, body := get(t, "http://"+metricsAddr+"/healthz"); code != 200 || !strings.HasPrefix(body, "ok\nwarning: Redis "+addr+" keeps nothing across a restart") {
		t.Errorf("/healthz: %d %q", code, body)
	}
	for _, path := range []string{"/debug/pprof/", "/metrics/x", "/limits/x", "/healthz/x", "/status.html"} {
		if code, _ := get(t, "http://"+metricsAddr+path); code != http.StatusNotFound {
			t.Errorf("%s: %d, want 404: the metrics server serves /metrics, /healthz, /limits and / only", path, code)
		}
	}

	cancel()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("worker did not stop within 60s of its context ending")
	}
	if code != exitOK {
		t.Errorf("exit %d, want 0; log:\n%s", code, logs)
	}
	out := logs.String()
	if !strings.Contains(out, `msg="worker stopped"`) {
		t.Errorf("no stop line in the log:\n%s", out)
	}
	if strings.Contains(out, password) {
		t.Errorf("the log shows the Redis password:\n%s", out)
	}
}
