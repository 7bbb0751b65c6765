// Package metrics exports the worker's Prometheus metrics: a taskrl.Observer
// for the middleware's decisions and a hook for the http:call handler.
//
// Metrics (every label value is bounded: rule names come from the policy,
// never from payloads, and entity keys are never a label):
//
//	taskrl_decisions_total{rule,outcome,queue,type} counter
//	    One per middleware event (admitted: once per run of a task a rule
//	    governs; rescheduled: each time one is moved). outcome is a
//	    taskrl.Outcome: admitted, rescheduled, refused, upstream_throttled,
//	    paused, held (an operator's pause, taskrl.PauseRule), unlimited,
//	    local, deferred (by the shed section), settled
//	    (a handler reported the task's actual cost, taskrl.Settle: once per
//	    task, beside its admitted); and for
//	    shadow rules (mode: shadow,
//	    worker --shadow) would_admit and would_wait, once per task. rule is
//	    the rule that made the task wait or refused it, "none" when none did
//	    (always "none" for upstream_throttled and paused: the block applies
//	    to the task's rules in the policy's throttle scope).
//	    queue and type are the task's; after 200 distinct (queue, type)
//	    pairs, further ones count as queue="other", type="other". Redis
//	    errors are not decisions: see below.
//	taskrl_hold_seconds                          histogram
//	    How long admitted tasks waited in the worker for their turn, zero
//	    waits included: the le="0" bucket counts tasks admitted at once, so
//	    _count is the admission rate and the rest shows how much holding
//	    costs in worker time.
//	taskrl_reschedule_delay_seconds              histogram
//	    How far ahead rescheduled tasks were moved (their booked slot, or
//	    when the denying rule would next allow them).
//	taskrl_shadow_wait_seconds                   histogram
//	    The wait shadow rules would have imposed on each task they would
//	    have held back (would_wait; a task they would never admit is not
//	    observed here).
//	taskrl_upstream_throttle_seconds             histogram
//	    The Retry-After of each upstream 429: how long the task's rules were
//	    blocked for every worker.
//	taskrl_redis_errors_total                    counter
//	    Failed limiter calls deciding a task, rate or slot (one per failed
//	    call; for a second after one, calls are not tried and not counted;
//	    the task follows the policy's redis_unavailable mode).
//	taskrl_quota_remaining{rule}                 gauge
//	    The units left under each rate or window rule as of the last decision
//	    that reported it. For a keyed rule (e.g. per business) this is the
//	    last decided key's value, a sample rather than a minimum.
//	taskrl_rule_rate{rule}                       gauge
//	    The rate per second each GCRA or adaptive rule decided at, as of
//	    its last decision: for an adaptive rule, the rate the fleet has
//	    learned (for a keyed one, the last decided key's).
//	taskrl_redis_clock_jumps_total               counter
//	    Jumps of the Redis server's clock against the worker's monotonic
//	    clock, a second or more between two decisions (taskrl.ClockJump):
//	    a failover to a host whose clock differs, a step of its clock.
//	taskrl_redis_settings{problem}               gauge
//	    The Redis masters the worker uses whose settings break the limits'
//	    promises, as last read (at start and every --redis-check-interval):
//	    "eviction" (a maxmemory-policy that can evict the limits' keys),
//	    "unread" (the policy could not be read), "persistence" (neither
//	    AOF nor RDB snapshots: a restart forgets every window). 0 when
//	    Redis is set up as the limits need.
//	taskrl_rule_slots{rule}                      gauge
//	    The slots each adaptive concurrency rule allowed as of its last
//	    decision: the number the fleet has learned (for a keyed one, the
//	    last decided key's).
//	taskrl_policy_reloads_total{result}           counter
//	    Policy file reloads (SIGHUP or a change of the file): result "ok"
//	    when the new policy took effect, "error" when it was refused (it
//	    did not validate or could not be read) and the running one kept.
//	taskrl_overrides{state}                      gauge
//	    Live per-key overrides (worker limits) in force ("applied") and
//	    skipped because the policy cannot take them ("skipped").
//	taskrl_redis_roundtrip_seconds{call}         histogram
//	    Round trips of the worker's Redis client, the limiter's and asynq's
//	    alike, by call: "script" (EVALSHA, EVAL, FCALL), "pipeline", "command".
//	taskrl_http_calls_total{code}                counter
//	    Requests sent by the http:call handler by result class: 2xx, 429,
//	    4xx (other than 429), 5xx, other (an unfollowed 1xx/3xx or a status
//	    beyond 599), error (no response: network error, timeout), refused
//	    (by the egress policy; nothing was sent).
//	taskrl_shed_signal                           gauge
//	    The signal of the policy's shed section as this worker last read it
//	    (a share, 0 to 1); 0 without a shed section.
//	taskrl_shed_level                            gauge
//	    The worker's shed level: class k of the shed section is deferred
//	    with probability level-k, clipped to [0, 1]; 0 without one.
//	taskrl_fair_flows{rule,state}                gauge
//	    The flows (values of its fair: template) of each fair rule, read
//	    from Redis when scraped (at most once a second): state "holding"
//	    counts those holding slots of a concurrency rule, "waiting" those
//	    waiting for one or with tasks of a gcra rule booked ahead; summed
//	    over the keys worker status lists (a keyed rule's 10 busiest).
//	    Absent without a fair rule.
//	taskrl_priority_flows{rule,level}            gauge
//	    Of those waiting at a gcra rule with priorities, how many wait at
//	    each level (1-5; a flow waiting at two levels counts at each).
//	    Absent for a rule without priorities.
//
// The worker also serves the Go runtime (go_*) and process (process_*)
// collectors on the same endpoint.
//
// Application code of the binaries, imported by cmd/worker.
package metrics

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/taskrl/taskrl/cmd/internal/httpcall"
	"github.com/taskrl/taskrl/internal/redisconf"
	"github.com/taskrl/taskrl/limits"
	"github.com/taskrl/taskrl/quotas"
	"github.com/taskrl/taskrl/taskrl"
)

