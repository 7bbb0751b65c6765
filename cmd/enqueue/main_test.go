package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/quotas"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// enqueue runs the command in-process with env as its environment.
func enqueue(ctx context.Context, env map[string]string, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(ctx, args, stdio{
		stdout: &out,
		stderr: &errOut,
		getenv: func(k string) string { return env[k] },
	})
	return code, out.String(), errOut.String()
}

type httpPayload struct {
	URL        string `json:"url"`
	Method     string `json:"method"`
	BusinessID string `json:"business_id"`
}

var summary = regexp.MustCompile(`^enqueued (\d+) tasks to queue "([^"]+)" in \S+ \(\d+/s\)\n$`)

func TestCountRoundRobin(t *testing.T) {
	rdb := redistest.Client(t)
	q := redistest.Queue(t, rdb, "q")
	code, out, errOut := enqueue(context.Background(), nil, "--redis", redistest.Addr(t), "--url", "http://api.example/v1/send?x=1&y=2",
		"--count", "10", "--businesses", "3", "--queue", q, "--max-retry", "0")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if m := summary.FindStringSubmatch(out); m == nil || m[1] != "10" || m[2] != q {
		t.Errorf("summary %q", out)
	}
	ts := redistest.Pending(t, rdb, q)
	if len(ts) != 10 {
		t.Fatalf("%d pending tasks, want 10", len(ts))
	}
	var ids []string
	for _, ti := range ts {
		var p httpPayload
		dec := json.NewDecoder(bytes.NewReader(ti.Payload))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("payload %s: %v", ti.Payload, err)
		}
		if p.URL != "http://api.example/v1/send?x=1&y=2" || p.Method != "POST" || ti.Type != "http:call" || ti.Queue != q || ti.MaxRetry != 0 {
			t.Errorf("task %+v payload %+v", ti, p)
		}
		ids = append(ids, p.BusinessID)
	}
	// Task i has b(i%3+1): 4 × b1, 3 × b2, 3 × b3 (enqueued in parallel, so
	// compare as multisets).
	sort.Strings(ids)
	if got := strings.Join(ids, ","); got != "b1,b1,b1,b1,b2,b2,b2,b3,b3,b3" {
		t.Errorf("business ids %s", got)
	}
}

func TestDefaultsFromEnv(t *testing.T) {
	rdb := redistest.Client(t)
	q := redistest.Queue(t, rdb, "q")
	// REDIS_URL is the default for --redis; without --max-retry, asynq's
	// default; without --type, http:call.
	env := map[string]string{"REDIS_URL": "redis://" + redistest.Addr(t) + "/0"}
	code, _, errOut := enqueue(context.Background(), env, "--url", "http://x", "--count", "3", "--queue", q)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	ts := redistest.Pending(t, rdb, q)
	if len(ts) != 3 {
		t.Fatalf("%d pending tasks, want 3", len(ts))
	}
	for _, ti := range ts {
		if ti.MaxRetry != 25 || ti.Type != "http:call" || !strings.Contains(string(ti.Payload), `"business_id":"b1"`) {
			t.Errorf("task %+v %s", ti, ti.Payload)
		}
		info, err := asynq.NewInspectorFromRedisClient(rdb).GetTaskInfo(q, ti.ID)
		if err != nil || info.MaxRetry != 25 {
			t.Errorf("GetTaskInfo: %+v, %v", info, err)
		}
	}
	// A bad REDIS_URL is named as such.
	code, _, errOut = enqueue(context.Background(), map[string]string{"REDIS_URL": "redis://:s3cret@host:port/0"}, "--url", "http://x", "--count", "3")
	if code != 2 || !strings.Contains(errOut, "REDIS_URL") || strings.Contains(errOut, "s3cret") {
		t.Errorf("bad REDIS_URL (named, password not shown): exit %d: %s", code, errOut)
	}
}

