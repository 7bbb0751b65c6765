package taskrl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

var rate1 = quotas.GCRA(gcra.Limit{Rate: 1, Period: time.Second, Burst: 1})

// TestShedLevel: the level on explicit time, from the limits of Shed's
// doc alone: nothing within Grace, then 1/(2·Ramp) a second at the
// threshold and 1/Ramp at a signal of 1, back down at 1/Ramp a second;
// each class deferred with probability level−k, clipped.
func TestShedLevel(t *testing.T) {
	s := withDefaults(t, policy.Shed{Above: 0.8, Classes: []policy.Match{{Queue: "bulk"}, {Queue: "default"}}}) // grace 2s, ramp 5s
	tick := 500 * time.Millisecond
	run := func(level float64, signal float64, from, to time.Duration) float64 {
		for at := from; at < to; at += tick {
			level = nextShedLevel(level, &s, signal, at+tick, tick, 2)
		}
		return level
	}
	if l := nextShedLevel(0, &s, 1, 1900*time.Millisecond, tick, 2); l != 0 {
		t.Errorf("within the grace: level %v", l)
	}
	if l := run(0, 1, 2*time.Second, 7*time.Second); math.Abs(l-1) > 1e-9 {
		t.Errorf("5s at full pressure after the grace: level %v, want 1 (the first class all deferred)", l)
	}
	if l := run(0, 0.8000001, 2*time.Second, 12*time.Second); math.Abs(l-1) > 1e-6 {
		t.Errorf("10s just above the threshold: level %v, want 1", l)
	}
	if l := run(0, 1, 2*time.Second, time.Minute); l != 2 {
		t.Errorf("a minute at full pressure: level %v, want 2 (every class)", l)
	}
	if l := run(2, 0.5, 0, 5*time.Second); math.Abs(l-1) > 1e-9 {
		t.Errorf("5s below the threshold from 2: level %v, want 1", l)
	}
	if l := run(1, 0.8, 0, time.Minute); l != 0 {
		t.Errorf("a minute at the threshold: level %v, want 0", l)
	}
	for _, c := range []struct {
		level float64
		k     int
		want  float64
	}{{0, 0, 0}, {0.25, 0, 0.25}, {0.25, 1, 0}, {1, 0, 1}, {1.5, 0, 1}, {1.5, 1, 0.5}, {2, 1, 1}} {
		if got := shedShare(c.level, c.k); got != c.want {
			t.Errorf("shedShare(%v, %d) = %v, want %v", c.level, c.k, got, c.want)
		}
	}
}

