package taskrl

import (
	"context"
	"testing"
	"time"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
)

// TestRulePauses: the pauses' store (set, replace, list, resume, refuse
// what makes no sense, expire when every pause has an end) and what a
// middleware holds by them: a key's tasks, or the whole rule's.
func TestRulePauses(t *testing.T) {
	c, prefix := redistest.Client(t), redistest.Prefix(t)
	ctx := context.Background()
	now := time.Now()
	for _, bad := range []RulePause{{}, {Rule: "a\x00b"}, {Rule: "r", Until: now.Add(-time.Second)}} {
		if err := PauseRule(ctx, c, prefix, bad); err == nil {
			t.Errorf("PauseRule(%+v): no error", bad)
		}
	}
	if err := PauseRule(ctx, c, prefix, RulePause{Rule: "per-business", Key: "b1", Until: now.Add(time.Hour), Reason: "incident", By: "ops"}); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, pausesKey(prefix)).Val(); ttl < time.Hour || ttl > time.Hour+2*time.Minute {
		t.Errorf("with every pause ending, the hash lives %v, want an hour and a minute", ttl)
	}
	if err := PauseRule(ctx, c, prefix, RulePause{Rule: "peak"}); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, pausesKey(prefix)).Val(); ttl != -1 {
		t.Errorf("with a pause until resumed, the hash expires in %v", ttl)
	}
	ps, err := RulePauses(ctx, c, prefix)
	if err != nil || len(ps) != 2 || ps[0].Rule != "peak" || !ps[0].Until.IsZero() || ps[1].Key != "b1" || ps[1].Reason != "incident" || ps[1].By != "ops" {
		t.Fatalf("RulePauses: %+v, %v", ps, err)
	}
	p, err := policy.Parse([]byte(`
rules:
  - {name: peak, match: {type: "a:*"}, gcra: {rate: 10, per: 1s}}
  - {name: per-business, match: {type: "b:*"}, key: "{{.b}}", gcra: {rate: 1, per: 1s}}
`))
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Policy: p, Client: c, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	for _, tc := range []struct {
		typ, key string
		held     string
	}{{"a:x", "", "peak"}, {"b:x", "b1", "per-business"}, {"b:x", "b2", ""}} {
		got, ok := m.pauses.held(ctx, p.Bind(tc.typ, "q"), []string{tc.key})
		if ok != (tc.held != "") || got.Rule != tc.held {
			t.Errorf("%s key %q: held by %+v (%v), want %q", tc.typ, tc.key, got, ok, tc.held)
		}
	}
	if ok, err := ResumeRule(ctx, c, prefix, "peak", ""); !ok || err != nil {
		t.Errorf("ResumeRule: %v, %v", ok, err)
	}
	if ok, _ := ResumeRule(ctx, c, prefix, "peak", ""); ok {
		t.Error("ResumeRule of a rule not paused: ok")
	}
	m.pauses.read = time.Time{} // read again at once
	if got, ok := m.pauses.held(ctx, p.Bind("a:x", "q"), []string{""}); ok {
		t.Errorf("peak held after its resume by %+v", got)
	}
	if ttl := c.PTTL(ctx, pausesKey(prefix)).Val(); ttl < time.Hour {
		t.Errorf("after the resume, the hash lives %v, want until the last pause ends", ttl)
	}
}
