package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/taskrl/taskrl/cmd/internal/httpcall"
	"github.com/taskrl/taskrl/quotas"
	"github.com/taskrl/taskrl/taskrl"
)

func newMetrics(t *testing.T) (*Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

// documented is every metric name the package doc lists.
var documented = []string{
	"taskrl_decisions_total",
	"taskrl_shed_signal",
	"taskrl_shed_level",
	"taskrl_hold_seconds",
	"taskrl_reschedule_delay_seconds",
	"taskrl_upstream_throttle_seconds",
	"taskrl_shadow_wait_seconds",
	"taskrl_overrides",
	"taskrl_redis_roundtrip_seconds",
	"taskrl_redis_errors_total",
	"taskrl_quota_remaining",
	"taskrl_rule_rate",
	"taskrl_rule_slots",
	"taskrl_redis_settings",
	"taskrl_redis_clock_jumps_total",
	"taskrl_http_calls_total",
	"taskrl_policy_reloads_total",
	"taskrl_fair_flows",
	"taskrl_priority_flows",
}

func TestDecisions(t *testing.T) {
	m, reg := newMetrics(t)
	m.Observe(taskrl.Event{Outcome: taskrl.Admitted, Queue: "bulk", TaskType: "http:call"})
	m.Observe(taskrl.Event{Outcome: taskrl.Admitted, Wait: 20 * time.Millisecond})
	m.Observe(taskrl.Event{Outcome: taskrl.Rescheduled, Wait: 3 * time.Second})
	m.Observe(taskrl.Event{Outcome: taskrl.Rescheduled, Rule: "daily", Wait: time.Hour})
	m.Observe(taskrl.Event{Outcome: taskrl.Refused, Rule: "per-business"})
	m.Observe(taskrl.Event{Outcome: taskrl.UpstreamThrottled, Wait: 2 * time.Second})
	m.Observe(taskrl.Event{Outcome: taskrl.RedisError, Err: errors.New("dial tcp: refused")})
	m.Observe(taskrl.Event{Outcome: taskrl.RedisError, Err: errors.New("i/o timeout")})
	m.Observe(taskrl.Event{Outcome: taskrl.Unlimited})

	want := `
# HELP taskrl_decisions_total Middleware decisions by outcome and by the rule that made the task wait or refused it ("none" if none did).
# TYPE taskrl_decisions_total counter
taskrl_decisions_total{outcome="admitted",queue="",rule="none",type=""} 1
taskrl_decisions_total{outcome="admitted",queue="bulk",rule="none",type="http:call"} 1
taskrl_decisions_total{outcome="refused",queue="",rule="per-business",type=""} 1
taskrl_decisions_total{outcome="rescheduled",queue="",rule="daily",type=""} 1
taskrl_decisions_total{outcome="rescheduled",queue="",rule="none",type=""} 1
taskrl_decisions_total{outcome="unlimited",queue="",rule="none",type=""} 1
taskrl_decisions_total{outcome="upstream_throttled",queue="",rule="none",type=""} 1
# HELP taskrl_redis_errors_total Failed limiter calls of the rate-limit middleware.
# TYPE taskrl_redis_errors_total counter
taskrl_redis_errors_total 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "taskrl_decisions_total", "taskrl_redis_errors_total"); err != nil {
		t.Error(err)
	}
}

// TestLabelPairsBounded: the decision counter's (queue, type) pairs stop
// at maxPairs; further ones count as "other".
func TestLabelPairsBounded(t *testing.T) {
	m, _ := newMetrics(t)
	for i := 0; i < maxPairs+50; i++ {
		m.Observe(taskrl.Event{Outcome: taskrl.Admitted, Queue: "q", TaskType: fmt.Sprintf("t%d", i)})
	}
	m.Observe(taskrl.Event{Outcome: taskrl.Admitted, Queue: "q", TaskType: "t0"})
	if got := testutil.CollectAndCount(m.decisions); got != maxPairs+1 {
		t.Errorf("%d series, want %d and other", got, maxPairs)
	}
	if got := testutil.ToFloat64(m.decisions.WithLabelValues("none", "admitted", "other", "other")); got != 50 {
		t.Errorf("other: %v, want 50", got)
	}
	if got := testutil.ToFloat64(m.decisions.WithLabelValues("none", "admitted", "q", "t0")); got != 2 {
		t.Errorf("t0: %v, want 2", got)
	}
	// The children kept for the next events are those of the pairs in use.
	if got := len(m.counters); got != maxPairs {
		t.Errorf("%d children kept, want %d", got, maxPairs)
	}
}

func TestHistograms(t *testing.T) {
	m, reg := newMetrics(t)
	m.Observe(taskrl.Event{Outcome: taskrl.Admitted})
	m.Observe(taskrl.Event{Outcome: taskrl.Admitted})
	m.Observe(taskrl.Event{Outcome: taskrl.Admitted, Wait: 300 * time.Millisecond})
	m.Observe(taskrl.Event{Outcome: taskrl.Rescheduled, Wait: 1500 * time.Millisecond})
	m.Observe(taskrl.Event{Outcome: taskrl.UpstreamThrottled, Wait: 7 * time.Second})
	// Refusals and Redis errors are not holds, reschedules or throttles.
	m.Observe(taskrl.Event{Outcome: taskrl.Refused, Wait: time.Minute})

	want := `
# HELP taskrl_hold_seconds Time admitted tasks waited in the worker for their turn; the le="0" bucket counts tasks admitted at once.
# TYPE taskrl_hold_seconds histogram
taskrl_hold_seconds_bucket{le="0"} 2
taskrl_hold_seconds_bucket{le="0.001"} 2
taskrl_hold_seconds_bucket{le="0.0025"} 2
taskrl_hold_seconds_bucket{le="0.005"} 2
taskrl_hold_seconds_bucket{le="0.01"} 2
taskrl_hold_seconds_bucket{le="0.025"} 2
taskrl_hold_seconds_bucket{le="0.05"} 2
taskrl_hold_seconds_bucket{le="0.1"} 2
taskrl_hold_seconds_bucket{le="0.25"} 2
taskrl_hold_seconds_bucket{le="0.5"} 3
taskrl_hold_seconds_bucket{le="1"} 3
taskrl_hold_seconds_bucket{le="2.5"} 3
taskrl_hold_seconds_bucket{le="5"} 3
taskrl_hold_seconds_bucket{le="+Inf"} 3
taskrl_hold_seconds_sum 0.3
taskrl_hold_seconds_count 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "taskrl_hold_seconds"); err != nil {
		t.Error(err)
	}
	if got := histCount(t, reg, "taskrl_reschedule_delay_seconds"); got != 1 {
		t.Errorf("reschedule count = %d, want 1", got)
	}
	if got := histSum(t, reg, "taskrl_reschedule_delay_seconds"); got != 1.5 {
		t.Errorf("reschedule sum = %v, want 1.5", got)
	}
	if got := histSum(t, reg, "taskrl_upstream_throttle_seconds"); got != 7 {
		t.Errorf("upstream throttle sum = %v, want 7", got)
	}
}