// Metrics holds the worker's metrics. Build it with New; its methods are
// safe for concurrent use.
type Metrics struct {
	decisions      *prometheus.CounterVec
	hold           prometheus.Histogram
	reschedule     prometheus.Histogram
	upstream       prometheus.Histogram
	shadowWait     prometheus.Histogram
	redisErrors    prometheus.Counter
	quotaRemaining *prometheus.GaugeVec
	ruleRate       *prometheus.GaugeVec
	ruleSlots      *prometheus.GaugeVec
	settings       *prometheus.GaugeVec
	clockJumps     prometheus.Counter
	httpCalls      *prometheus.CounterVec
	reloads        *prometheus.CounterVec
	overrides      *prometheus.GaugeVec
	roundTrip      *prometheus.HistogramVec
	shed           atomic.Pointer[func() (signal, level float64, ok bool)]
	flows          atomic.Pointer[func() []FairFlows]

	pairs sync.Map // "queue\x00type" -> struct{}, the label pairs in use
	npair atomic.Int64

	// The children of the vectors that Observe uses per task, looked up
	// once: a label lookup hashes its values each time.
	mu       sync.RWMutex
	counters map[decisionLabels]prometheus.Counter // pairs in use only
	gauges   map[ruleGauge]prometheus.Gauge
}

// decisionLabels are the labels of a taskrl_decisions_total child.
type decisionLabels struct{ rule, outcome, queue, typ string }

// ruleGauge names a rule's child of a gauge vector.
type ruleGauge struct {
	vec  *prometheus.GaugeVec
	rule string
}

// maxPairs bounds the (queue, type) label pairs of the decision counter.
const maxPairs = 200

