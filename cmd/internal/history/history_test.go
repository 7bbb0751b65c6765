package history

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/cmd/internal/status"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/taskrl"
)

func TestMain(m *testing.M) { redistest.Main(m) }

const testPolicy = `
rules:
  - name: global
    match: {type: job}
    gcra: {rate: 10, per: 1s}
  - name: per-business
    match: {type: job}
    key: "{{.business}}"
    gcra: {rate: 2, per: 1s}
  - name: daily
    match: {type: job}
    quota: {limit: 1000, every: 24h}
`

// TestFleet: three workers' counts of one step add up in Redis; a keyed
// rule shows all its keys together and its busiest keys, the huge one
// first beside 1,500 small ones; one worker of the three samples, once a
// step, the keys the fleet counted busiest in the step before; what the
// history keeps is bounded and expires.
func TestFleet(t *testing.T) {
	c, prefix, p, cur := setup(t, testPolicy)
	ctx := context.Background()
	long := strings.Repeat("x", 300) // stored as its hash
	var samples atomic.Int64
	var asked map[string][]string
	sample := func(_ context.Context, named map[string][]string) (status.Report, error) {
		samples.Add(1)
		asked = named
		return status.Report{Rules: []status.Rule{
			{Name: "global", Kind: "gcra", Limit: "10 per 1s", KeyState: &status.KeyState{Used: 3, Remaining: 7, Rate: 10, Waiting: 40}},
			{Name: "per-business", Kind: "gcra", Limit: "2 per 1s", Keyed: true, Busiest: []status.KeyState{{Key: "big", Rate: 2, Waiting: 7}, {Key: "b1", Rate: 2}}},
			{Name: "daily", Kind: "quota", Limit: "1000 per 24h", KeyState: &status.KeyState{Used: 250, Remaining: 750}},
		}}, nil
	}
	var recs []*Recorder
	for w := 0; w < 3; w++ {
		r := NewRecorder(Config{Client: c, Prefix: prefix, Sample: sample})
		recs = append(recs, r)
		for b := cur - 10; b <= cur-3; b++ {
			for i := 0; i < 50; i++ {
				r.add(taskrl.Event{Outcome: taskrl.Admitted, Keys: []taskrl.RuleKey{{Rule: "global"}, {Rule: "per-business", Key: "big"}, {Rule: "daily"}}}, b)
			}
			r.add(taskrl.Event{Outcome: taskrl.Admitted, Keys: []taskrl.RuleKey{{Rule: "per-business", Key: long}}}, b)
			r.add(taskrl.Event{Outcome: taskrl.Admitted, Keys: []taskrl.RuleKey{{Rule: "per-business", Key: long}}}, b)
			for i := 0; i < 1500; i++ {
				r.add(taskrl.Event{Outcome: taskrl.Admitted, Keys: []taskrl.RuleKey{{Rule: "per-business", Key: fmt.Sprint("b", i)}}}, b)
			}
			// Past the 1,000 keys a worker counts apart: in the total only.
			r.add(taskrl.Event{Outcome: taskrl.Admitted, Keys: []taskrl.RuleKey{{Rule: "per-business", Key: "late"}}}, b)
			r.add(taskrl.Event{Outcome: taskrl.UpstreamThrottled, Keys: []taskrl.RuleKey{{Rule: "global"}}}, b)
		}
		r.tick(ctx, true)
	}

	h, err := NewReader(c, prefix).Read(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if h.Steps != int(Span/Step) || h.Step != 5 || len(h.Rules) != 3 {
		t.Fatalf("history of %d steps of %vs, %d rules", h.Steps, h.Step, len(h.Rules))
	}
	at := func(h History, b int64) int { return int(b - step(h.Start)) }
	g := h.Rules[0]
	if g.Unit != "tasks/s" || len(g.Series) != 1 || g.Series[0].Key != "" || g.Series[0].All {
		t.Fatalf("global rule: %+v", g)
	}
	for b := cur - 12; b <= cur-3; b++ {
		want, thr := 0.0, 0.0
		if b >= cur-10 {
			want, thr = 3*50/5.0, 3/5.0
		}
		if got := g.Series[0].Admitted[at(h, b)]; got != want {
			t.Errorf("global, step %d: %v admitted/s, want %v", b-cur, got, want)
		}
		if got := g.Series[0].Throttled[at(h, b)]; got != thr {
			t.Errorf("global, step %d: %v 429s/s, want %v", b-cur, got, thr)
		}
	}
	k := h.Rules[1]
	if len(k.Series) != 1+KeysPerRule || !k.Series[0].All || k.Series[1].Key != "big" {
		keys := []string{}
		for _, s := range k.Series {
			keys = append(keys, s.Key)
		}
		t.Fatalf("keyed rule's series: %q", keys)
	}
	// Every task counts in the rule's total: 50 + 2 + 1500 + 1 per worker.
	if got, want := k.Series[0].Admitted[at(h, cur-5)], 3*1553/5.0; got != want {
		t.Errorf("all keys: %v admitted/s, want %v", got, want)
	}
	if got := k.Series[1].Admitted[at(h, cur-5)]; got != 30 {
		t.Errorf("big: %v admitted/s, want 30", got)
	}
	if !strings.HasPrefix(k.Series[2].Key, "~") || k.Series[2].Admitted[at(h, cur-5)] != 3*2/5.0 {
		t.Errorf("the long key, second busiest, shows as its hash: %q %v", k.Series[2].Key, k.Series[2].Admitted[at(h, cur-5)])
	}

	// From settle into a step, the sampler samples it, asking for the
	// keys counted in the step before; the others only try to become it.
	s := midStep(t, c)
	recs[0].add(taskrl.Event{Outcome: taskrl.Admitted, Keys: []taskrl.RuleKey{{Rule: "per-business", Key: "now busy"}}}, s-1)
	for _, r := range recs {
		r.tick(ctx, false)
		r.tick(ctx, false)
		r.sampling.Wait()
	}
	if n := samples.Load(); n != 1 || fmt.Sprint(asked) != `map[per-business:[now busy]]` {
		t.Errorf("%d samples of one step by three workers, want 1; it asked for the keys %q, want those of the step before", n, asked)
	}
	holders := 0
	for _, r := range recs {
		if r.holder {
			holders++
		}
	}
	if holders != 1 {
		t.Errorf("%d samplers", holders)
	}
	for deadline := time.Now().Add(10 * time.Second); step(h.At.Add(-settle))-1 < s; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("step %d not shown within 10s", s)
		}
		if h, err = NewReader(c, prefix).Read(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	i := at(h, s)
	if v := h.Rules[0].Series[0]; v.Limit[i] == nil || *v.Limit[i] != 10 || *v.Waiting[i] != 40 || v.Level[i] != nil {
		t.Errorf("global's sample: limit %v, waiting %v, level %v", v.Limit[i], v.Waiting[i], v.Level[i])
	}
	if v := h.Rules[1].Series[1]; v.Key != "big" || v.Limit[i] == nil || *v.Limit[i] != 2 || *v.Waiting[i] != 7 {
		t.Errorf("big's sample: %q limit %v, waiting %v", v.Key, v.Limit[i], v.Waiting[i])
	}
	if d := h.Rules[2]; d.Unit != "units" || d.Series[0].Level[i] == nil || *d.Series[0].Level[i] != 250 || *d.Series[0].Limit[i] != 1000 {
		t.Errorf("daily's sample: %+v", d)
	}
	if v := h.Rules[0].Series[0]; v.Limit[i-1] != nil {
		t.Errorf("a step without a sample has a limit: %v", *v.Limit[i-1])
	}

	// Bounded: per step a rule's two totals and its busiest keys' counts;
	// every key expires.
	keys, err := c.Keys(ctx, prefix+"hist:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 8+1+1+1 {
		t.Errorf("%d keys, want 8 steps, the step before the sample's, the sample and the sampler: %q", len(keys), keys)
	}
	for _, key := range keys {
		ttl, err := c.PTTL(ctx, key).Result()
		if strings.HasSuffix(key, ":sampler") {
			if err != nil || ttl <= 0 || ttl > samplerTTL {
				t.Errorf("%s: TTL %v %v", key, ttl, err)
			}
			continue
		}
		if err != nil || ttl <= Span || ttl > Span+2*Step {
			t.Errorf("%s: TTL %v %v", key, ttl, err)
		}
		if n, _ := c.HLen(ctx, key).Result(); n > int64(3*2+2*KeysPerRule) {
			t.Errorf("%s: %d fields", key, n)
		}
	}
}

// setup returns the test's Redis and prefix, the policy yaml and the
// current step on Redis's clock.
func setup(t *testing.T, yaml string) (*redis.Client, string, *policy.Policy, int64) {
	t.Helper()
	c := redistest.Client(t)
	p, err := policy.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return c, redistest.Prefix(t), p, step(now)
}

// midStep waits until Redis's clock is between settle and a second before
// the end of a step, and returns that step.
func midStep(t *testing.T, c redis.UniversalClient) int64 {
	t.Helper()
	for {
		now, err := c.Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		in := now.Sub(time.UnixMilli(step(now) * Step.Milliseconds()))
		if in >= settle && in <= Step-time.Second {
			return step(now)
		}
		time.Sleep((Step + settle - in) % Step)
	}
}

// TestReaderKeeps: a step that has ended is read from Redis once.
func TestReaderKeeps(t *testing.T) {
	c, prefix, p, cur := setup(t, testPolicy)
	ctx := context.Background()
	old := cur - 5
	rd := NewReader(c, prefix)
	var calls atomic.Int64
	c.AddHook(countHook{&calls})
	if _, err := rd.Read(ctx, p); err != nil {
		t.Fatal(err)
	}
	first := calls.Swap(0)
	c.HIncrBy(ctx, countsKey(prefix, old), totalField('A', "global"), 5)
	h, err := rd.Read(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	second := calls.Swap(0) - 1 // the HINCRBY
	if first < 2*int64(Span/Step) || second > 2*4+1 {
		t.Errorf("%d commands in the first reading, %d in the second", first, second)
	}
	if v := h.Rules[0].Series[0].Admitted[old-step(h.Start)]; v != 0 {
		t.Errorf("a kept step was read again: %v", v)
	}
}

type countHook struct{ n *atomic.Int64 }

func (countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(int64(len(cmds))); return next(ctx, cmds) }
}

// TestScale: 100 rules, 50 of them keyed by a field with 1,000 values, over
// the whole span: what Redis holds, what /history answers and how long
// reading takes (logged, not asserted: a loaded machine is slower).
func TestScale(t *testing.T) {
	if testing.Short() {
		t.Skip("fills 15 minutes of history for 100 rules")
	}
	var yaml strings.Builder
	yaml.WriteString("rules:\n")
	rep := status.Report{}
	for i := 0; i < 100; i++ {
		name := fmt.Sprint("rule-", i)
		fmt.Fprintf(&yaml, "  - name: %s\n    match: {type: job}\n    gcra: {rate: 100, per: 1s}\n", name)
		r := status.Rule{Name: name, Kind: "gcra", Limit: "100 per 1s"}
		if i%2 == 1 {
			yaml.WriteString("    key: \"{{.business}}\"\n")
			r.Keyed = true
			for k := 0; k < 10; k++ {
				r.Busiest = append(r.Busiest, status.KeyState{Key: fmt.Sprint("business-", k), Used: 3, Remaining: 97, Rate: 100, Waiting: 1000 + k})
			}
		} else {
			r.KeyState = &status.KeyState{Used: 30, Remaining: 70, Rate: 100, Waiting: 12345}
		}
		rep.Rules = append(rep.Rules, r)
	}
	c, prefix, p, cur := setup(t, yaml.String())
	ctx := context.Background()
	r := NewRecorder(Config{Client: c, Prefix: prefix})
	data, _ := json.Marshal(compact(rep))
	for b := cur - int64(Span/Step); b < cur; b++ {
		for i := 0; i < 100; i++ {
			name := fmt.Sprint("rule-", i)
			for k := 0; k < 1+9*(i%2); k++ { // 10 keys per step, of the 1,000 over the span: a worker reports 5
				key := ""
				if i%2 == 1 {
					key = fmt.Sprint("business-", (10*int(b)+k)%1000)
				}
				for n := 0; n < 40; n++ {
					r.add(taskrl.Event{Outcome: taskrl.Admitted, Keys: []taskrl.RuleKey{{Rule: name, Key: key}}}, b)
				}
			}
		}
		c.Set(ctx, sampleKey(prefix, b), data, ttl)
	}
	r.tick(ctx, true)
	keys, err := c.Keys(ctx, prefix+"hist:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var bytes int64
	for _, k := range keys {
		n, err := c.MemoryUsage(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		bytes += n
	}
	rd := NewReader(c, prefix)
	start := time.Now()
	h, err := rd.Read(ctx, p)
	first := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if h, err = rd.Read(ctx, p); err != nil {
		t.Fatal(err)
	}
	again := time.Since(start)
	body, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	// A step's sample, as the worker takes it: the rules' keys, each keyed
	// rule's 5 busiest, and their waiting tasks.
	start = time.Now()
	sampled, err := status.CollectKeys(ctx, c, prefix, p, func(rule string) []string {
		return []string{"business-1", "business-2", "business-3", "business-4", "business-5"}
	})
	if err == nil {
		err = status.AddWaiting(ctx, c, prefix, &sampled)
	}
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if n := len(sampled.Rules[1].Busiest); n != KeysPerRule {
		t.Errorf("the sample of a keyed rule has %d keys, want the %d named, in use or not", n, KeysPerRule)
	}
	t.Logf("%d keys, %.1f MiB in Redis (%.0f KiB per step); /history %.1f MiB of JSON; read in %v, then %v; a sample took %v", len(keys), float64(bytes)/(1<<20), float64(bytes)/1024/float64(Span/Step), float64(len(body))/(1<<20), first, again, took)
	if len(h.Rules) != 100 || len(h.Rules[1].Series) != 1+KeysPerRule || h.Rules[1].Series[0].Admitted[h.Steps-2] != 10*40/5.0 {
		t.Fatalf("history of %d rules; rule-1: %d series", len(h.Rules), len(h.Rules[1].Series))
	}
	// Measured: 5.0 MiB and 1.0 MiB (docs/operations.md).
	if bytes > 8<<20 || len(body) > 2<<20 {
		t.Errorf("%d bytes in Redis, %d of JSON: over 8 MiB or 2 MiB", bytes, len(body))
	}
}

// TestCluster: on a Redis Cluster, whose masters hold the steps' keys
// (no hash tag: each in a slot of its own), two workers' counts and a
// sample are read back whole.
func TestCluster(t *testing.T) {
	c := redistest.Cluster(t)
	p, err := policy.Parse([]byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	cur := step(now)
	sample := func(context.Context, map[string][]string) (status.Report, error) {
		return status.Report{Rules: []status.Rule{{Name: "global", Kind: "gcra", Limit: "10 per 1s", KeyState: &status.KeyState{Rate: 10}}}}, nil
	}
	recs := []*Recorder{NewRecorder(Config{Client: c, Prefix: prefix, Sample: sample}), NewRecorder(Config{Client: c, Prefix: prefix, Sample: sample})}
	for _, r := range recs {
		for b := cur - 20; b < cur; b++ {
			for i := 0; i < 5; i++ {
				r.add(taskrl.Event{Outcome: taskrl.Admitted, Keys: []taskrl.RuleKey{{Rule: "global"}, {Rule: "per-business", Key: fmt.Sprint("b", b%7)}}}, b)
			}
		}
		r.tick(ctx, true)
	}
	s := midStep(t, c)
	for _, r := range recs {
		r.tick(ctx, false)
		r.sampling.Wait()
	}
	var h History
	for deadline := time.Now().Add(10 * time.Second); step(h.At.Add(-settle))-1 < s; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("step %d not shown within 10s", s)
		}
		if h, err = NewReader(c, prefix).Read(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	total, keyed := 0.0, 0.0
	for b := cur - 20; b < cur; b++ {
		i := int(b - step(h.Start))
		total += h.Rules[0].Series[0].Admitted[i] * h.Step
		keyed += h.Rules[1].Series[0].Admitted[i] * h.Step
	}
	if total != 2*20*5 || keyed != 2*20*5 {
		t.Errorf("%v tasks under global, %v under per-business, want 200 each", total, keyed)
	}
	if v := h.Rules[0].Series[0].Limit[int(s-step(h.Start))]; v == nil || *v != 10 {
		t.Errorf("the sample's limit: %v", v)
	}
}
