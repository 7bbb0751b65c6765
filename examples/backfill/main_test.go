package main

import (
	"testing"
	"time"

	"github.com/taskrl/taskrl/examples/internal/examplekit/examplekittest"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func check(t *testing.T, cfg config) {
	t.Helper()
	res := examplekittest.Run(t, run, cfg)
	if res.Backfilled != cfg.Tasks || res.Interactive == 0 {
		t.Errorf("backfilled %d of %d, %d interactive tasks", res.Backfilled, cfg.Tasks, res.Interactive)
	}
	// The limit holds (run checks that the service, which allows 55/s
	// burst 10, never answered 429). Unthrottled, 20 goroutines would run
	// hundreds a second; throttled, 100 tasks at 50/s after a burst of 5
	// span 1.9s, about 52/s first to last, give or take scheduling jitter.
	if res.Rate > 60 {
		t.Errorf("backfill ran at %.1f/s, over its limit of %d/s", res.Rate, rate)
	}
	// Interactive tasks start at once (examples/README.md): p50 2-3 ms,
	// 14-41 ms under the race detector. run fails on a start over 2 s.
	if res.P50 > 250*time.Millisecond {
		t.Errorf("interactive tasks' start latency p50 %v: held up behind the backfill", res.P50)
	}
}

func TestEmbedded(t *testing.T) {
	check(t, config{Tasks: 100, Timeout: time.Minute})
}

func TestRealRedis(t *testing.T) {
	check(t, config{Tasks: 100, Timeout: time.Minute, RedisURL: examplekittest.RedisURL(t)})
	examplekittest.CheckCleanedUp(t, "backfill")
}

func TestQuantile(t *testing.T) {
	ds := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if q := quantile(ds, 0.5); q != 5 {
		t.Errorf("p50 %v", q)
	}
	if q := quantile(ds, 0.99); q != 10 {
		t.Errorf("p99 %v", q)
	}
	if q := quantile(nil, 0.5); q != 0 {
		t.Errorf("empty %v", q)
	}
}
