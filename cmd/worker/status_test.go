package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/cmd/internal/status"
	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/quotas"
)

const statusPolicy = `rules:
  - name: peak
    match: {type: "http:call"}
    gcra: {rate: 100, per: 1s, burst: 20}
  - name: hourly
    match: {type: "http:call"}
    sliding: {limit: 1000, every: 1h}
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 1, per: 1m, burst: 10}
  - name: sends
    match: {type: "http:call"}
    concurrency: {max: 50, lease: 1m}
    fair: "{{.business_id}}"
  - name: reports
    match: {type: report}
    priority: "{{.priority}}"
    gcra: {rate: 1, per: 1m}
`

// TestLiveView runs a worker with --metrics-addr, runs 6 calls of two
// businesses through it, and reads the limits three ways: worker status
// (table and --json), the worker's /limits, and its / page as headless
// Chromium renders it (skipped, saying so, where Chromium is missing):
// every rule is there, with the use the calls made, the flows of the
// fair concurrency rule that hold slots and those of a rule with
// priorities waiting at each level (counted in /metrics too).
func TestLiveView(t *testing.T) {
	a := newAPI(t)
	prefix := redistest.Prefix(t)
	policy := writePolicy(t, statusPolicy)
	queue := redistest.Queue(t, redistest.Client(t), "live")
	logs := &logBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		cli(ctx, []string{"--redis", "redis://" + redistest.Addr(t), "--policy", policy, "--concurrency", "4",
			"--queues", queue, "--metrics-addr", "127.0.0.1:0", "--prefix", prefix}, noEnv, io.Discard, logs)
	}()
	defer func() { cancel(); <-done }()
	addr := logs.waitFor(t, regexp.MustCompile(`level=INFO msg="metrics listening" addr=(\S+)`), done)[1]
	logs.waitFor(t, regexp.MustCompile(`msg="worker started"`), done)
	client := asynq.NewClientFromRedisClient(redistest.Client(t))
	for i := 0; i < 6; i++ {
		payload := fmt.Sprintf(`{"url": %q, "business_id": "b%d"}`, a.URL+"/ok", i%2+1)
		if _, err := client.Enqueue(asynq.NewTask("http:call", []byte(payload)), asynq.Queue(queue)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "6 calls", func() bool { return len(a.byPath("/ok")) >= 6 })
	// Slots of the fair rule held by two flows, as long-running tasks
	// would hold them.
	lim, err := quotas.New(quotas.Config{Client: redistest.Client(t), Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	sends, err := quotas.NewSet(quotas.Rule{Name: "sends", Fair: true, Limit: quotas.Concurrency{Max: 50, Lease: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	for i, flow := range []string{"b1", "b1", "b 3"} {
		if d, err := lim.Allow(context.Background(), sends, quotas.Request{Fair: []string{flow}, Holder: fmt.Sprint("held-", i)}); err != nil || !d.Allowed {
			t.Fatalf("slot of %s: %+v %v", flow, d, err)
		}
	}
	// Reports booked at priorities 5 and 1, a minute or two ahead (the
	// policy's default aging, 10s).
	reports, err := quotas.NewSet(quotas.Rule{Name: "reports", Fair: true, Aging: 10 * time.Second, Limit: quotas.GCRA(gcra.Limit{Rate: 1, Period: time.Minute, Burst: 1})})
	if err != nil {
		t.Fatal(err)
	}
	for _, level := range []int{5, 1} {
		if d, err := lim.Reserve(context.Background(), reports, quotas.Request{Priorities: []int{level}}, 5*time.Minute); err != nil || !d.Allowed {
			t.Fatalf("report at %d: %+v %v", level, d, err)
		}
	}

	// worker status, as a table and as JSON.
	var stdout, stderr bytes.Buffer
	args := []string{"status", "--policy", policy, "--redis", "redis://" + redistest.Addr(t), "--prefix", prefix}
	if code := cli(context.Background(), args, noEnv, &stdout, &stderr); code != exitOK {
		t.Fatalf("worker status: exit %d: %s", code, stderr.String())
	}
	t.Log("\n" + stdout.String())
	for _, re := range []string{`hourly +\(global\) +sliding +6 +994`, `per-business +b1 +gcra +3 +7`, `per-business +b2 +gcra +3 +7`, `sends +\(global\) +concurrency +3 +47`, `\n  flow "b1": holds 2\n  flow "b 3": holds 1\n`,
		`reports +\(global\) +gcra .* priorities aging 10s\n  flow "" level 1: waiting, weight 1, booked 1m\d+\.\d+s ahead\n  flow "" level 5: waiting, weight 1, booked \d+\.\d+s ahead\n`} {
		if !regexp.MustCompile(re).MatchString(stdout.String()) {
			t.Errorf("worker status lacks /%s/", re)
		}
	}
	stdout.Reset()
	if code := cli(context.Background(), append(args, "--json", "--key", "b2"), noEnv, &stdout, &stderr); code != exitOK {
		t.Fatalf("worker status --json: exit %d: %s", code, stderr.String())
	}
	var rep status.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || len(rep.Rules) != 5 || rep.Rules[2].KeyState == nil || rep.Rules[2].Key != "b2" || rep.Rules[2].Used != 3 {
		t.Fatalf("worker status --json --key b2: %v %s", err, stdout.String())
	}

	// /limits.
	resp, err := http.Get("http://" + addr + "/limits")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	rep = status.Report{}
	if err := json.Unmarshal(body, &rep); err != nil || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("/limits: %v %s", err, body)
	}
	if r := rep.Rules[1]; r.Name != "hourly" || r.KeyState == nil || r.Used != 6 || len(rep.Rules[2].Busiest) != 2 {
		t.Fatalf("/limits: %s", body)
	}
	if r := rep.Rules[3]; r.KeyState == nil || !r.Fair || !slices.Equal(r.Flows, []status.Flow{{Flow: "b1", Held: 2}, {Flow: "b 3", Held: 1}}) {
		t.Fatalf("/limits: the fair rule's flows: %s", body)
	}
	if r := rep.Rules[4]; r.KeyState == nil || len(r.Flows) != 2 || r.Flows[0].Level != 1 || r.Flows[1].Level != 5 {
		t.Fatalf("/limits: the prioritized rule's flows: %s", body)
	}
	// /metrics counts them.
	if resp, err = http.Get("http://" + addr + "/metrics"); err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range []string{`taskrl_fair_flows{rule="sends",state="holding"} 2`, `taskrl_fair_flows{rule="sends",state="waiting"} 0`,
		`taskrl_priority_flows{level="1",rule="reports"} 1`, `taskrl_priority_flows{level="3",rule="reports"} 0`, `taskrl_priority_flows{level="5",rule="reports"} 1`} {
		if !strings.Contains(string(body), line+"\n") {
			t.Errorf("/metrics has no line %s", line)
		}
	}

	// / in a real browser.
	chrome := findChrome(t, "the page at / is")
	cctx, ccancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer ccancel()
	out, err := exec.CommandContext(cctx, chrome, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--user-data-dir="+t.TempDir(), "--virtual-time-budget=5000", "--dump-dom", "http://"+addr+"/").Output()
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	if shot := os.Getenv("TASKRL_SCREENSHOT"); shot != "" {
		// For docs/operations.md: TASKRL_SCREENSHOT=$PWD/docs/live-view.png go test -run TestLiveView ./cmd/worker
		if out, err := exec.CommandContext(cctx, chrome, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
			"--user-data-dir="+t.TempDir(), "--virtual-time-budget=5000", "--window-size=1200,390", "--screenshot="+shot, "http://"+addr+"/").CombinedOutput(); err != nil {
			t.Errorf("screenshot: %v\n%s", err, out)
		}
	}
	dom := string(out)
	// The test's Redis runs without persistence: the page warns.
	if !strings.Contains(dom, "<li>WARNING: Redis "+redistest.Addr(t)+" keeps nothing across a restart") {
		t.Errorf("the page shows no warning of the Redis settings:\n%s", dom)
	}
	for _, r := range rep.Rules {
		if !strings.Contains(dom, `data-rule="`+r.Name+`"`) {
			t.Errorf("the page shows no row of rule %s", r.Name)
		}
	}
	row := regexp.MustCompile(`<tr data-rule="hourly">.*?</tr>`).FindString(dom)
	if !strings.Contains(row, `<td class="num used">6</td>`) || !strings.Contains(row, `<td class="num remaining">994</td>`) || !strings.Contains(row, `title="1% used"`) {
		t.Errorf("the hourly row does not show 6 used, 994 remaining and its bar: %s\n%s", row, dom)
	}
	if !regexp.MustCompile(`<tr data-rule="per-business"><td>per-business</td><td>b[12]</td>.*?<td class="num used">3</td>`).MatchString(dom) {
		t.Errorf("the page does not show the businesses' use:\n%s", dom)
	}
	if !regexp.MustCompile(`<tr class="flow muted" data-rule="sends"><td></td><td>flow "b1"</td>.*?<td class="num held">2</td>.*?<tr class="flow muted" data-rule="sends"><td></td><td>flow "b 3"</td>.*?<td class="num held">1</td>`).MatchString(dom) {
		t.Errorf("the page does not show the fair rule's flows:\n%s", dom)
	}
	if !regexp.MustCompile(`<tr class="flow muted" data-rule="reports"><td></td><td>flow "" level 1</td>.*?waiting, weight 1, booked 1\d\d\.\ds ahead</td>.*?<td>flow "" level 5</td>`).MatchString(dom) {
		t.Errorf("the page does not show the prioritized rule's levels:\n%s", dom)
	}
}

// TestStatusUsage: worker status refuses bad arguments before connecting.
func TestStatusUsage(t *testing.T) {
	addr, conns := countingListener(t)
	policy := writePolicy(t, statusPolicy)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "--policy is required"},
		{[]string{"--policy", policy, "extra"}, `unexpected argument "extra"`},
		{[]string{"--policy", policy, "--bogus"}, "flag provided but not defined: --bogus"},
		{[]string{"--policy", writePolicy(t, "rules: []\n")}, "policy"},
		{[]string{"--policy", policy, "--redis-tls-ca", policy}, "--redis-tls-ca: a CA file is for TLS, which is not on"},
		{[]string{"--policy", policy, "--rule", "x"}, "--rule, --queues and --limit go with --waiting"},
		{[]string{"--policy", policy, "--waiting", "--key", "b1"}, "give --rule too"},
		{[]string{"--policy", policy, "--waiting", "--rule", "nope"}, `--rule: the policy has no rule "nope"`},
		{[]string{"--policy", policy, "--waiting", "--limit", "0"}, "--limit must be at least 1, got 0"},
		{[]string{"--policy", policy, "--waiting", "--queues", "a,,b"}, "--queues: empty entry"},
		{[]string{"--policy", policy, "--redis-tls", "--redis-tls-ca", policy + ".missing"}, "--redis-tls-ca: open " + policy + ".missing: no such file"},
	} {
		var stdout, stderr bytes.Buffer
		code := cli(context.Background(), append(append([]string{"status"}, tc.args...), "--redis", "redis://"+addr), noEnv, &stdout, &stderr)
		if code != exitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: exit %d, %q; want %q", tc.args, code, stderr.String(), tc.want)
		}
	}
	if n := conns.Load(); n != 0 {
		t.Errorf("%d connections", n)
	}
	var stdout bytes.Buffer
	if code := cli(context.Background(), []string{"status", "--help"}, noEnv, &stdout, io.Discard); code != exitOK || stdout.String() != statusUsage {
		t.Errorf("--help: exit %d", code)
	}
}

// TestStatusWaiting: worker status --waiting lists, from asynq's scheduled
// set, the tasks that carry the middleware's wait headers (as a parked task
// does), with their keys and reason; --rule and --key narrow it; a task
// scheduled by its producer is not listed.
func TestStatusWaiting(t *testing.T) {
	c := redistest.Client(t)
	queue := redistest.Queue(t, c, "status-waiting")
	policy := writePolicy(t, statusPolicy)
	client := asynq.NewClientFromRedisClient(c)
	slot := time.Now().Add(time.Minute)
	ids := map[string]string{}
	for _, biz := range []string{"b1", "b2"} {
		h := map[string]string{"taskrl-round": "1", "taskrl-booked": fmt.Sprint(slot.UnixMicro())}
		info, err := client.Enqueue(asynq.NewTaskWithHeaders("http:call", []byte(`{"url":"http://x","business_id":"`+biz+`"}`), h), asynq.Queue(queue), asynq.ProcessIn(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		ids[biz] = info.ID
	}
	if _, err := client.Enqueue(asynq.NewTask("http:call", []byte(`{"url":"http://x","business_id":"b1"}`)), asynq.Queue(queue), asynq.ProcessIn(time.Hour)); err != nil {
		t.Fatal(err)
	}
	run := func(extra ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		args := append([]string{"status", "--policy", policy, "--redis", "redis://" + redistest.Addr(t), "--waiting", "--queues", queue}, extra...)
		if code := cli(context.Background(), args, noEnv, &stdout, &stderr); code != exitOK {
			t.Fatalf("worker status %q: exit %d: %s", extra, code, stderr.String())
		}
		return stdout.String()
	}
	all := run()
	t.Log("\n" + all)
	if !strings.Contains(all, ids["b1"]) || !strings.Contains(all, ids["b2"]) || !strings.Contains(all, "per-business=b1") || !strings.Contains(all, "2 waiting") {
		t.Errorf("worker status --waiting:\n%s", all)
	}
	if b1 := run("--rule", "per-business", "--key", "b1"); !strings.Contains(b1, ids["b1"]) || strings.Contains(b1, ids["b2"]) || !strings.Contains(b1, "1 waiting") {
		t.Errorf("worker status --waiting --rule per-business --key b1:\n%s", b1)
	}
	var ws []status.WaitingTask
	if err := json.Unmarshal([]byte(run("--json")), &ws); err != nil || len(ws) != 2 || !ws[0].Booked || ws[0].Until.UnixMicro() != slot.UnixMicro() {
		t.Errorf("worker status --waiting --json: %+v, %v", ws, err)
	}
}