func TestQuotaRemaining(t *testing.T) {
	m, reg := newMetrics(t)
	m.Observe(taskrl.Event{Outcome: taskrl.Admitted, Rules: []quotas.RuleStatus{
		{Name: "vendor-peak", Remaining: 2, Used: 1},
		{Name: "per-business", Key: "b1", Remaining: 0, Used: 1},
	}})
	m.Observe(taskrl.Event{Outcome: taskrl.Admitted, Rules: []quotas.RuleStatus{
		{Name: "vendor-peak", Remaining: 1, Used: 2},
		{Name: "per-business", Key: "b2\n{secret}", Remaining: 1, Used: 0},
	}})
	want := `
# HELP taskrl_quota_remaining Units left under each rate or window rule as of its last decision (for keyed rules: the last decided key).
# TYPE taskrl_quota_remaining gauge
taskrl_quota_remaining{rule="per-business"} 1
taskrl_quota_remaining{rule="vendor-peak"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "taskrl_quota_remaining"); err != nil {
		t.Error(err)
	}
	// Keys never become label values.
	if n := testutil.CollectAndCount(m.quotaRemaining); n != 2 {
		t.Errorf("%d quota_remaining series, want 2 (one per rule)", n)
	}
}

func TestRuleRate(t *testing.T) {
	m, reg := newMetrics(t)
	m.Observe(taskrl.Event{Outcome: taskrl.Admitted, Rules: []quotas.RuleStatus{
		{Name: "vendor-learned", Interval: 40 * time.Millisecond},
		{Name: "window", Remaining: 3}, // no interval: not a rate
	}})
	m.Observe(taskrl.Event{Outcome: taskrl.Rescheduled, Rules: []quotas.RuleStatus{{Name: "vendor-learned", Interval: 50 * time.Millisecond}}})
	want := `
# HELP taskrl_rule_rate Rate per second each GCRA or adaptive rule decided at as of its last decision (adaptive: the learned rate).
# TYPE taskrl_rule_rate gauge
taskrl_rule_rate{rule="vendor-learned"} 20
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "taskrl_rule_rate"); err != nil {
		t.Error(err)
	}
}