// TestFleetBusy: two middlewares (two processes) publish their busy and
// total slots; each reads the fleet's share; an entry older than shedFresh
// (a process gone) is dropped.
func TestFleetBusy(t *testing.T) {
	c := redistest.Client(t)
	// The processes run a policy without a shed section, so that their
	// loops publish nothing of their own while the test reads.
	plain := mustPolicy(t, policy.Rule{Name: "a", Match: policy.Match{Type: "x"}, Limit: rate1})
	p, err := plain.WithShed(policy.Shed{Above: 0.8, Classes: []policy.Match{{Queue: "bulk"}}})
	if err != nil {
		t.Fatal(err)
	}
	prefix := redistest.Prefix(t)
	var ms []*Middleware
	for _, conc := range []int{10, 30} {
		m, err := New(Config{Policy: plain, Client: c, Prefix: prefix, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		m.ServerConfig(asynq.Config{Concurrency: conc})
		ms = append(ms, m)
	}
	ms[0].shed.inflight.Store(10)
	ms[1].shed.inflight.Store(20)
	sh := shedOf(p)
	now := time.Now()
	ms[1].shed.read(sh, now) // publishes process 1's slots
	for i, m := range ms {
		if v, err := m.shed.read(sh, now); err != nil || v != 30.0/40 {
			t.Fatalf("process %d reads %v, %v; want 30/40", i, v, err)
		}
	}
	if ttl := c.PTTL(context.Background(), prefix+"busy:{b}").Val(); ttl <= 0 || ttl > 2*shedFresh {
		t.Errorf("the busy hash's TTL %v", ttl)
	}
	// An entry older than shedFresh (a process gone) is dropped.
	c.HSet(context.Background(), prefix+"busy:{b}", "gone", "40 40 1000")
	if v, err := ms[1].shed.read(sh, now); err != nil || v != 30.0/40 {
		t.Fatalf("with a stale entry: %v, %v; want 30/40", v, err)
	}
	if n := c.HLen(context.Background(), prefix+"busy:{b}").Val(); n != 2 {
		t.Errorf("%d entries, want the 2 fresh ones", n)
	}
}

// TestShedDefers runs tasks of a bulk and a critical queue through two
// asynq servers under a probe signal: while it reads full pressure the
// bulk tasks are deferred (rescheduled; none archived, none run twice, the
// critical ones run at once), and once it falls every deferred task runs.
func TestShedDefers(t *testing.T) {
	c := redistest.Client(t)
	bulk, critical := redistest.Queue(t, c, "bulk"), redistest.Queue(t, c, "crit")
	p, err := mustPolicy(t, policy.Rule{Name: "other", Match: policy.Match{Type: "none"}, Limit: rate1}).WithCritical(policy.Match{Queue: critical})
	if err != nil {
		t.Fatal(err)
	}
	if p, err = p.WithShed(policy.Shed{Signal: policy.ShedProbe, Above: 0.5, Classes: []policy.Match{{Queue: bulk}, {Queue: critical}}, Grace: time.Millisecond, Ramp: time.Second}); err != nil {
		t.Fatal(err)
	}
	var pressure atomic.Int64 // per mille
	pressure.Store(1000)
	var mu sync.Mutex
	events := map[Outcome]int{}
	if _, err := New(Config{Policy: p, Client: c}); err == nil || !strings.Contains(err.Error(), "Config.ShedProbe") {
		t.Fatalf("a probe policy without ShedProbe: %v", err)
	}
	m, err := New(Config{Policy: p, Client: c, Prefix: redistest.Prefix(t), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		ShedProbe: func() float64 { return float64(pressure.Load()) / 1000 },
		Observer: ObserverFunc(func(e Event) {
			mu.Lock()
			events[e.Outcome]++
			mu.Unlock()
		})})
	if err != nil {
		t.Fatal(err)
	}
	// Full pressure for a second and more: the bulk class all deferred.
	deadline := time.Now().Add(10 * time.Second)
	for _, level, _ := m.ShedState(); level < 1; _, level, _ = m.ShedState() {
		if time.Now().After(deadline) {
			t.Fatalf("level %v after 10s at full pressure", level)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := m.SetPolicy(mustPolicy(t, policy.Rule{Name: "other", Match: policy.Match{Type: "none"}, Limit: rate1})); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := m.ShedState(); ok {
		t.Error("ShedState ok without a shed section")
	}
	if err := m.SetPolicy(p); err != nil {
		t.Fatal(err)
	}

	var runMu sync.Mutex
	ran := map[string]int{}
	client := asynq.NewClientFromRedisClient(c)
	for i := 0; i < 40; i++ {
		q := bulk
		if i%4 == 0 {
			q = critical
		}
		_, err := client.Enqueue(asynq.NewTask("job", []byte(fmt.Sprintf(`{"i":%d}`, i))), asynq.Queue(q), asynq.MaxRetry(0))
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { m.Close() })
	for i := 0; i < 2; i++ {
		srv := asynq.NewServerFromRedisClient(c, m.ServerConfig(asynq.Config{
			TaskCheckInterval: 50 * time.Millisecond, Concurrency: 4, Queues: map[string]int{bulk: 1, critical: 1}, LogLevel: asynq.ErrorLevel,
		}))
		mux := asynq.NewServeMux()
		mux.Use(m.Handler)
		mux.HandleFunc("job", func(ctx context.Context, task *asynq.Task) error {
			q, _ := asynq.GetQueueName(ctx)
			key := q + string(task.Payload())
			runMu.Lock()
			ran[key]++
			runMu.Unlock()
			return nil
		})
		if err := srv.Start(mux); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
	}
	count := func(q string) (n int) {
		runMu.Lock()
		defer runMu.Unlock()
		for k := range ran {
			if strings.HasPrefix(k, q+"{") {
				n++
			}
		}
		return n
	}
	// The critical tasks run while the bulk ones are deferred.
	deadline = time.Now().Add(20 * time.Second)
	for count(critical) < 10 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 10 critical tasks ran", count(critical))
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	if n := count(bulk); n != 0 {
		t.Errorf("%d bulk tasks ran at full pressure", n)
	}
	mu.Lock()
	deferred := events[Deferred]
	mu.Unlock()
	if deferred < 30 {
		t.Errorf("%d deferrals, want every bulk task's at least", deferred)
	}
	// The pressure ends: every deferred task runs, once.
	pressure.Store(0)
	deadline = time.Now().Add(30 * time.Second)
	for count(bulk) < 30 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 30 bulk tasks ran after the pressure ended", count(bulk))
		}
		time.Sleep(50 * time.Millisecond)
	}
	runMu.Lock()
	for k, n := range ran {
		if n != 1 {
			t.Errorf("%s ran %d times", k, n)
		}
	}
	runMu.Unlock()
	in := asynq.NewInspectorFromRedisClient(c)
	for _, q := range []string{bulk, critical} {
		if qi, err := in.GetQueueInfo(q); err != nil || qi.Archived+qi.Retry != 0 {
			t.Errorf("queue %s: %+v, %v; want nothing archived or retried", q, qi, err)
		}
	}
}

// TestUpstreamErrors: the share of tasks that ended in a retryable error
// over the window; archived (SkipRetry), throttled and cancelled tasks are
// not failures, seconds before the window do not count, and fewer than 10
// endings read as no pressure.
func TestUpstreamErrors(t *testing.T) {
	m, err := New(Config{Policy: mustPolicy(t, policy.Rule{Name: "a", Match: policy.Match{Type: "x"}, Limit: rate1}), Client: redistest.Client(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	sh := withDefaults(t, policy.Shed{Signal: policy.ShedUpstreamErrors, Above: 0.2, Classes: []policy.Match{{Queue: "bulk"}}, Window: 10 * time.Second})
	s := m.shed
	t0 := time.Unix(1_800_000_000, 0)
	read := func(at time.Time) float64 {
		v, err := s.read(&sh, at)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for i := 0; i < 9; i++ {
		s.ended(errors.New("500"), t0)
	}
	if v := read(t0); v != 0 {
		t.Errorf("9 endings: %v, want 0 (too few to tell)", v)
	}
	// 100 endings over 10 s: 30 failures, 10 archived, 10 throttled, 5
	// cancelled, 45 fine.
	s.ends = nil
	for i := 0; i < 100; i++ {
		var err error
		switch {
		case i%10 < 3:
			err = errors.New("http:call: 503")
		case i%10 == 3:
			err = fmt.Errorf("404: %w", asynq.SkipRetry)
		case i%10 == 4:
			err = Throttled(time.Second, errors.New("429"))
		case i%20 == 5:
			err = context.Canceled
		}
		s.ended(err, t0.Add(time.Duration(i)*100*time.Millisecond))
	}
	end := t0.Add(10 * time.Second)
	if v := read(end); math.Abs(v-0.3) > 1e-9 {
		t.Errorf("share %v, want 0.3", v)
	}
	// Five seconds later only the last five seconds count: the same share.
	if v := read(end.Add(5 * time.Second)); math.Abs(v-0.3) > 1e-9 {
		t.Errorf("half the window later: %v, want 0.3", v)
	}
	if v := read(end.Add(time.Minute)); v != 0 {
		t.Errorf("a minute later: %v, want 0", v)
	}
	// At 0.3 against 0.2 the level rises after the grace.
	at := end
	for i := 0; i < 20; i++ {
		at = at.Add(policy.ShedTick)
		s.tick(&sh, read(end), at)
	}
	if _, level := s.state(); level <= 0 {
		t.Errorf("level %v after 10s at 0.3 > 0.2", level)
	}
}

// withDefaults returns s with its defaults, as a policy keeps it.
func withDefaults(t testing.TB, s policy.Shed) policy.Shed {
	t.Helper()
	p, err := mustPolicy(t, policy.Rule{Name: "a", Match: policy.Match{Type: "x"}, Limit: rate1}).WithShed(s)
	if err != nil {
		t.Fatal(err)
	}
	s, _ = p.Shed()
	return s
}