// New creates the metrics and registers them with reg (for example
// prometheus.NewRegistry()). It fails when reg already holds metrics of the
// same names.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "taskrl_decisions_total",
			Help: "Middleware decisions by outcome and by the rule that made the task wait or refused it (\"none\" if none did).",
		}, []string{"rule", "outcome", "queue", "type"}),
		hold: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "taskrl_hold_seconds",
			Help:    "Time admitted tasks waited in the worker for their turn; the le=\"0\" bucket counts tasks admitted at once.",
			Buckets: []float64{0, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}),
		reschedule: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "taskrl_reschedule_delay_seconds",
			Help:    "How far ahead rescheduled tasks were moved.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 21600, 86400},
		}),
		shadowWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "taskrl_shadow_wait_seconds",
			Help:    "Wait shadow rules would have imposed on the tasks they would have held back.",
			Buckets: []float64{.001, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 3600},
		}),
		upstream: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "taskrl_upstream_throttle_seconds",
			Help:    "Retry-After of upstream 429 answers: how long the task's rules were blocked for every worker.",
			Buckets: []float64{.1, .5, 1, 2, 5, 10, 30, 60, 300, 900, 3600},
		}),
		redisErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "taskrl_redis_errors_total",
			Help: "Failed limiter calls of the rate-limit middleware.",
		}),
		quotaRemaining: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "taskrl_quota_remaining",
			Help: "Units left under each rate or window rule as of its last decision (for keyed rules: the last decided key).",
		}, []string{"rule"}),
		ruleRate: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "taskrl_rule_rate",
			Help: "Rate per second each GCRA or adaptive rule decided at as of its last decision (adaptive: the learned rate).",
		}, []string{"rule"}),
		ruleSlots: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "taskrl_rule_slots",
			Help: "Slots each adaptive concurrency rule allowed as of its last decision: the number the fleet has learned.",
		}, []string{"rule"}),
		clockJumps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "taskrl_redis_clock_jumps_total",
			Help: "Jumps of the Redis server's clock against the worker's, a second or more between two decisions.",
		}),
		settings: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "taskrl_redis_settings",
			Help: "Redis masters whose settings break the limits' promises, as last read: eviction (maxmemory-policy can evict the limits' keys), unread (the policy could not be read), persistence (no AOF, no RDB).",
		}, []string{"problem"}),
		httpCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "taskrl_http_calls_total",
			Help: "Requests sent by the http:call handler by result class (2xx, 429, 4xx, 5xx, other, error, refused: the egress policy refused it, nothing was sent).",
		}, []string{"code"}),
		overrides: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "taskrl_overrides",
			Help: "Live per-key overrides applied, and skipped because the policy cannot take them.",
		}, []string{"state"}),
		roundTrip: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "taskrl_redis_roundtrip_seconds",
			Help:    "Round trips of the worker's Redis client by call: script, pipeline, command.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}, []string{"call"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "taskrl_policy_reloads_total",
			Help: "Policy file reloads by result: ok (in effect) or error (refused; the running policy was kept).",
		}, []string{"result"}),
	}
	shedValue := func(level bool) func() float64 {
		return func() float64 {
			f := m.shed.Load()
			if f == nil {
				return 0
			}
			s, l, _ := (*f)()
			if level {
				return l
			}
			return s
		}
	}
	shedSignal := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "taskrl_shed_signal",
		Help: "The signal of the policy's shed section as last read (0 to 1); 0 without one.",
	}, shedValue(false))
	shedLevel := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "taskrl_shed_level",
		Help: "The shed level: class k of the shed section is deferred with probability level-k, clipped to [0, 1].",
	}, shedValue(true))
	for _, p := range []string{"eviction", "unread", "persistence"} {
		m.settings.WithLabelValues(p) // 0 until the first check
	}
	for _, c := range []prometheus.Collector{m.decisions, m.hold, m.reschedule, m.shadowWait, m.upstream, m.redisErrors, m.quotaRemaining, m.ruleRate, m.ruleSlots, m.settings, m.clockJumps, m.httpCalls, m.reloads, m.overrides, m.roundTrip, shedSignal, shedLevel, flowsCollector{m}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, class := range httpcall.Classes {
		m.httpCalls.WithLabelValues(class)
	}
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("error")
	m.Overrides(0, 0)
	for _, call := range []string{"script", "pipeline", "command"} {
		m.roundTrip.WithLabelValues(call)
	}
	return m, nil
}