func TestPayloadFile(t *testing.T) {
	rdb := redistest.Client(t)
	q := redistest.Queue(t, rdb, "q")
	lines := []string{`{"url": "http://a", "business_id": "b7", "body": {"n": 1}}`, "", "   ", `{"to":"x@example.com"}`, `{}`}
	file := filepath.Join(t.TempDir(), "p.jsonl")
	os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600)
	code, out, errOut := enqueue(context.Background(), nil, "--redis", redistest.Addr(t), "--type", "email:send", "--payload-file", file, "--queue", q, "--max-retry", "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if m := summary.FindStringSubmatch(out); m == nil || m[1] != "3" {
		t.Errorf("summary %q", out)
	}
	var got []string
	for _, ti := range redistest.Pending(t, rdb, q) {
		if ti.Type != "email:send" || ti.MaxRetry != 3 {
			t.Errorf("task %+v", ti)
		}
		got = append(got, string(ti.Payload))
	}
	sort.Strings(got)
	want := []string{`{"to":"x@example.com"}`, `{"url":"http://a","business_id":"b7","body":{"n":1}}`, `{}`}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("payloads\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestPayloadFileBadLine(t *testing.T) {
	rdb := redistest.Client(t)
	q := redistest.Queue(t, rdb, "q")
	dir := t.TempDir()
	for _, c := range []struct{ content, want string }{
		{"{\"a\":1}\n\n{\"a\":2\n{\"a\":3}\n", "line 3: not valid JSON"},
		{"{\"a\":1}\n[1,2]\n", "line 2: not a JSON object (found a JSON array)"},
		{"{\"a\":1}\nnull\n", "line 2: not a JSON object (found null)"},
		{"{\"a\":1} {\"b\":2}\n", "line 1: not valid JSON"},
		{"\n\n", "no payloads"},
	} {
		file := filepath.Join(dir, "p.jsonl")
		os.WriteFile(file, []byte(c.content), 0o600)
		code, _, errOut := enqueue(context.Background(), nil, "--redis", redistest.Addr(t), "--payload-file", file, "--queue", q)
		if code != 2 || !strings.Contains(errOut, c.want) || !strings.Contains(errOut, "--payload-file "+file) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", c.content, code, errOut, c.want)
		}
	}
	if n := len(redistest.Pending(t, rdb, q)); n != 0 {
		t.Errorf("%d tasks enqueued from bad files", n)
	}
}

