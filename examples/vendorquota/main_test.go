package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/taskrl/taskrl/examples/internal/examplekit/examplekittest"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func check(t *testing.T, cfg config) {
	t.Helper()
	res := examplekittest.Run(t, run, cfg)
	if time.Now().After(res.NextReset) {
		t.Skip("the run crossed midnight in Los Angeles: the daily quota reset")
	}
	// The whole daily quota goes to calls that happened: the ones the
	// vendor refused and the slots the back-off cancelled are refunded.
	if res.Done+res.Tomorrow != cfg.Tasks || res.Done != cfg.Daily || !res.TomorrowAtReset {
		t.Errorf("ran %d, waiting for tomorrow %d (at reset: %v), of %d tasks with a daily quota of %d", res.Done, res.Tomorrow, res.TomorrowAtReset, cfg.Tasks, cfg.Daily)
	}
	if res.Forced == 0 || res.Throttled == 0 {
		t.Errorf("no forced 429 was seen: %+v", res)
	}
	// The fleet backs off together: only calls already under way when the
	// first 429 came reach the vendor during its outage. (A generous bound:
	// 3 workers × 10 goroutines could send 36 at 18/s.)
	if res.DuringOutage > 6 {
		t.Errorf("%d calls reached the vendor during its 2s outage", res.DuringOutage)
	}
	if res.Other != 0 {
		t.Errorf("%d 429s beyond the forced ones", res.Other)
	}
}

func TestEmbedded(t *testing.T) {
	check(t, config{Tasks: 60, Daily: 45, Businesses: 10, Timeout: time.Minute})
}

func TestRealRedis(t *testing.T) {
	check(t, config{Tasks: 60, Daily: 45, Businesses: 10, Timeout: time.Minute, RedisURL: examplekittest.RedisURL(t)})
	examplekittest.CheckCleanedUp(t, "vendorquota")
}

func TestBadFlags(t *testing.T) {
	if _, err := run(context.Background(), config{Tasks: 1, Daily: 0, Businesses: 1}, &bytes.Buffer{}); err == nil {
		t.Error("daily 0 accepted")
	}
}
