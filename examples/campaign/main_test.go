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

func check(t *testing.T, cfg config) {
	t.Helper()
	reports := examplekittest.Run(t, run, cfg)
	if len(reports) != ticks {
		t.Fatalf("%d ticks reported", len(reports))
	}
	for i, r := range reports {
		// Spread, not burst: 10 e-mails at 10/s after a burst of 2 take
		// at least 0.8s; unthrottled they would take milliseconds.
		if span := r.Last.Sub(r.First); r.Emails != cfg.Businesses || span < 700*time.Millisecond {
			t.Errorf("tick %d: %d e-mails over %v", i+1, r.Emails, span)
		}
	}
}

func TestEmbedded(t *testing.T) {
	check(t, config{Businesses: 10, Every: 2 * time.Second, Timeout: time.Minute})
}

func TestRealRedis(t *testing.T) {
	check(t, config{Businesses: 10, Every: 2 * time.Second, Timeout: time.Minute, RedisURL: examplekittest.RedisURL(t)})
	examplekittest.CheckCleanedUp(t, "campaign")
	rdb := redistest.Client(t)
	sched, _ := rdb.Keys(context.Background(), "asynq:schedulers*").Result()
	hist, _ := rdb.Keys(context.Background(), "asynq:scheduler_history*").Result()
	if len(sched)+len(hist) > 0 {
		t.Logf("scheduler keys present (may belong to another test): %v %v", sched, hist)
	}
}

func TestBadFlags(t *testing.T) {
	for _, cfg := range []config{{Businesses: 0, Every: time.Second}, {Businesses: 1, Every: time.Millisecond}} {
		if _, err := run(context.Background(), cfg, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "must be at least") {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}