func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	os.WriteFile(policy, []byte("rules: [{name: r, match: {type: http:call}, gcra: {rate: 1, per: 1s}}]\n"), 0o600)
	payloads := filepath.Join(dir, "p.jsonl")
	os.WriteFile(payloads, []byte("{}\n"), 0o600)
	ca := redistest.NewTestPKI(t).CAFile
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--url", "http://x"}, "--count: required"},
		{[]string{"--url", "http://x", "--count", "0"}, "--count: must be at least 1, got 0"},
		{[]string{"--url", "http://x", "--count", "ten"}, "-count"},
		{[]string{"--count", "5"}, "--url: required"},
		{[]string{"--url", "/relative", "--count", "5"}, "--url:"},
		{[]string{"--url", "http://x", "--count", "5", "--businesses", "0"}, "--businesses: must be at least 1"},
		{[]string{"--url", "http://x", "--count", "5", "--max-retry", "-1"}, "--max-retry: must not be negative"},
		{[]string{"--url", "http://x", "--count", "5", "--queue", ""}, "--queue: must not be blank"},
		{[]string{"--url", "http://x", "--count", "5", "--type", ""}, "--type: must not be blank"},
		{[]string{"--url", "http://x", "--count", "5", "--type", "taskrl:fanout"}, "--type:"},
		{[]string{"--url", "http://x", "--count", "5", "--parallel", "0"}, "--parallel: must be at least 1"},
		{[]string{"--count", "5", "--payload-file", payloads}, "--count: not allowed with --payload-file"},
		{[]string{"--payload-file", filepath.Join(dir, "missing.jsonl")}, "--payload-file: open"},
		{[]string{"--url", "http://x", "--count", "5", "--tz", "UTC"}, "--tz: only used with --cron"},
		{[]string{"--url", "http://x", "--count", "5", "--campaign", "x"}, "--campaign: only used with --cron"},
		{[]string{"--url", "http://x", "--count", "5", "--cron", "0 9 * *"}, "--cron: bad cron spec \"0 9 * *\": expected exactly 5 fields"},
		{[]string{"--url", "http://x", "--count", "5", "--cron", "@every 500ms"}, "--cron:"},
		{[]string{"--url", "http://x", "--count", "5", "--cron", "@daily", "--tz", "Mars/Olympus"}, `--tz: unknown time zone "Mars/Olympus"`},
		{[]string{"--url", "http://x", "--count", "5", "--cron", "@daily", "--campaign", "a b"}, "--campaign:"},
		{[]string{"--url", "http://x", "--count", "5", "--cron", "@daily", "--key-prefix", "{x"}, "--key-prefix: prefix \"{x\" contains '{'"},
		{[]string{"--url", "http://x", "--count", "5", "--dry-run"}, "--policy: required with --dry-run"},
		{[]string{"--url", "http://x", "--count", "5", "--policy", policy}, "--policy: only used with --dry-run"},
		{[]string{"--url", "http://x", "--count", "5", "--max-waiting", "5"}, "--max-waiting: needs --policy"},
		{[]string{"--url", "http://x", "--count", "5", "--prefix", "app:"}, "--prefix: only used with --max-waiting or --dry-run"},
		{[]string{"--url", "http://x", "--count", "5", "--max-waiting", "5", "--policy", policy, "--prefix", "a{b"}, "--prefix: "},
		{[]string{"--url", "http://x", "--count", "5", "--max-waiting", "-1", "--policy", policy}, "--max-waiting: must be 0 or more, got -1"},
		{[]string{"--url", "http://x", "--count", "5", "--max-waiting", "5", "--policy", policy, "--cron", "@daily"}, "--max-waiting: only for tasks enqueued now"},
		{[]string{"--url", "http://x", "--count", "5", "--max-waiting", "5", "--dry-run", "--policy", policy}, "--max-waiting: only for tasks enqueued now"},
		{[]string{"--url", "http://x", "--count", "5", "--dry-run", "--policy", policy, "--task-duration", "0s"}, "--task-duration: must be positive"},
		{[]string{"--url", "http://x", "--count", "5", "--dry-run", "--policy", policy, "--start", "tomorrow"}, "--start:"},
		{[]string{"--url", "http://x", "--count", "5", "--dry-run", "--policy", filepath.Join(dir, "none.yaml")}, "none.yaml"},
		{[]string{"--url", "http://x", "--count", "5", "--redis", "not a url"}, "--redis:"},
		{[]string{"--url", "http://x", "--count", "5", "--redis", "a:1", "--redis-cluster", "b:1,c:1"}, "are exclusive"},
		{[]string{"--url", "http://x", "--count", "5", "--redis-cluster", "b:1,c:x"}, `--redis-cluster: node "c:x": port must be a number`},
		{[]string{"--url", "http://x", "--count", "5", "--redis-cluster", "redis://:hunter2@b:x?addr=c:1"}, "--redis-cluster: not a valid Redis Cluster URL"},
		{[]string{"--url", "http://x", "--count", "5", "--redis-sentinel", "m@a:1", "--redis-cluster", "b:1,c:1"}, "are exclusive"},
		{[]string{"--url", "http://x", "--count", "5", "--redis-sentinel", "a:1"}, "--redis-sentinel: no primary name before @"},
		{[]string{"--url", "http://x", "--count", "5", "--redis-sentinel", "redis://:hunter2@s:x?master_name=m"}, "--redis-sentinel: not a valid Redis Sentinel URL"},
		{[]string{"--url", "http://x", "--count", "5", "--redis", "rediss://:hunter2@a:1?skip_verify=true"}, "--redis: skip_verify is refused: the server's certificate is always verified"},
		{[]string{"--url", "http://x", "--count", "5", "--redis", "redis://:hunter2@a:1", "--redis-tls-ca", ca}, "--redis-tls-ca: a CA file is for TLS, which is not on: use a rediss:// URL or --redis-tls"},
		{[]string{"--url", "http://x", "--count", "5", "--redis-cluster", "a:1,b:1", "--redis-tls-ca", ca}, "--redis-tls-ca: a CA file is for TLS, which is not on"},
		{[]string{"--url", "http://x", "--count", "5", "--redis", "rediss://:hunter2@a:1", "--redis-tls-ca", payloads}, "--redis-tls-ca: " + payloads + " holds no PEM certificate"},
		{[]string{"--url", "http://x", "--count", "5", "--redis", "a:1", "--redis-tls", "--redis-tls-ca", payloads + ".none"}, "--redis-tls-ca: open " + payloads + ".none: no such file"},
		{[]string{"--simulate", "--policy", policy, "--vendor", "5/s", "--redis-tls-ca", ca}, "--redis-tls-ca: not used with --simulate"},
		{[]string{"--simulate", "--policy", policy, "--vendor", "5/s", "--retry-after", "soon"}, `--retry-after: retry-after must be whole, exact or none, got "soon"`},
		{[]string{"--url", "http://x", "--count", "5", "--retry-after", "exact"}, "--retry-after: only used with --simulate"},
		{[]string{"--url", "http://x", "--count", "5", "extra"}, `unexpected argument "extra"`},
		{[]string{"--nope"}, "-nope"},
	} {
		code, out, errOut := enqueue(context.Background(), nil, c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) || out != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, code, out, errOut, c.want)
		}
	}
	// Both forms in the environment and no flag: refused too.
	if code, _, errOut := enqueue(context.Background(), map[string]string{"REDIS_URL": "a:1", "REDIS_CLUSTER_ADDRS": "b:1"}, "--url", "http://x", "--count", "1"); code != 2 || !strings.Contains(errOut, "are exclusive") {
		t.Errorf("REDIS_URL and REDIS_CLUSTER_ADDRS: exit %d, %q", code, errOut)
	}
	if code, _, errOut := enqueue(context.Background(), map[string]string{"REDIS_SENTINEL": "m@a:1", "REDIS_CLUSTER_ADDRS": "b:1"}, "--url", "http://x", "--count", "1"); code != 2 || !strings.Contains(errOut, "are exclusive") {
		t.Errorf("REDIS_SENTINEL and REDIS_CLUSTER_ADDRS: exit %d, %q", code, errOut)
	}
	if code, _, errOut := enqueue(context.Background(), map[string]string{"REDIS_SENTINEL": "no-master"}, "--url", "http://x", "--count", "1"); code != 2 || !strings.Contains(errOut, "REDIS_SENTINEL: no primary name") {
		t.Errorf("a bad REDIS_SENTINEL: exit %d, %q", code, errOut)
	}
	// No password is ever printed.
	for _, args := range [][]string{{"--redis-cluster", "redis://:hunter2@b:x?addr=c:1"}, {"--redis-sentinel", "redis://:hunter2@s:x?master_name=m"}, {"--redis-sentinel", "m@127.0.0.1:1", "--redis-password", "hunter2"}, {"--redis", "redis://:hunter2@host:port/0"}, {"--redis", "127.0.0.1:1", "--redis-password", "hunter2"}} {
		// Two seconds are enough for a refused connection to be reported
		// (a Sentinel's is then tried again for ten).
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, out, errOut := enqueue(ctx, nil, append([]string{"--url", "http://x", "--count", "1"}, args...)...)
		cancel()
		if strings.Contains(out+errOut, "hunter2") {
			t.Errorf("%q: the password appears in the output: %q", args, out+errOut)
		}
	}
	if code, out, _ := enqueue(context.Background(), nil, "--version"); code != 0 || !strings.HasPrefix(out, "enqueue taskrl ") {
		t.Errorf("--version: exit %d, %q", code, out)
	}
	// -h prints the usage on stdout and succeeds.
	if code, out, _ := enqueue(context.Background(), nil, "-h"); code != 0 || !strings.Contains(out, "usage: enqueue --redis URL --type TYPE --url URL --count N") {
		t.Errorf("-h: exit %d, %q", code, out)
	}
}