// TestClockJumps: a clock jump counts in its own counter, not as a
// decision.
func TestClockJumps(t *testing.T) {
	m, reg := newMetrics(t)
	m.Observe(taskrl.Event{Outcome: taskrl.ClockJump, Wait: 5 * time.Second})
	m.Observe(taskrl.Event{Outcome: taskrl.ClockJump, Wait: -30 * time.Second})
	want := `
# HELP taskrl_redis_clock_jumps_total Jumps of the Redis server's clock against the worker's, a second or more between two decisions.
# TYPE taskrl_redis_clock_jumps_total counter
taskrl_redis_clock_jumps_total 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "taskrl_redis_clock_jumps_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m.decisions); n != 0 {
		t.Errorf("%d decision series, want none", n)
	}
}

// TestRuleSlots: the slots an adaptive concurrency rule allowed, from its
// latest decision; other rules have none.
func TestRuleSlots(t *testing.T) {
	m, reg := newMetrics(t)
	m.Observe(taskrl.Event{Outcome: taskrl.Admitted, Rules: []quotas.RuleStatus{{Name: "backend", Slots: 12}, {Name: "cap", Remaining: 3}}})
	m.Observe(taskrl.Event{Outcome: taskrl.Rescheduled, Rules: []quotas.RuleStatus{{Name: "backend", Slots: 9}}})
	want := `
# HELP taskrl_rule_slots Slots each adaptive concurrency rule allowed as of its last decision: the number the fleet has learned.
# TYPE taskrl_rule_slots gauge
taskrl_rule_slots{rule="backend"} 9
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "taskrl_rule_slots"); err != nil {
		t.Error(err)
	}
}