// Observe implements taskrl.Observer: it counts the event. It is quick and
// safe for concurrent use.
func (m *Metrics) Observe(e taskrl.Event) {
	if e.Outcome == taskrl.ClockJump {
		// Not a decision: the server's clock moved (Event.Wait).
		m.clockJumps.Inc()
		return
	}
	if e.Outcome == taskrl.RedisError {
		m.redisErrors.Inc()
		return
	}
	m.decision(e).Inc()
	switch e.Outcome {
	case taskrl.Admitted:
		m.hold.Observe(max(e.Wait, 0).Seconds())
	case taskrl.Rescheduled:
		m.reschedule.Observe(max(e.Wait, 0).Seconds())
	case taskrl.UpstreamThrottled:
		m.upstream.Observe(max(e.Wait, 0).Seconds())
	case taskrl.WouldWait:
		if e.Wait != quotas.Never {
			m.shadowWait.Observe(max(e.Wait, 0).Seconds())
		}
	}
	for _, r := range e.Rules {
		m.gauge(m.quotaRemaining, r.Name).Set(float64(r.Remaining))
		if r.Interval > 0 {
			m.gauge(m.ruleRate, r.Name).Set(float64(time.Second) / float64(r.Interval))
		}
		if r.Slots > 0 {
			m.gauge(m.ruleSlots, r.Name).Set(float64(r.Slots))
		}
	}
}

// decision returns e's taskrl_decisions_total child.
func (m *Metrics) decision(e taskrl.Event) prometheus.Counter {
	rule := e.Rule
	if rule == "" {
		rule = "none"
	}
	k := decisionLabels{rule, string(e.Outcome), e.Queue, e.TaskType}
	m.mu.RLock()
	c, ok := m.counters[k]
	m.mu.RUnlock()
	if ok {
		return c
	}
	queue, typ := e.Queue, e.TaskType
	if _, ok := m.pairs.Load(queue + "\x00" + typ); !ok {
		if m.npair.Add(1) <= maxPairs {
			m.pairs.Store(queue+"\x00"+typ, struct{}{})
		} else {
			queue, typ = "other", "other"
		}
	}
	c = m.decisions.WithLabelValues(rule, string(e.Outcome), queue, typ)
	if queue == e.Queue && typ == e.TaskType {
		// A pair in use keeps its labels: its child is kept. Those
		// counted as "other" are not, so that the map stays bounded.
		m.mu.Lock()
		if m.counters == nil {
			m.counters = map[decisionLabels]prometheus.Counter{}
		}
		m.counters[k] = c
		m.mu.Unlock()
	}
	return c
}

// gauge returns rule's child of vec.
func (m *Metrics) gauge(vec *prometheus.GaugeVec, rule string) prometheus.Gauge {
	k := ruleGauge{vec, rule}
	m.mu.RLock()
	g, ok := m.gauges[k]
	m.mu.RUnlock()
	if ok {
		return g
	}
	g = vec.WithLabelValues(rule)
	m.mu.Lock()
	if m.gauges == nil {
		m.gauges = map[ruleGauge]prometheus.Gauge{}
	}
	m.gauges[k] = g
	m.mu.Unlock()
	return g
}

// WatchShed makes the shed gauges read state, e.g. the middleware's
// ShedState. Safe for concurrent use.
func (m *Metrics) WatchShed(state func() (signal, level float64, ok bool)) {
	m.shed.Store(&state)
}

// FairFlows is one fair rule's flows for taskrl_fair_flows: Holding hold
// slots, Waiting wait; for taskrl_priority_flows, at a rule with
// priorities, Levels[p] wait at level p (nil: none).
type FairFlows struct {
	Rule             string
	Holding, Waiting int
	Levels           map[int]int
}

