package examplekit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func TestOpenEmbedded(t *testing.T) {
	s, err := Open("")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Embedded() || !strings.Contains(s.String(), "embedded miniredis") {
		t.Errorf("embedded %v, %q", s.Embedded(), s)
	}
	ctx := context.Background()
	a, b := s.Client(), s.Client()
	if err := a.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := b.Get(ctx, "k").Result(); v != "v" || err != nil {
		t.Errorf("second client reads %q, %v", v, err)
	}
	// Keys expire on the real clock, as on Redis (age).
	if err := a.Set(ctx, "short", "v", 50*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for b.Exists(ctx, "short").Val() == 1 {
		if time.Now().After(deadline) {
			t.Fatal("a key with a 50ms TTL still exists after 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
	if err := a.Ping(ctx).Err(); err == nil {
		t.Error("client still open after Close")
	}
}

func TestOpenURL(t *testing.T) {
	s, err := Open("redis://" + redistest.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Embedded() || !strings.Contains(s.String(), redistest.Addr(t)) {
		t.Errorf("embedded %v, %q", s.Embedded(), s)
	}
	if o := s.ConnOpt(); o.Addr != redistest.Addr(t) {
		t.Errorf("ConnOpt %+v", o)
	}
}

func TestOpenErrors(t *testing.T) {
	for url, want := range map[string]string{
		"http://x":              "REDIS_URL",
		"redis://127.0.0.1:1/0": "cannot reach Redis at 127.0.0.1:1",
	} {
		if _, err := Open(url); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%q) = %v, want an error with %q", url, err, want)
		}
	}
}

func TestNamespace(t *testing.T) {
	a, b := Namespace("x"), Namespace("x")
	if a == b || !strings.HasPrefix(a, "x-") || strings.ContainsAny(a, "*?[]{}:") {
		t.Errorf("%q %q", a, b)
	}
}

// TestCleanup deletes a run's queue and prefixed keys, and nothing else.
func TestCleanup(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	p := redistest.Prefix(t)
	ns := Namespace(strings.ReplaceAll(strings.Trim(p, ":"), ":", "-"))
	queue, other := ns+"-q", ns+"-other"
	c := asynq.NewClientFromRedisClient(rdb)
	for _, q := range []string{queue, other} {
		if _, err := c.Enqueue(asynq.NewTask("t", nil), asynq.Queue(q)); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{p + "run:a", p + "run:b", p + "keep"} {
		rdb.Set(ctx, k, 1, 0)
	}
	rdb.Set(ctx, "asynq:{"+queue+"}:processed", 1, 0)
	if err := Cleanup(ctx, rdb, p+"run:", queue); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, p+"run:a", p+"run:b", "asynq:{"+queue+"}:processed").Val(); n != 0 {
		t.Errorf("%d keys left", n)
	}
	if rdb.Exists(ctx, p+"keep").Val() != 1 {
		t.Error("deleted a key outside the prefix")
	}
	ins := asynq.NewInspectorFromRedisClient(rdb)
	if _, err := ins.GetQueueInfo(queue); err == nil {
		t.Error("queue still there")
	}
	if info, err := ins.GetQueueInfo(other); err != nil || info.Pending != 1 {
		t.Errorf("other queue: %+v %v", info, err)
	}
	if err := Cleanup(ctx, rdb, "", other); err != nil {
		t.Fatal(err)
	}
	// A queue that is already gone is not an error.
	if err := Cleanup(ctx, rdb, "", queue); err != nil {
		t.Error(err)
	}
}
