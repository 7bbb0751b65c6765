package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// TestRedisSettings runs the worker against real redis-servers started
// with the settings that break the limits: --check --redis reports them,
// --require-noeviction refuses to start, a running worker logs them and
// shows them in /healthz, /limits and taskrl_redis_settings, and notices
// within its --redis-check-interval when they are fixed; worker status
// prints them. A Redis set up as the limits need (noeviction, AOF) gives
// no warning and passes --require-noeviction.
func TestRedisSettings(t *testing.T) {
	ctx := context.Background()
	policyFile := writePolicy(t, goodPolicy)
	bad := redistest.StartServer(t, "--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru")
	good := redistest.StartServer(t, "--maxmemory", "100mb", "--maxmemory-policy", "noeviction", "--appendonly", "yes")
	run := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := cli(ctx, args, noEnv, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	evicts := "warning: Redis " + bad.Addr() + " evicts keys under memory pressure (maxmemory-policy volatile-lru, maxmemory 100mb)"
	forgets := "warning: Redis " + bad.Addr() + " keeps nothing across a restart"

	code, out, errOut := run("--check", "--policy", policyFile, "--redis", "redis://"+bad.Addr())
	if code != exitOK || !strings.Contains(out, "redis "+bad.Addr()+": maxmemory-policy volatile-lru, maxmemory 104857600, appendonly off, save points off") ||
		!strings.Contains(out, evicts) || !strings.Contains(out, forgets) {
		t.Errorf("--check --redis: exit %d\n%s%s", code, out, errOut)
	}
	refusal := "--require-noeviction: Redis may evict the limits' keys: " + bad.Addr() + " (maxmemory-policy volatile-lru); set maxmemory-policy noeviction"
	if code, _, errOut := run("--check", "--require-noeviction", "--policy", policyFile, "--redis", "redis://"+bad.Addr()); code != exitRuntime || !strings.Contains(errOut, refusal) {
		t.Errorf("--check --require-noeviction: exit %d, %s", code, errOut)
	}
	if code, out, errOut := run("--check", "--require-noeviction", "--policy", policyFile, "--redis", "redis://"+good.Addr()); code != exitOK || strings.Contains(out, "warning") {
		t.Errorf("--check on a Redis set up as the limits need: exit %d\n%s%s", code, out, errOut)
	}
	prefix := redistest.Prefix(t)
	queue := strings.TrimSuffix(prefix, ":")
	if code, _, errOut := run("--require-noeviction", "--policy", policyFile, "--redis", "redis://"+bad.Addr(), "--queues", queue, "--prefix", prefix); code != exitRuntime || !strings.Contains(errOut, refusal) {
		t.Errorf("worker --require-noeviction: exit %d, %s", code, errOut)
	}

	// A running worker, without --require-noeviction.
	logs := &logBuffer{}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		cli(wctx, []string{"--policy", policyFile, "--redis", "redis://" + bad.Addr(), "--queues", queue, "--prefix", prefix,
			"--metrics-addr", "127.0.0.1:0", "--redis-check-interval", "200ms"}, noEnv, &bytes.Buffer{}, logs)
	}()
	metricsAddr := logs.waitFor(t, regexp.MustCompile(`msg="metrics listening" addr=(\S+)`), done)[1]
	logs.waitFor(t, regexp.MustCompile(`level=WARN msg="Redis settings break the limits' promises" warning=".*evicts keys under memory pressure`), done)
	if code, body := get(t, "http://"+metricsAddr+"/healthz"); code != 200 || !strings.HasPrefix(body, "ok\n") || !strings.Contains(body, evicts) || !strings.Contains(body, forgets) {
		t.Errorf("/healthz: %d %q", code, body)
	}
	_, body := get(t, "http://"+metricsAddr+"/metrics")
	for _, l := range []string{`taskrl_redis_settings{problem="eviction"} 1`, `taskrl_redis_settings{problem="persistence"} 1`, `taskrl_redis_settings{problem="unread"} 0`} {
		if !strings.Contains(body, l+"\n") {
			t.Errorf("/metrics lacks %s", l)
		}
	}
	_, body = get(t, "http://"+metricsAddr+"/limits")
	var rep struct{ Warnings []string }
	if err := json.Unmarshal([]byte(body), &rep); err != nil || len(rep.Warnings) != 2 {
		t.Errorf("/limits warnings: %q %v", rep.Warnings, err)
	}
	if code, out, errOut := run("status", "--policy", policyFile, "--redis", "redis://"+bad.Addr(), "--prefix", prefix); code != exitOK || !strings.Contains(out, evicts) {
		t.Errorf("worker status: exit %d\n%s%s", code, out, errOut)
	}

	// Fixed while it runs: noticed at the next look.
	c := bad.Client(t)
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"appendonly", "yes"}} {
		if err := c.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	logs.waitFor(t, regexp.MustCompile(`msg="Redis settings fixed" was=".*keeps nothing across a restart`), done)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, body := get(t, "http://"+metricsAddr+"/healthz")
		if body == "ok\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz after the fix: %q", body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	<-done
}
