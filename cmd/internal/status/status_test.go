package status

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// parseWithLimiter parses the policy yaml and returns it with a Limiter on
// c under prefix.
func parseWithLimiter(t *testing.T, c redis.UniversalClient, prefix, yaml string) (*policy.Policy, *quotas.Limiter) {
	t.Helper()
	p, err := policy.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	l, err := quotas.New(quotas.Config{Client: c, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return p, l
}

// jobSet is the binding of tasks of type job on queue q under p, and its
// rules as a set.
func jobSet(t *testing.T, p *policy.Policy) (*policy.Binding, *quotas.Set) {
	t.Helper()
	b := p.Bind("job", "q")
	set, err := quotas.NewSet(b.Rules()...)
	if err != nil {
		t.Fatal(err)
	}
	return b, set
}

const policyYAML = `
rules:
  - name: peak
    match: {type: job}
    gcra: {rate: 10, per: 1s, burst: 10}
  - name: hourly
    match: {type: job}
    sliding: {limit: 100, every: 1h}
  - name: per-business
    match: {type: job}
    key: "{{.business_id}}"
    gcra: {rate: 1, per: 1m, burst: 5}
overrides:
  - {rule: per-business, key: "acme corp", gcra: {rate: 1, per: 1m, burst: 9}}
`

// TestCollect: after tasks of three businesses (b1: 3, "acme corp": 2,
// b2: 1) and an upstream block on b1, the report shows each rule's use,
// the keyed rule's busiest keys in order with the override's limit, the
// block, and, for one key asked for, that key alone.
func TestCollect(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	p, l := parseWithLimiter(t, c, prefix, policyYAML)
	b := p.Bind("job", "q")
	for biz, n := range map[string]int{"b1": 3, "acme corp": 2, "b2": 1} {
		for i := 0; i < n; i++ {
			rq, err := b.Request([]byte(`{"business_id": "` + biz + `"}`))
			if err != nil {
				t.Fatal(err)
			}
			set, err := quotas.NewSet(b.Rules()...)
			if err != nil {
				t.Fatal(err)
			}
			if biz == "acme corp" {
				rules := set.Rules()
				rules[2].Limit = quotas.GCRA{Rate: 1, Period: time.Minute, Burst: 9}
				set, _ = quotas.NewSet(rules...)
			}
			if d, err := l.Allow(ctx, set, rq); err != nil || !d.Allowed {
				t.Fatalf("%s: %+v %v", biz, d, err)
			}
		}
	}
	blocked := time.Now().Add(time.Minute)
	c.Set(ctx, keys.Block(prefix, "per-business", "b1"), blocked.UnixMicro(), time.Minute)

	rep, err := Collect(ctx, c, prefix, p, "")
	if err != nil {
		t.Fatal(err)
	}
	text := Text(rep)
	t.Log("\n" + text)
	if len(rep.Rules) != 3 || rep.Rules[0].Used != 6 || rep.Rules[1].Used != 6 || rep.Rules[1].Remaining != 94 || rep.Rules[0].Rate != 10 {
		t.Fatalf("global rules: %+v %+v", rep.Rules[0].KeyState, rep.Rules[1].KeyState)
	}
	pb := rep.Rules[2]
	if !pb.Keyed || pb.KeyState != nil || pb.Overrides != 1 || len(pb.Busiest) != 3 {
		t.Fatalf("per-business: %+v", pb)
	}
	want := []struct {
		key  string
		used int
	}{{"b1", 3}, {"acme corp", 2}, {"b2", 1}}
	for i, w := range want {
		if k := pb.Busiest[i]; k.Key != w.key || k.Used != w.used {
			t.Errorf("busiest %d: %+v, want %s with %d used", i, k, w.key, w.used)
		}
	}
	if k := pb.Busiest[0]; k.BlockedUntil.UnixMicro() != blocked.UnixMicro() || k.ResetsAt.IsZero() {
		t.Errorf("b1: blocked until %v (want %v), resets at %v", k.BlockedUntil, blocked, k.ResetsAt)
	}
	if k := pb.Busiest[1]; k.Override != "1/1m0s burst 9 (GCRA)" || k.Remaining != 7 {
		t.Errorf("acme corp: %+v, want its override's limit and 7 remaining", k)
	}
	for _, s := range []string{"peak", "(global)", "acme corp", "(override)", "b1"} {
		if !strings.Contains(text, s) {
			t.Errorf("the table lacks %q", s)
		}
	}
	one, err := Collect(ctx, c, prefix, p, "b2")
	if err != nil {
		t.Fatal(err)
	}
	if k := one.Rules[2].KeyState; k == nil || k.Key != "b2" || k.Used != 1 || one.Rules[2].Busiest != nil {
		t.Errorf("--key b2: %+v", one.Rules[2])
	}
	js, _ := json.Marshal(rep)
	for _, s := range []string{`"name":"peak"`, `"used":6`, `"busiest":[{"key":"b1"`, `"blocked_until":`} {
		if !strings.Contains(string(js), s) {
			t.Errorf("JSON lacks %s: %s", s, js)
		}
	}
}

// TestCollectSoft: a soft rule's state is read at the limit it enforces
// (a GCRA key names its interval, so at the written one it would read as
// unused), and the report shows both limits.
func TestCollectSoft(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	p, l := parseWithLimiter(t, c, prefix, "rules:\n  - name: peak\n    match: {type: job}\n    soft: 10%\n    gcra: {rate: 10, per: 1s, burst: 10}\n")
	_, set := jobSet(t, p)
	for i := 0; i < 4; i++ {
		if d, err := l.Allow(ctx, set, quotas.Request{}); err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
	}
	rep, err := Collect(ctx, c, prefix, p, "")
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Rules[0]
	if r.Used != 4 || r.Limit != "10/1s burst 10 (GCRA), soft 10% (11/1s burst 10 (GCRA))" {
		t.Errorf("soft rule: %q with %d used, want 4 used", r.Limit, r.Used)
	}
}

// TestCollectAdaptiveSlots: an adaptive concurrency rule's report shows
// the slots the fleet learned (3, from a start at 1: slow start adds one
// per fast call released) in JSON and in its limit's text (the worker's
// metrics: metrics.TestRuleSlots).
func TestCollectAdaptiveSlots(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	p, l := parseWithLimiter(t, c, prefix, "rules:\n  - name: backend\n    match: {type: job}\n    adaptive_concurrency: {max: 8, lease: 30s}\n")
	_, set := jobSet(t, p)
	for i := 0; i < 2; i++ {
		d, err := l.Allow(ctx, set, quotas.Request{Holder: "h"})
		if err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
		if ok, err := l.Release(ctx, d.Leases[0].Outcome(50*time.Millisecond, false)); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	rep, err := Collect(ctx, c, prefix, p, "")
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Rules[0]
	if r.KeyState == nil || r.Slots != 3 || r.Remaining != 3 || r.Kind != "concurrency" {
		t.Fatalf("%+v %+v", r, r.KeyState)
	}
	if text := Text(rep); !strings.Contains(text, "1-8 at once, learned, lease 30s (adaptive concurrency), 3 learned") {
		t.Errorf("text:\n%s", text)
	}
}

// TestCollectPrefetch: a prefetching rule's state is read from its own
// key (whose name holds the prefetch), and its limit says so.
func TestCollectPrefetch(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	// A fresh Limiter's first decision is a batch of one.
	p, l := parseWithLimiter(t, c, prefix, "rules:\n  - name: peak\n    match: {type: job}\n    prefetch: 10ms\n    gcra: {rate: 1000, per: 1s, burst: 100}\n")
	_, set := jobSet(t, p)
	d, err := l.Allow(ctx, set, quotas.Request{})
	if err != nil || !d.Allowed {
		t.Fatalf("%+v %v", d, err)
	}
	rep, err := Collect(ctx, c, prefix, p, "")
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Rules[0]
	if r.Used < 1 || r.Limit != "1000/1s burst 100 (GCRA), prefetch 10ms" {
		t.Errorf("prefetching rule: %q with %d used, want at least 1 used", r.Limit, r.Used)
	}
}

// TestWaitingColumn: AddWaiting fills each reported key's waiting tasks
// from the index (tasks due after now count; one due before does not),
// shown in Text's WAITING column; an exempt key reads as such.
func TestWaitingColumn(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	p, err := policy.Parse([]byte("rules:\n  - name: per-business\n    match: {type: job}\n    key: \"{{.b}}\"\n    gcra: {rate: 1, per: 1s}\noverrides:\n  - {rule: per-business, key: b9, unlimited: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	k := keys.Waiting(prefix, "per-business", "b1")
	now := time.Now()
	c.ZAdd(ctx, k, redis.Z{Score: float64(now.Add(time.Hour).UnixMicro()), Member: "t1"}, redis.Z{Score: float64(now.Add(2 * time.Hour).UnixMicro()), Member: "t2"},
		redis.Z{Score: float64(now.Add(-time.Minute).UnixMicro()), Member: "gone"})
	c.Expire(ctx, k, 3*time.Hour)
	rep, err := Collect(ctx, c, prefix, p, "b1")
	if err == nil {
		err = AddWaiting(ctx, c, prefix, &rep)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Rules[0].KeyState; got == nil || got.Waiting != 2 {
		t.Fatalf("b1: %+v, want 2 waiting", got)
	}
	if text := Text(rep); !strings.Contains(text, "WAITING") || !regexp.MustCompile(`per-business\s+b1\s.*\s2  1/1s`).MatchString(text) {
		t.Errorf("text:\n%s", text)
	}
	if rep, err = Collect(ctx, c, prefix, p, "b9"); err != nil || rep.Rules[0].KeyState.Override != "unlimited: the rule does not apply" {
		t.Errorf("exempt b9: %+v %v", rep.Rules[0].KeyState, err)
	}
}

// TestCollectFlows: a fair concurrency rule's report lists its flows with
// the slots each holds and those waiting with their weight, in the JSON
// and in Text; a rule that is not fair lists none.
func TestCollectFlows(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	p, l := parseWithLimiter(t, c, prefix, `
rules:
  - name: sends
    match: {type: job}
    concurrency: {max: 3, lease: 1m}
    fair: {key: "{{.business_id}}", weight: "{{.weight}}"}
  - name: cap
    match: {type: job}
    concurrency: {max: 100, lease: 1m}
`)
	b, set := jobSet(t, p)
	for i, task := range []struct {
		payload string
		allowed bool
	}{{`{"business_id": "big", "weight": 1}`, true}, {`{"business_id": "big", "weight": 1}`, true}, {`{"business_id": "small", "weight": 1}`, true}, {`{"business_id": "late", "weight": 3}`, false}} {
		rq, err := b.Request([]byte(task.payload))
		if err != nil {
			t.Fatal(err)
		}
		rq.Holder = string(rune('a' + i))
		if d, err := l.Allow(ctx, set, rq); err != nil || d.Allowed != task.allowed {
			t.Fatalf("%s: %+v %v", task.payload, d, err)
		}
	}
	rep, err := Collect(ctx, c, prefix, p, "")
	if err != nil {
		t.Fatal(err)
	}
	want := []Flow{{Flow: "big", Held: 2}, {Flow: "small", Held: 1}, {Flow: "late", Waiting: true, Weight: 3}}
	if got := rep.Rules[0].Flows; rep.Rules[0].KeyState == nil || !slices.Equal(got, want) || rep.Rules[0].FlowCount != 3 {
		t.Fatalf("fair rule's flows: %+v, want %+v", rep.Rules[0].KeyState, want)
	}
	if rep.Rules[1].Flows != nil {
		t.Errorf("a rule that is not fair lists flows: %+v", rep.Rules[1].Flows)
	}
	js, _ := json.Marshal(rep.Rules[0])
	if !strings.Contains(string(js), `"flows":[{"flow":"big","held":2},{"flow":"small","held":1},{"flow":"late","waiting":true,"weight":3}]`) {
		t.Errorf("JSON: %s", js)
	}
	text := Text(rep)
	for _, line := range []string{`  flow "big": holds 2`, `  flow "small": holds 1`, `  flow "late": waiting, weight 3`} {
		if !strings.Contains(text, line+"\n") {
			t.Errorf("Text has no line %q:\n%s", line, text)
		}
	}
}

// TestCollectPriorities: a gcra rule with priorities and no fair lists
// its waiting tasks by level (the backlog of each, booked ahead at its
// share), and says it has priorities in its limit.
func TestCollectPriorities(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	p, l := parseWithLimiter(t, c, prefix, `
rules:
  - name: vendor
    match: {type: job}
    priority: {level: "{{.priority}}", aging: 30s}
    gcra: {rate: 10, per: 1s}
`)
	b, set := jobSet(t, p)
	for _, payload := range []string{`{"priority": 5}`, `{"priority": 5}`, `{"priority": 1}`} {
		rq, err := b.Request([]byte(payload))
		if err != nil {
			t.Fatal(err)
		}
		if d, err := l.Reserve(ctx, set, rq, time.Minute); err != nil || !d.Allowed {
			t.Fatalf("%s: %+v %v", payload, d, err)
		}
	}
	rep, err := Collect(ctx, c, prefix, p, "")
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Rules[0]
	if r.KeyState == nil || !r.Fair || !r.Priorities || r.Limit != "10/1s burst 1 (GCRA), priorities aging 30s" || len(r.Flows) != 2 {
		t.Fatalf("rule: %+v %+v", r, r.KeyState)
	}
	// At 10/s, level 5's two requests moved its finish 100 ms each (it
	// alone waited), level 1's 200 ms (two levels waiting): both end
	// 200 ms after their requests, less the time since.
	for i, level := range []int{1, 5} {
		if f := r.Flows[i]; f.Level != level || !f.Waiting || f.AheadSeconds <= 0 || f.AheadSeconds > 0.2 {
			t.Errorf("flow %d: %+v, want level %d waiting, booked up to 200ms ahead", i, f, level)
		}
	}
	text := Text(rep)
	for _, want := range []string{`  flow "" level 1: waiting, weight 1, booked `, `  flow "" level 5: waiting, weight 1, booked `, "priorities aging 30s"} {
		if !strings.Contains(text, want) {
			t.Errorf("Text has no %q:\n%s", want, text)
		}
	}
}

// TestCollectSlotPriorities: a concurrency rule with priorities lists
// each level of a flow on its own, holding slots or waiting.
func TestCollectSlotPriorities(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	p, l := parseWithLimiter(t, c, prefix, `
rules:
  - name: smtp
    match: {type: job}
    priority: "{{.priority}}"
    concurrency: {max: 1, lease: 30s}
`)
	b, set := jobSet(t, p)
	for i, payload := range []string{`{"priority": 5}`, `{"priority": 1}`} {
		rq, err := b.Request([]byte(payload))
		if err != nil {
			t.Fatal(err)
		}
		rq.Holder = fmt.Sprint("h", i)
		if d, err := l.Allow(ctx, set, rq); err != nil || d.Allowed != (i == 0) {
			t.Fatalf("%s: %+v %v", payload, d, err)
		}
	}
	rep, err := Collect(ctx, c, prefix, p, "")
	if err != nil {
		t.Fatal(err)
	}
	text := Text(rep)
	for _, want := range []string{`  flow "" level 5: holds 1`, `  flow "" level 1: waiting, weight 1`, "priorities aging 10s"} {
		if !strings.Contains(text, want) {
			t.Errorf("Text has no %q:\n%s", want, text)
		}
	}
}

// TestCollectPlans: a key the workers noted on a plan from its payload
// (keys.Plan) is read and shown at that plan's limit; an override's plan
// wins; a noted plan the rule no longer has is ignored.
func TestCollectPlans(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	p, l := parseWithLimiter(t, c, prefix, `rules:
  - name: per-business
    match: {type: job}
    key: "{{.business_id}}"
    tier: "{{.plan}}"
    tiers:
      pro: {gcra: {rate: 6, per: 1s, burst: 6}}
    gcra: {rate: 2, per: 1s, burst: 2}
overrides:
  - {rule: per-business, key: b3, tier: pro}
`)
	b := p.Bind("job", "q")
	for _, pl := range []string{`{"business_id": "b1", "plan": "pro"}`, `{"business_id": "b2"}`, `{"business_id": "b3"}`, `{"business_id": "b4", "plan": "gold"}`} {
		rq, err := b.Request([]byte(pl))
		if err != nil {
			t.Fatal(err)
		}
		v := b.ForPayload(rq.Keys, []byte(pl))
		set, err := quotas.NewSet(v.Rules()...)
		if err != nil {
			t.Fatal(err)
		}
		if d, err := l.Allow(ctx, set, quotas.Request{Keys: rq.Keys}); err != nil || !d.Allowed {
			t.Fatalf("%s: %+v %v", pl, d, err)
		}
	}
	// As the workers note them; b4's plan is not one of the rule's (one
	// since removed: its tasks were decided at the rule's limit).
	c.Set(ctx, keys.Plan(prefix, "per-business", "b1"), "pro", time.Hour)
	c.Set(ctx, keys.Plan(prefix, "per-business", "b3"), "pro", time.Hour)
	c.Set(ctx, keys.Plan(prefix, "per-business", "b4"), "gold", time.Hour)
	rep, err := Collect(ctx, c, prefix, p, "")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]KeyState{}
	for _, k := range rep.Rules[0].Busiest {
		got[k.Key] = k
	}
	for key, want := range map[string]struct {
		override  string
		rate      float64
		remaining int
	}{
		"b1": {"plan pro (from the payload): 6/1s burst 6 (GCRA)", 6, 5},
		"b2": {"", 2, 1},
		"b3": {"plan pro: 6/1s burst 6 (GCRA)", 6, 5},
		"b4": {"", 2, 1},
	} {
		k := got[key]
		if k.Override != want.override || math.Abs(k.Rate-want.rate) > 0.001 || k.Remaining != want.remaining {
			t.Errorf("%s: %q at %v/s, %d remaining; want %q at %v/s, %d remaining", key, k.Override, k.Rate, k.Remaining, want.override, want.rate, want.remaining)
		}
	}
	if text := Text(rep); !strings.Contains(text, "plan pro (from the payload): 6/1s burst 6 (GCRA)\n") || !strings.Contains(text, "plan pro: 6/1s burst 6 (GCRA) (override)\n") {
		t.Errorf("worker status does not show the payload's plan:\n%s", text)
	}
}
