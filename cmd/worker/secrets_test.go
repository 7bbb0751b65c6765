package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// TestSecretsNeverShown runs both binaries with a Redis password and
// payloads whose headers carry a credential, through every outcome of
// http:call (2xx, 404, 500, 429, refused by the egress policy, a redirect
// to a forbidden host, a bad header) and through failures to start (wrong
// password, unreachable Redis, a bad URL), with debug JSON logs; then
// greps every output channel for the secrets: both binaries' stdout and
// stderr, /metrics, /limits, /, worker status (text and JSON), worker
// limits list and the reasons of the archived tasks. None may hold one.
func TestSecretsNeverShown(t *testing.T) {
	const (
		password = "redis-PW-5c1e7a"  // the Redis password
		wrongPW  = "other-PW-77d0b3"  // a wrong one, as secret as the right one
		header   = "HDR-S3CRET-91b2f" // a credential in payload headers
	)
	addr, rc := passwordServer(t, password)
	var mu sync.Mutex
	sent := 0 // requests that carried the credential
	forbidden := httptest.NewServer(http.NotFoundHandler())
	defer forbidden.Close()
	throttled := false
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.Header.Get("Authorization") == "Bearer "+header {
			sent++
		}
		switch r.URL.Path {
		case "/missing":
			http.Error(w, "no such account", http.StatusNotFound)
		case "/fail":
			http.Error(w, "upstream broke", http.StatusInternalServerError)
		case "/throttle":
			if !throttled {
				throttled = true
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusTooManyRequests)
			}
		case "/redirect":
			http.Redirect(w, r, forbidden.URL+"/x", http.StatusFound)
		}
	}))
	defer api.Close()

	workerBin, enqueueBin := workerAndEnqueue(t)
	queue := redistest.Queue(t, rc, "secrets")
	policy := writePolicy(t, `rules:
  - name: s-global
    match: {queue: `+queue+`}
    gcra: {rate: 50, per: 1s, burst: 10}
  - name: s-business
    match: {queue: `+queue+`}
    key: "{{.business_id}}"
    gcra: {rate: 20, per: 1s, burst: 2}
  - name: s-concurrency
    match: {queue: `+queue+`}
    key: "{{.business_id}}"
    concurrency: {max: 2, lease: 30s}
`)
	var lines []string
	add := func(i int, url string, headers map[string]string) {
		b, _ := json.Marshal(map[string]any{"url": url, "business_id": fmt.Sprintf("b%d", i), "headers": headers, "body": map[string]int{"n": i}})
		lines = append(lines, string(b))
	}
	creds := map[string]string{"Authorization": "Bearer " + header, "X-Api-Key": header}
	for i, u := range []string{api.URL + "/ok", api.URL + "/missing", api.URL + "/fail", api.URL + "/throttle", api.URL + "/redirect",
		forbidden.URL + "/x", "http://169.254.169.254/latest/meta-data/"} {
		add(i, u, creds)
	}
	add(7, api.URL+"/ok", map[string]string{"X-Bad": header + "\n"}) // a header value that cannot be sent
	const archivedWant = 6                                           // all but /ok and /throttle
	payloads := filepath.Join(t.TempDir(), "payloads.jsonl")
	if err := os.WriteFile(payloads, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	out := map[string]string{} // output channel -> what it showed
	run := func(name, bin string, args ...string) int {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0", "REDIS_URL=")
		b, _ := cmd.CombinedOutput()
		out[name] = string(b)
		return cmd.ProcessState.ExitCode()
	}
	withPW := "redis://:" + password + "@" + addr
	if code := run("enqueue", enqueueBin, "--redis", withPW, "--payload-file", payloads, "--queue", queue, "--max-retry", "0"); code != 0 {
		t.Fatalf("enqueue: exit %d:\n%s", code, out["enqueue"])
	}
	run("enqueue, wrong password", enqueueBin, "--redis", "redis://:"+wrongPW+"@"+addr, "--payload-file", payloads, "--queue", queue)
	run("enqueue, unreachable", enqueueBin, "--redis", "redis://:"+password+"@127.0.0.1:1", "--count", "1", "--url", api.URL, "--queue", queue)
	run("enqueue, bad URL", enqueueBin, "--redis", "redis://:"+password+"@host:port/x", "--count", "1", "--url", api.URL)
	run("enqueue, password flag", enqueueBin, "--redis", addr, "--redis-password", wrongPW, "--count", "1", "--url", api.URL, "--queue", queue)

	w := startWorker(t, workerBin, "--redis", "redis://"+addr, "--redis-password", password, "--policy", policy, "--queues", queue,
		"--concurrency", "4", "--metrics-addr", "127.0.0.1:0", "--log-level", "debug", "--log-format", "json",
		"--allow-hosts", strings.TrimPrefix(api.URL, "http://"), "--task-check-interval", "100ms")
	metrics := w.logs.waitFor(t, regexp.MustCompile(`"msg":"metrics listening","addr":"([^"]+)"`), w.done)[1]
	inspector := asynq.NewInspectorFromRedisClient(rc)
	eventually(t, "every task done or archived", func() bool {
		qi, err := inspector.GetQueueInfo(queue)
		return err == nil && qi.Archived == archivedWant && qi.Pending+qi.Active+qi.Scheduled+qi.Retry == 0
	})
	for _, path := range []string{"/metrics", "/limits", "/"} {
		_, out["GET "+path] = get(t, "http://"+metrics+path)
	}
	run("worker status", workerBin, "status", "--redis", withPW, "--policy", policy)
	run("worker status --json", workerBin, "status", "--redis", withPW, "--policy", policy, "--json")
	run("worker limits list", workerBin, "limits", "list", "--redis", "redis://"+addr, "--redis-password", password)
	if code := w.stop(t, syscall.SIGTERM); code != exitOK {
		t.Errorf("worker exit %d", code)
	}
	out["worker"] = w.logs.String()
	archived, err := inspector.ListArchivedTasks(queue)
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range archived {
		out["archived "+ti.ID] = ti.LastErr
	}
	// Failing to start.
	for name, args := range map[string][]string{
		"worker, wrong password": {"--redis", "redis://:" + wrongPW + "@" + addr, "--policy", policy, "--log-level", "debug", "--log-format", "json"},
		"worker, password flag":  {"--redis", addr, "--redis-password", wrongPW, "--policy", policy, "--log-level", "debug"},
		"worker, unreachable":    {"--redis", "redis://:" + password + "@127.0.0.1:1", "--policy", policy, "--log-level", "debug", "--log-format", "json"},
		"worker, bad URL":        {"--redis", "redis://:" + password + "@host:port", "--policy", policy},
		"worker, bad cluster":    {"--redis-cluster", "redis://:" + password + "@127.0.0.1:1?addr=x:y", "--policy", policy, "--log-level", "debug"},
		"worker status, wrong":   {"status", "--redis", "redis://:" + wrongPW + "@" + addr, "--policy", policy},
	} {
		if code := run(name, workerBin, args...); code == exitOK {
			t.Errorf("%s: exit 0:\n%s", name, out[name])
		}
	}

	// The secrets were there to leak: sent where allowed, logged about.
	mu.Lock()
	if sent == 0 {
		t.Errorf("no request carried the credential")
	}
	mu.Unlock()
	if len(archived) != archivedWant || !strings.Contains(out["worker"], `"level":"DEBUG"`) || !strings.Contains(out["worker, wrong password"], "WRONGPASS") || !strings.Contains(out["worker status, wrong"], "WRONGPASS") {
		t.Errorf("%d archived (want %d), or no debug log, or no password error:\n%s\n%s", len(archived), archivedWant, out["worker"], out["worker, wrong password"])
	}
	for name, text := range out {
		for _, secret := range []string{password, wrongPW, header} {
			if strings.Contains(text, secret) {
				t.Errorf("%s shows the secret %q:\n%s", name, secret, text)
			}
		}
	}
}