// WatchFlows makes taskrl_fair_flows read state when scraped (it may read
// Redis; nil or an empty result: no series). Safe for concurrent use.
func (m *Metrics) WatchFlows(state func() []FairFlows) {
	m.flows.Store(&state)
}

// fairFlowsDesc describes taskrl_fair_flows.
var fairFlowsDesc = prometheus.NewDesc("taskrl_fair_flows",
	"Flows of each fair rule holding slots (state holding) or waiting (state waiting), as worker status lists them.",
	[]string{"rule", "state"}, nil)

// flowsCollector collects taskrl_fair_flows and taskrl_priority_flows
// from WatchFlows's function.
type flowsCollector struct{ m *Metrics }

// priorityFlowsDesc describes taskrl_priority_flows.
var priorityFlowsDesc = prometheus.NewDesc("taskrl_priority_flows",
	"Flows waiting at each level of a gcra rule with priorities, as worker status lists them.",
	[]string{"rule", "level"}, nil)

func (c flowsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- fairFlowsDesc
	ch <- priorityFlowsDesc
}

func (c flowsCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.m.flows.Load()
	if f == nil {
		return
	}
	for _, r := range (*f)() {
		ch <- prometheus.MustNewConstMetric(fairFlowsDesc, prometheus.GaugeValue, float64(r.Holding), r.Rule, "holding")
		ch <- prometheus.MustNewConstMetric(fairFlowsDesc, prometheus.GaugeValue, float64(r.Waiting), r.Rule, "waiting")
		if r.Levels != nil {
			for level := 1; level <= limits.MaxPriority; level++ {
				ch <- prometheus.MustNewConstMetric(priorityFlowsDesc, prometheus.GaugeValue, float64(r.Levels[level]), r.Rule, strconv.Itoa(level))
			}
		}
	}
}

// HTTPCall counts one request of the http:call handler with its result
// class; pass it to httpcall.WithResultHook. Safe for concurrent use.
func (m *Metrics) HTTPCall(class string) {
	m.httpCalls.WithLabelValues(class).Inc()
}

// PolicyReload counts one reload of the policy file: ok when the new policy
// took effect, false when it was refused. Safe for concurrent use.
func (m *Metrics) PolicyReload(ok bool) {
	result := "error"
	if ok {
		result = "ok"
	}
	m.reloads.WithLabelValues(result).Inc()
}

// Overrides sets the number of live overrides applied and skipped. Safe for
// concurrent use.
func (m *Metrics) Overrides(applied, skipped int) {
	m.overrides.WithLabelValues("applied").Set(float64(applied))
	m.overrides.WithLabelValues("skipped").Set(float64(skipped))
}

// RedisHook returns a go-redis hook that times every round trip of the
// client it is added to in taskrl_redis_roundtrip_seconds.
func (m *Metrics) RedisHook() redis.Hook {
	return roundTripHook{m.roundTrip.WithLabelValues("script"), m.roundTrip.WithLabelValues("pipeline"), m.roundTrip.WithLabelValues("command")}
}

// roundTripHook holds the histogram's children by call.
type roundTripHook struct{ script, pipeline, command prometheus.Observer }

func (roundTripHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r roundTripHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmd)
		call := r.command
		switch cmd.Name() {
		case "evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro":
			call = r.script
		}
		call.Observe(time.Since(start).Seconds())
		return err
	}
}

func (r roundTripHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmds)
		r.pipeline.Observe(time.Since(start).Seconds())
		return err
	}
}

// RedisSettings sets taskrl_redis_settings from what rep says of each
// master.
func (m *Metrics) RedisSettings(rep redisconf.Report) {
	var evict, unread, persist float64
	for _, n := range rep.Nodes {
		switch {
		case n.Evicts():
			evict++
		case n.Unread():
			unread++
		}
		if n.Forgets() {
			persist++
		}
	}
	m.settings.WithLabelValues("eviction").Set(evict)
	m.settings.WithLabelValues("unread").Set(unread)
	m.settings.WithLabelValues("persistence").Set(persist)
}
