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
	for _, bad := range []RulePause{{}, {Rule: "a\x00b"}, {Rule: "r", For: -time.Second}} {
		if err := PauseRule(ctx, c, prefix, bad); err == nil {
			t.Errorf("PauseRule(%+v): no error", bad)
		}
	}
	if err := PauseRule(ctx, c, prefix, RulePause{Rule: "per-business", Key: "b1", For: time.Hour, Reason: "incident", By: "ops"}); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, pausesKey(prefix)).Val(); ttl < time.Hour || ttl > time.Hour+2*time.Minute {
		t.Errorf("with every pause ending, the hash lives %v, want an hour and a minute", ttl)
	}
	if err := PauseRule(ctx, c, prefix, RulePause{Rule: "peak"}); err != nil {
		t.Fatal(err)
	}
	// A shadow rule's pause holds nothing; one that has ended is dropped
	// by the next change.
	for _, p := range []RulePause{{Rule: "trial"}, {Rule: "gone", For: time.Millisecond}} {
		if err := PauseRule(ctx, c, prefix, p); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(5 * time.Millisecond)
	if _, err := ResumeRule(ctx, c, prefix, "nothing", ""); err != nil {
		t.Fatal(err)
	}
	if c.HExists(ctx, pausesKey(prefix), "gone\x00").Val() {
		t.Error("a pause that ended is still in the hash after a change")
	}
	if ttl := c.PTTL(ctx, pausesKey(prefix)).Val(); ttl != -1 {
		t.Errorf("with a pause until resumed, the hash expires in %v", ttl)
	}
	ps, err := RulePauses(ctx, c, prefix)
	if err != nil || len(ps) != 3 || ps[0].Rule != "peak" || !ps[0].Until.IsZero() || ps[1].Key != "b1" || ps[1].Reason != "incident" || ps[1].By != "ops" || ps[2].Rule != "trial" {
		t.Fatalf("RulePauses: %+v, %v", ps, err)
	}
	p, err := policy.Parse([]byte(`
rules:
  - {name: peak, match: {type: "a:*"}, gcra: {rate: 10, per: 1s}}
  - {name: per-business, match: {type: "b:*"}, key: "{{.b}}", gcra: {rate: 1, per: 1s}}
  - {name: trial, mode: shadow, match: {type: "c:*"}, gcra: {rate: 1, per: 1s}}
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
	}{{"a:x", "", "peak"}, {"b:x", "b1", "per-business"}, {"b:x", "b2", ""}, {"c:x", "", ""}} {
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
	if ok, err := ResumeRule(ctx, c, prefix, "trial", ""); !ok || err != nil {
		t.Errorf("ResumeRule trial: %v, %v", ok, err)
	}
	if ttl := c.PTTL(ctx, pausesKey(prefix)).Val(); ttl < time.Hour || ttl > time.Hour+2*time.Minute {
		t.Errorf("after the resumes, the hash lives %v, want until the last pause ends and a minute", ttl)
	}
}