func TestRedisUnreachable(t *testing.T) {
	srv := redistest.StartServer(t)
	addr := srv.Addr()
	srv.Stop(t)
	code, _, errOut := enqueue(context.Background(), nil, "--redis", addr, "--url", "http://x", "--count", "5")
	if code != 1 || !strings.Contains(errOut, "cannot reach Redis at "+addr) {
		t.Errorf("exit %d, %s", code, errOut)
	}
}

var partial = regexp.MustCompile(`enqueue: (\d+) of (\d+) tasks enqueued to queue "[^"]+"; stopped at: `)

func TestInterruptedReportsExactCount(t *testing.T) {
	rdb := redistest.Client(t)
	q := redistest.Queue(t, rdb, "q")
	// SIGINT/SIGTERM cancel run's context: it stops, says how many tasks
	// it enqueued, and exits 1.
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for {
			if info, err := asynq.NewInspectorFromRedisClient(rdb).GetQueueInfo(q); err == nil && info.Pending > 100 {
				cancel()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	code, _, errOut := enqueue(ctx, nil, "--redis", redistest.Addr(t), "--url", "http://x", "--count", "1000000", "--queue", q, "--parallel", "4")
	cancel()
	m := partial.FindStringSubmatch(errOut)
	if code != 1 || m == nil || m[2] != "1000000" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if n, _ := strconv.Atoi(m[1]); n != len(redistest.Pending(t, rdb, q)) || n < 100 {
		t.Errorf("reported %s enqueued, queue holds %d", m[1], len(redistest.Pending(t, rdb, q)))
	}
	if !strings.Contains(errOut, "context canceled") {
		t.Errorf("stderr %q", errOut)
	}
}

func TestRedisFailsMidway(t *testing.T) {
	srv := redistest.StartServer(t)
	rdb := srv.Client(t)
	go func() {
		insp := asynq.NewInspectorFromRedisClient(rdb)
		for {
			if info, err := insp.GetQueueInfo("default"); err == nil && info.Pending > 100 {
				srv.Stop(t)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	code, _, errOut := enqueue(context.Background(), nil, "--redis", srv.Addr(), "--url", "http://x", "--count", "1000000", "--parallel", "4")
	m := partial.FindStringSubmatch(errOut)
	if code != 1 || m == nil {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if n, _ := strconv.Atoi(m[1]); n < 100 || n >= 1000000 {
		t.Errorf("reported %d enqueued", n)
	}
}

const dryPolicy = `
rules:
  - name: vendor-peak
    match: {type: "http:call"}
    gcra: {rate: 100, per: 1s, burst: 10}
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 1, per: 1s, burst: 1}
  - name: bulk-only
    match: {queue: bulk}
    quota: {limit: 10, every: 1m}
`

func TestDryRun(t *testing.T) {
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	os.WriteFile(policy, []byte(dryPolicy), 0o600)
	// No Redis is reached: --redis points nowhere.
	nowhere := []string{"--redis", "127.0.0.1:1"}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{
			// 1000 tasks, 1000 businesses: the global 100/s burst 10 binds.
			[]string{"--url", "http://x", "--count", "1000", "--businesses", "1000"},
			[]string{
				`dry run: 1000 tasks of type "http:call" on queue "default", limits idle at 2026-05-04 09:00:00.000 UTC`,
				"vendor-peak   100/1s burst 10 (GCRA)  (global)          1     9.90s",
				"per-business  1/1s burst 1 (GCRA)     {{.business_id}}  1000  0.00s",
				"binding rule:                    vendor-peak",
				"estimated duration:              9.90s (until the last task starts)",
				"completes at:                    2026-05-04 09:00:09.900 UTC",
				"tasks no rule matches:           0",
			},
		},
		{
			// 20 businesses × 20 tasks at 1/s each: 19 s alone; the global
			// rule starts 10 of each round 10 ms apart: 19.10 s.
			[]string{"--url", "http://x", "--count", "400", "--businesses", "20"},
			[]string{"per-business  1/1s burst 1 (GCRA)     {{.business_id}}  20    19.00s", "binding rule:                    per-business", "estimated duration:              19.10s"},
		},
		{
			// Tasks of another type: no rule matches.
			[]string{"--url", "http://x", "--count", "7", "--type", "email:send"},
			[]string{"no rule of the policy applies to these tasks: all 7 run without limits"},
		},
		{
			// The bulk queue adds a 10-per-minute window: one business at
			// 1/s, 10 a minute: the last of 25 starts at 2m4s.
			[]string{"--url", "http://x", "--count", "25", "--queue", "bulk"},
			[]string{"bulk-only     10 per 1m0s (fixed window)  (global)          1     120.00s (2m0s)", "binding rule:                    bulk-only", "estimated duration:              124.00s (2m4s)"},
		},
	} {
		args := append(append([]string{"--dry-run", "--policy", policy, "--start", "2026-05-04T09:00:00Z"}, nowhere...), c.args...)
		code, out, errOut := enqueue(context.Background(), nil, args...)
		if code != 0 {
			t.Errorf("%q: exit %d: %s", c.args, code, errOut)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%q: output lacks %q:\n%s", c.args, w, out)
			}
		}
	}
}

// TestDryRunLive: with a Redis given, the estimate starts from what the
// workers hold there: business b1 has its burst of 1 used and 3 tasks
// waiting (the index), so of a campaign of 2 tasks each for b1 and b2,
// b1's start 4 and 5 s out, where idle limits say 1 s; a Redis that does
// not answer gives the idle estimate with a warning.
func TestDryRunLive(t *testing.T) {
	rdb := redistest.Client(t)
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(dryPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := quotas.New(quotas.Config{Client: rdb, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	set, err := quotas.NewSet(quotas.Rule{Name: "per-business", Limit: quotas.GCRA(gcra.Limit{Rate: 1, Period: time.Second, Burst: 1})})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := l.Allow(ctx, set, quotas.Request{Keys: []string{"b1"}}); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	due := float64(time.Now().Add(time.Hour).UnixMicro())
	wk := keys.Waiting(prefix, "per-business", "b1")
	rdb.ZAdd(ctx, wk, redis.Z{Score: due, Member: "t1"}, redis.Z{Score: due, Member: "t2"}, redis.Z{Score: due, Member: "t3"})
	rdb.Expire(ctx, wk, 2*time.Hour)
	args := []string{"--dry-run", "--policy", policy, "--url", "http://x", "--count", "4", "--businesses", "2", "--prefix", prefix}
	code, out, errOut := enqueue(ctx, nil, append(args, "--redis", redistest.Addr(t))...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, w := range []string{"limits as Redis has them at", "already ahead: rule per-business key b1: 1 used, 3 tasks waiting", "binding rule:                    per-business", "estimated duration:              5.00s"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	code, out, errOut = enqueue(ctx, nil, append(args, "--redis", "127.0.0.1:1")...)
	if code != 0 || !strings.Contains(errOut, "cannot reach Redis at 127.0.0.1:1") || !strings.Contains(errOut, "estimating from idle limits") || !strings.Contains(out, "limits idle") || !strings.Contains(out, "estimated duration:              1.00s") {
		t.Errorf("Redis unreachable: exit %d, stderr %q, output:\n%s", code, errOut, out)
	}
}

func TestDryRunMissingKeyField(t *testing.T) {
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	os.WriteFile(policy, []byte(dryPolicy), 0o600)
	file := filepath.Join(dir, "p.jsonl")
	os.WriteFile(file, []byte("{\"business_id\":\"b1\"}\n{\"url\":\"http://x\"}\n{\"business_id\":\"b1\"}\n{\"business_id\":null}\n"), 0o600)
	code, out, errOut := enqueue(context.Background(), nil, "--dry-run", "--policy", policy, "--payload-file", file, "--start", "2026-05-04T09:00:00Z")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, w := range []string{
		`tasks the worker would archive:  2 (first: task 2: taskrl: rule "per-business": payload has no field "business_id")`,
		"estimated duration:              1.00s",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

func TestDryRunCronStartsAtNextTick(t *testing.T) {
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	os.WriteFile(policy, []byte(dryPolicy), 0o600)
	code, out, errOut := enqueue(context.Background(), nil, "--dry-run", "--policy", policy, "--url", "http://x", "--count", "5",
		"--cron", "0 9 * * 1", "--tz", "America/New_York")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	m := regexp.MustCompile(`limits idle at (\d{4}-\d\d-\d\d) 09:00:00.000 E[SD]T`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("output:\n%s", out)
	}
	if d, _ := time.Parse("2006-01-02", m[1]); d.Weekday() != time.Monday {
		t.Errorf("starts on %s, a %s", m[1], d.Weekday())
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestProgressBar(t *testing.T) {
	var w syncBuffer
	var done atomic.Int64
	stop := progress(&w, 200, &done)
	done.Store(120)
	time.Sleep(250 * time.Millisecond) // let the bar redraw at least once
	done.Store(200)
	stop()
	out := w.String()
	if !strings.Contains(out, "enqueue") || !strings.Contains(out, "200/200") || !strings.HasSuffix(out, "\n") {
		t.Errorf("progress output %q", out)
	}
}

func TestBulkDrawsProgressOnTerminal(t *testing.T) {
	rdb := redistest.Client(t)
	q := redistest.Queue(t, rdb, "q")
	var out, errOut syncBuffer
	code := run(context.Background(), []string{"--redis", redistest.Addr(t), "--url", "http://x", "--count", "50", "--queue", q},
		stdio{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }, terminal: true})
	if code != 0 || !strings.Contains(errOut.String(), "50/50") || summary.FindStringSubmatch(out.String()) == nil {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
}

// childEnv carries the arguments of an enqueue process started by
// TestCronTwoProcesses.
const childEnv = "ENQUEUE_TEST_ARGS"

// TestCronChild is the enqueue process of TestCronTwoProcesses: it runs the
// command with the arguments in childEnv until SIGTERM.
func TestCronChild(t *testing.T) {
	raw := os.Getenv(childEnv)
	if raw == "" {
		t.Skip("run by TestCronTwoProcesses")
	}
	var args []string
	if err := json.Unmarshal([]byte(raw), &args); err != nil {
		t.Fatal(err)
	}
	ctx, stop := signalContext()
	defer stop()
	if code := run(ctx, args, stdio{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}); code != 0 {
		t.Fatalf("enqueue exited %d", code)
	}
}

func TestCronTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	rdb := redistest.Client(t)
	q := redistest.Queue(t, rdb, "q")
	prefix := redistest.Prefix(t)
	const perTick = 7
	args := []string{"--redis", redistest.Addr(t), "--url", "http://api.example/x", "--count", strconv.Itoa(perTick), "--businesses", "3",
		"--queue", q, "--max-retry", "0", "--cron", "@every 1s", "--key-prefix", prefix}
	raw, _ := json.Marshal(args)

	// The worker: fan-outs through the handler, http:call tasks recorded
	// by ID (campaign:tick:i).
	w := startWorker(t, rdb, q)

	var outs [2]bytes.Buffer
	var procs [2]*processHandle
	for i := range procs {
		cmd := redistest.Child("TestCronChild", childEnv+"="+string(raw))
		cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[i] = &processHandle{cmd: cmd}
		t.Cleanup(procs[i].kill)
	}
	// Let the schedulers run for a few ticks: real time has to pass, as
	// asynq's scheduler fires by the wall clock.
	w.waitTicks(t, 3, 30*time.Second)
	for i, p := range procs {
		if err := p.terminate(); err != nil {
			t.Errorf("enqueue process %d: %v\n%s", i, err, outs[i].String())
		}
	}
	w.drain(t)

	ticks := w.results()
	if len(ticks) < 3 {
		t.Fatalf("%d ticks fanned out, want at least 3", len(ticks))
	}
	for tick, seen := range ticks {
		if len(seen) != perTick {
			t.Errorf("tick %s: %d tasks, want %d: %v", tick, len(seen), perTick, seen)
		}
		for i, n := range seen {
			if n != 1 {
				t.Errorf("tick %s: task %s ran %d times", tick, i, n)
			}
		}
	}
	// Both schedulers enqueued a fan-out per tick (a period of 1s is too
	// short for asynq.Unique), and the claim let exactly one through.
	fanned, dups := w.outcomes()
	for tick, n := range fanned {
		if n != 1 {
			t.Errorf("tick %s fanned out %d times", tick, n)
		}
	}
	if dups == 0 {
		t.Errorf("no duplicate fan-out was refused: the test did not exercise the claim\n%s\n%s", outs[0].String(), outs[1].String())
	}
	t.Logf("%d ticks, %d duplicate fan-outs refused", len(ticks), dups)
}

func TestSimulate(t *testing.T) {
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	os.WriteFile(policy, []byte(`
rules:
  - name: vendor-learned
    match: {type: "http:call"}
    adaptive: {max: 40, min: 1, per: 1s}
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 100, per: 1s}
`), 0o600)
	code, out, errOut := enqueue(context.Background(), nil, "--simulate", "--policy", policy, "--vendor", "20/s for 2m, 5/s", "--duration", "4m", "--interval", "1m")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	t.Log(out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 7 || !strings.HasPrefix(lines[0], "simulated 4m0s in ") || !strings.Contains(lines[0], `vendor "20/s for 2m0s, 5/s"`) ||
		!strings.Contains(lines[1], "learned/s") || !strings.HasPrefix(lines[6], "total: ") {
		t.Fatalf("unexpected output:\n%s", out)
	}
	// The last minute at 5/s: the learned rate is within the limit.
	f := strings.Fields(lines[5])
	if learned, err := strconv.ParseFloat(f[3], 64); f[2] != "5.00" || err != nil || learned < 4.5 || learned > 5 {
		t.Errorf("last row %q: want the vendor at 5.00 and a learned rate in 4.5-5", lines[5])
	}
	// A service that slows down, under an adaptive concurrency rule: the
	// table of its slots and the learned ones.
	backend := filepath.Join(dir, "backend.yaml")
	os.WriteFile(backend, []byte("rules:\n  - name: backend\n    match: {type: \"http:call\"}\n    adaptive_concurrency: {max: 100, lease: 30s}\n"), 0o600)
	code, out, errOut = enqueue(context.Background(), nil, "--simulate", "--policy", backend, "--vendor", "10 at once", "--duration", "1m", "--interval", "30s", "--latency", "50ms")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	t.Log(out)
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !strings.Contains(lines[1], "slots  learned  in flight  p99 ms") {
		t.Fatalf("unexpected output:\n%s", out)
	}
	if f := strings.Fields(lines[3]); f[2] != "10" || !between(f[3], 8, 12) {
		t.Errorf("last row %q: want 10 slots and 8-12 learned", lines[3])
	}
	// Several payloads: a table of what each got, after the rows.
	payloads := filepath.Join(dir, "payloads.jsonl")
	os.WriteFile(payloads, []byte("{\"business_id\":\"b1\"}\n{\"business_id\":\"b2\"}\n"), 0o600)
	code, out, errOut = enqueue(context.Background(), nil, "--simulate", "--policy", policy, "--vendor", "20/s", "--duration", "1m", "--interval", "1m", "--payload-file", payloads)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	t.Log(out)
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 8 || !strings.Contains(lines[4], "done/s") || !strings.HasSuffix(lines[5], `{"business_id":"b1"}`) || !strings.HasSuffix(lines[6], `{"business_id":"b2"}`) {
		t.Fatalf("unexpected output:\n%s", out)
	}
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--simulate", "--policy", policy, "--vendor", "20/s", "--payload-file", payloads, "--backlog", "1"}, "--backlog: 1 cannot hold the 2 payloads"},
		{[]string{"--simulate", "--vendor", "20/s"}, "--policy: required with --simulate"},
		{[]string{"--simulate", "--policy", policy}, "--vendor: required"},
		{[]string{"--simulate", "--policy", policy, "--vendor", "20/s, 5/s"}, "--vendor: vendor phase 1: needs a duration"},
		{[]string{"--simulate", "--policy", policy, "--vendor", "20/s", "--count", "5"}, "--count: not used with --simulate"},
		{[]string{"--simulate", "--policy", policy, "--vendor", "20/s", "--workers", "0"}, "--workers: must be at least 1"},
		{[]string{"--simulate", "--policy", policy, "--vendor", "20/s", "--interval", "1ns"}, "--interval: 1ns makes more than 100000 rows"},
		{[]string{"--simulate", "--policy", policy, "--vendor", "20/s", "--type", "other"}, `no rule of the policy matches type "other"`},
		{[]string{"--url", "http://x", "--count", "1", "--vendor", "20/s"}, "--vendor: only used with --simulate"},
	} {
		code, _, errOut := enqueue(context.Background(), nil, c.args...)
		if code != 2 || !strings.Contains(errOut, c.msg) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", c.args, code, errOut, c.msg)
		}
	}
}

// between reports whether s is a whole number from lo to hi.
func between(s string, lo, hi int) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= lo && n <= hi
}
