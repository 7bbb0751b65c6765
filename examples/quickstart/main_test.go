package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/taskrl/taskrl/examples/internal/examplekit/examplekittest"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// small is a shrunk campaign: 60 tasks, about 4 seconds at the policy's
// 18/s.
func small() config {
	return config{Tasks: 60, Businesses: 20, Workers: 3, Timeout: time.Minute}
}

func runSmall(t *testing.T, cfg config) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := run(context.Background(), cfg, &out)
	return out.String(), err
}

// TestEmbedded runs the quickstart as "go run ./examples/quickstart" does
// without REDIS_URL: on the embedded miniredis.
func TestEmbedded(t *testing.T) {
	out, err := runSmall(t, small())
	if err != nil || !strings.Contains(out, "OK: every task ran exactly once") {
		t.Fatalf("run: %v\n%s", err, out)
	}
	t.Logf("\n%s", out[strings.Index(out, "Ran "):])
}

// TestRealRedis runs it against a real redis-server, as with REDIS_URL set,
// and checks that it leaves no key of its own behind.
func TestRealRedis(t *testing.T) {
	cfg := small()
	cfg.RedisURL = examplekittest.RedisURL(t)
	out, err := runSmall(t, cfg)
	if err != nil || !strings.Contains(out, "OK: every task ran exactly once") || !strings.Contains(out, "Redis at "+redistest.Addr(t)) {
		t.Fatalf("run: %v\n%s", err, out)
	}
	t.Logf("\n%s", out[strings.Index(out, "Ran "):])
	examplekittest.CheckCleanedUp(t, "quickstart")
}

// TestDetects429 proves the verdict can fail: a policy above the vendor's
// limits draws 429s. Every task still runs exactly once (the 429s are
// turned into taskrl.Throttled, which reschedules), but the run reports
// failure and names the 429s.
func TestDetects429(t *testing.T) {
	cfg := small()
	cfg.Tasks = 40
	cfg.Policy = `
rules:
  - name: too-fast
    match: {type: "vendor:sync"}
    gcra: {rate: 40, per: 1s, burst: 20}
`
	out, err := runSmall(t, cfg)
	if err == nil || !strings.Contains(err.Error(), "the vendor answered 429") {
		t.Fatalf("run: %v\n%s", err, out)
	}
	if strings.Contains(err.Error(), "never ran") || strings.Contains(err.Error(), "archived") {
		t.Errorf("tasks lost or archived: %v\n%s", err, out)
	}
	t.Log(err)
}

func TestBadFlags(t *testing.T) {
	for _, cfg := range []config{{Tasks: 0, Businesses: 1, Workers: 1}, {Tasks: 1, Businesses: 0, Workers: 1}, {Tasks: 1, Businesses: 1, Workers: 0}} {
		if _, err := runSmall(t, cfg); err == nil || !strings.Contains(err.Error(), "must be at least 1") {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
	cfg := small()
	cfg.Policy = "rules: [{name: x, match: {type: a}, gcra: {rate: -1, per: 1s}}]"
	if _, err := runSmall(t, cfg); err == nil || !strings.Contains(err.Error(), "gcra.rate") {
		t.Errorf("bad policy: %v", err)
	}
}