func TestHTTPCalls(t *testing.T) {
	m, reg := newMetrics(t)
	// Every class is exposed from the start, at 0.
	if n := testutil.CollectAndCount(m.httpCalls); n != len(httpcall.Classes) {
		t.Errorf("%d http_calls series before any call, want %d", n, len(httpcall.Classes))
	}
	m.HTTPCall(httpcall.Class2xx)
	m.HTTPCall(httpcall.Class2xx)
	m.HTTPCall(httpcall.Class429)
	m.HTTPCall(httpcall.ClassError)
	want := `
# HELP taskrl_http_calls_total Requests sent by the http:call handler by result class (2xx, 429, 4xx, 5xx, other, error, refused: the egress policy refused it, nothing was sent).
# TYPE taskrl_http_calls_total counter
taskrl_http_calls_total{code="2xx"} 2
taskrl_http_calls_total{code="429"} 1
taskrl_http_calls_total{code="4xx"} 0
taskrl_http_calls_total{code="5xx"} 0
taskrl_http_calls_total{code="error"} 1
taskrl_http_calls_total{code="other"} 0
taskrl_http_calls_total{code="refused"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "taskrl_http_calls_total"); err != nil {
		t.Error(err)
	}
}

// TestDocumented checks that every metric the package doc lists is
// registered and that the doc lists every registered one.
func TestDocumented(t *testing.T) {
	m, reg := newMetrics(t)
	m.Observe(taskrl.Event{Outcome: taskrl.Admitted, Rules: []quotas.RuleStatus{{Name: "r", Interval: time.Second}, {Name: "s", Slots: 4}}})
	m.WatchFlows(func() []FairFlows { return []FairFlows{{Rule: "r", Levels: map[int]int{}}} })
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
	}
	for _, name := range documented {
		if !got[name] {
			t.Errorf("documented metric %s is not registered", name)
		}
		delete(got, name)
	}
	for name := range got {
		t.Errorf("metric %s is registered but not documented", name)
	}
}

func TestDuplicateRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := New(reg); err == nil {
		t.Fatal("second New on the same registry succeeded, want an error")
	}
}

func TestConcurrentObserve(t *testing.T) {
	m, reg := newMetrics(t)
	var o taskrl.Observer = m
	const goroutines, each = 8, 500
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				o.Observe(taskrl.Event{Outcome: taskrl.Admitted, Rules: []quotas.RuleStatus{{Name: "r", Remaining: i}}})
				m.HTTPCall(httpcall.Class2xx)
			}
		}()
	}
	wg.Wait()
	if got := testutil.ToFloat64(m.decisions.WithLabelValues("none", "admitted", "", "")); got != goroutines*each {
		t.Errorf("admitted = %v, want %d", got, goroutines*each)
	}
	if got := histCount(t, reg, "taskrl_hold_seconds"); got != goroutines*each {
		t.Errorf("hold count = %d, want %d", got, goroutines*each)
	}
	if got := testutil.ToFloat64(m.httpCalls.WithLabelValues("2xx")); got != goroutines*each {
		t.Errorf("2xx = %v, want %d", got, goroutines*each)
	}
}

func histCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	return hist(t, reg, name).GetSampleCount()
}

func histSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	return hist(t, reg, name).GetSampleSum()
}

func hist(t *testing.T, reg *prometheus.Registry, name string) interface {
	GetSampleCount() uint64
	GetSampleSum() float64
} {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram()
		}
	}
	t.Fatalf("metric %s not found", name)
	return nil
}

func BenchmarkObserve(b *testing.B) {
	m, err := New(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	e := taskrl.Event{Outcome: taskrl.Admitted, Rules: []quotas.RuleStatus{{Name: "a", Remaining: 3}, {Name: "b", Remaining: 1}}}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Observe(e)
		}
	})
}

// TestRedisHook: each round trip is timed under its kind of call.
func TestRedisHook(t *testing.T) {
	m, _ := newMetrics(t)
	h := m.RedisHook()
	ctx := context.Background()
	done := func(context.Context, redis.Cmder) error { return nil }
	h.ProcessHook(done)(ctx, redis.NewCmd(ctx, "evalsha", "abc", 0))
	h.ProcessHook(done)(ctx, redis.NewCmd(ctx, "get", "k"))
	h.ProcessHook(done)(ctx, redis.NewCmd(ctx, "get", "k"))
	h.ProcessPipelineHook(func(context.Context, []redis.Cmder) error { return nil })(ctx, nil)
	for call, want := range map[string]uint64{"script": 1, "command": 2, "pipeline": 1} {
		var pb dto.Metric
		if err := m.roundTrip.WithLabelValues(call).(prometheus.Histogram).Write(&pb); err != nil {
			t.Fatal(err)
		}
		if got := pb.GetHistogram().GetSampleCount(); got != want {
			t.Errorf("%s: %d round trips timed, want %d", call, got, want)
		}
	}
}

// TestDashboard: the Grafana dashboard in examples/ is valid JSON, and
// every metric its queries use is one the worker exports.
func TestDashboard(t *testing.T) {
	data, err := os.ReadFile("../../../examples/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	name := regexp.MustCompile(`taskrl_[a-z_]+`)
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			for _, m := range name.FindAllString(q.Expr, -1) {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if trimmed := strings.TrimSuffix(m, suffix); slices.Contains(documented, trimmed) {
						m = trimmed
					}
				}
				if !slices.Contains(documented, m) {
					t.Errorf("panel %q queries %s, which the worker does not export", p.Title, m)
				}
				used[m] = true
			}
		}
	}
	for _, m := range documented {
		if !used[m] {
			t.Errorf("no panel shows %s", m)
		}
	}
}

// TestFairFlows: taskrl_fair_flows has no series until WatchFlows, then
// each fair rule's holding and waiting flows as its function reports them
// when scraped.
func TestFairFlows(t *testing.T) {
	m, reg := newMetrics(t)
	if n, err := testutil.GatherAndCount(reg, "taskrl_fair_flows"); err != nil || n != 0 {
		t.Fatalf("before WatchFlows: %d series, %v", n, err)
	}
	calls := 0
	m.WatchFlows(func() []FairFlows {
		calls++
		return []FairFlows{{Rule: "sends", Holding: 2, Waiting: 1}}
	})
	want := `
# HELP taskrl_fair_flows Flows of each fair rule holding slots (state holding) or waiting (state waiting), as worker status lists them.
# TYPE taskrl_fair_flows gauge
taskrl_fair_flows{rule="sends",state="holding"} 2
taskrl_fair_flows{rule="sends",state="waiting"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "taskrl_fair_flows"); err != nil {
		t.Error(err)
	}
	if calls != 1 {
		t.Errorf("the function ran %d times for one scrape", calls)
	}
}
