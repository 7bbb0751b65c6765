// Package simulate runs a day of a fleet's traffic in seconds: N virtual
// workers take tasks of one type from a backlog that never runs dry and
// admit them under a policy the way the middleware does, on quotas.Model
// and a virtual clock, against a simulated vendor whose limit changes on a
// schedule (Vendor). It reports, per interval, the vendor's limit, the rate
// an adaptive rule has learned, the calls, the share answered 429 and the
// share of the vendor's limit used; with several payloads in the backlog
// (businesses, weights, plans, priorities), what each one got.
// enqueue --simulate is its command line.
//
// What it models of the middleware (taskrl/admit.go, throttle.go): at
// every step of a task's admission it asks admission.Plan, the function
// the middleware asks, what to do, and does it: every attempt decides the
// task's rate and window rules with Reserve (horizon MaxReserve, at most
// 1 s for a task with an adaptive rule); a turn within MaxHold is waited
// for in the worker slot, a later one is booked and the task comes back
// the pacer's lead (1.6 s at asynq's default TaskCheckInterval) before its
// slot and waits for it, or decides again when it comes back late; before
// a call that waited, Held (fair and adaptive rules) and the block markers
// are checked; a 429 refunds the call's charge, blocks the throttle scope
// (cutting adaptive rules) until Retry-After and reschedules the task
// then. Concurrency rules are taken before the call, waited for in the
// worker up to MaxHold, and released at its answer; a task that finds no
// slot then is rescheduled, its rate charge kept as its booking. Not
// modelled: asynq's own polling delays, Redis round trips, the throttle
// budget, deadlines, failure modes, and setting a backlog aside (a worker
// moves the tasks whose turn is a minute or more away out of the queue
// undecided; the simulation books every waiting task, so a backlog of
// more than a minute of a fair rule's rate is booked in the backlog's
// order and shares it by arrival rather than by weight).
//
// Tool code, imported by cmd/enqueue.
package simulate

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/admission"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// Spec is one simulation.
type Spec struct {
	// Policy, Type and Queue: the tasks' rules are Policy.Bind(Type, Queue),
	// which must bind some rule, with the policy's overrides and the plans
	// payloads name applied as the middleware applies them.
	Policy      *policy.Policy
	Type, Queue string
	// Payloads are the backlog's payloads: its task i has Payloads[i mod
	// len(Payloads)], and a task answered 200 is replaced by one with the
	// same payload, so each payload keeps its part of the backlog (a payload
	// given twice has twice the tasks waiting). Empty: every task has {}.
	Payloads [][]byte
	// Vendor is the remote side's limit over time; required.
	Vendor Vendor
	// Workers × Concurrency task slots (defaults 3 and 16).
	Workers, Concurrency int
	// Latency is the vendor's answer time (default 20ms).
	Latency time.Duration
	// Jitter: each call reaches the vendor up to this much later than it
	// was made, uniformly (default defaultJitter, 2ms; negative: none), as network and
	// scheduling delays do: a strict vendor throttles calls paced just
	// under its limit that arrive bunched. Pseudo-random, the same every
	// run.
	Jitter time.Duration
	// Duration is how long the simulated day lasts; required.
	Duration time.Duration
	// Interval is the report's row length (default: Duration/24, at least
	// 1s).
	Interval time.Duration
	// Backlog is how many tasks wait at all times: each task answered 200
	// is replaced by a new one. Default: 1.5 s of the vendor's highest
	// rate, at least 50 and at least len(Payloads) (always more work than
	// the vendor allows). It must hold every payload.
	Backlog int
	// MaxHold and MaxReserve as in taskrl.Config (defaults 500ms and 1h).
	MaxHold, MaxReserve time.Duration
	// Start is the simulated clock's start (default 2026-01-01 00:00 UTC).
	Start time.Time
}

// Row is one interval of the report.
type Row struct {
	From, To time.Duration // offsets from the start
	// Limit is the vendor's rate per second at the end of the interval.
	Limit float64
	// Learned is the rate per second the first adaptive rule (its global
	// key, or the first payload's) had learned at the end of the interval;
	// 0 without one.
	Learned float64
	// Calls made to the vendor, and those answered 429.
	Calls, Throttled int
	// Used is the calls answered 200 over what the vendor's limits allowed
	// in the interval (its rate times the time each limit was in force);
	// for a service (Phase.Slots), InFlight over Slots.
	Used float64
	// A service's (Phase.Slots) at the end of the interval: its slots;
	// the slots the first adaptive concurrency rule (the first payload's
	// key) had learned; the calls in service on average over the
	// interval; and the 99th percentile of the latencies of the calls
	// answered in it.
	Slots, LearnedSlots int
	InFlight            float64
	P99                 time.Duration
}

// Report is a simulation's outcome.
type Report struct {
	Rows []Row
	// Calls, Throttled: totals; Done: tasks answered 200; Archived: tasks
	// no wait could admit (a rule that never admits them).
	Calls, Throttled, Done, Archived int
	// Decisions counts the limiter operations (decide, refund, block,
	// held, slots) the middleware would have made of Redis.
	Decisions int
	// Payloads has the totals of each distinct payload of Spec.Payloads,
	// in their first order.
	Payloads []PayloadStats
}

// PayloadStats is what the tasks of one payload got.
type PayloadStats struct {
	Payload string
	// Waiting is the payload's tasks in the backlog.
	Waiting int
	// Calls, Throttled, Done and Archived as in Report.
	Calls, Throttled, Done, Archived int
}

// ThrottledShare is Throttled/Calls (0 without calls).
func (r Report) ThrottledShare() float64 {
	if r.Calls == 0 {
		return 0
	}
	return float64(r.Throttled) / float64(r.Calls)
}

// The middleware's timing, which the simulation follows (the pace lead of
// workers at asynq's default TaskCheckInterval).
var paceLead = admission.PaceLead(0)

// defaultJitter is Spec.Jitter's default.
const defaultJitter = 2 * time.Millisecond

func (s *Spec) defaults() error {
	if s.Policy == nil {
		return errors.New("simulate: a policy is required")
	}
	if len(s.Vendor.Phases) == 0 {
		return errors.New("simulate: a vendor is required")
	}
	if s.Duration <= 0 {
		return errors.New("simulate: the duration must be positive")
	}
	if s.Workers == 0 {
		s.Workers = 3
	}
	if s.Concurrency == 0 {
		s.Concurrency = 16
	}
	if s.Latency == 0 {
		s.Latency = 20 * time.Millisecond
	}
	if s.Jitter == 0 {
		s.Jitter = defaultJitter
	}
	if s.Interval == 0 {
		s.Interval = max(time.Second, s.Duration/24)
	}
	if s.Backlog == 0 {
		peak := 0.0
		for _, p := range s.Vendor.Phases {
			if p.Slots > 0 {
				// A service: its slots at its unloaded latency.
				peak = max(peak, float64(p.Slots)/s.Latency.Seconds())
				continue
			}
			peak = max(peak, p.Limit.Rate/p.Limit.Period.Seconds())
		}
		s.Backlog = max(50, int(math.Ceil(1.5*peak)), len(s.Payloads))
	}
	if s.MaxHold == 0 {
		s.MaxHold = 500 * time.Millisecond
	}
	if s.MaxReserve == 0 {
		s.MaxReserve = time.Hour
	}
	if s.Start.IsZero() {
		s.Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	if len(s.Payloads) == 0 {
		s.Payloads = [][]byte{[]byte("{}")}
	}
	switch {
	case s.Workers < 1 || s.Concurrency < 1 || s.Backlog < 1:
		return errors.New("simulate: workers, concurrency and backlog must be at least 1")
	case s.Backlog < len(s.Payloads):
		return fmt.Errorf("simulate: a backlog of %d cannot hold %d payloads", s.Backlog, len(s.Payloads))
	case s.Latency < 0 || s.Interval < 0 || s.MaxHold < 0 || s.MaxReserve < 0:
		return errors.New("simulate: durations must not be negative")
	case s.Duration/s.Interval > 100_000:
		return errors.New("simulate: more than 100000 intervals")
	}
	return nil
}

// task is one task in the simulation.
type task struct {
	f      *flow
	holder string          // the task's holder of concurrency slots
	booked time.Time       // the task's booked slot; zero: none
	charge quotas.Decision // the rate charge it runs or is booked under
	taken  int             // decisions again after a booking was not held
}

// event is something that happens at a time; seq keeps events of one time
// in the order they were scheduled.
type event struct {
	at  time.Time
	seq int
	fn  func()
}

type events []event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	return e[i].at.Before(e[j].at) || e[i].at.Equal(e[j].at) && e[i].seq < e[j].seq
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

type sim struct {
	spec    Spec
	m       quotas.Decider // a quotas.Model on the simulated clock
	ctx     context.Context
	vendor  *gcra.Model
	now     time.Time
	q       events
	seq     int
	pending []*task
	free    int
	markers map[string]time.Time
	flows   []*flow // one per payload of the spec, repeated ones shared

	fair, adaptive bool
	horizon        time.Duration
	lim            admission.Limits // what admission.Plan reads
	lease          time.Duration    // the longest lease of the slots

	rep Report
	row *Row
	rng *rand.Rand

	// A service (Phase.Slots): the calls in service, the time their
	// count was last changed, and since the row began its integral over
	// time (call-seconds) and the latencies of the calls answered.
	busy      int
	busySince time.Time
	busyArea  float64
	latencies []time.Duration
	holders   int // the holders named so far (task.holder)
}

// flow is the rules and requests of one payload, split as the middleware
// splits them: rate and window rules, concurrency rules, and the throttle
// scope.
type flow struct {
	stats                     *PayloadStats
	rates, slots, scope       *quotas.Set
	rateReq, slotReq, scopReq quotas.Request
	rateNames                 []string
	learned                   int // index in rates of the reported adaptive rule; -1 none
	learnedSlots              int // index in slots of the reported adaptive concurrency rule; -1 none
}

// Run runs spec and returns its report.
func Run(spec Spec) (Report, error) {
	if err := spec.defaults(); err != nil {
		return Report{}, err
	}
	s := &sim{spec: spec, ctx: context.Background(), vendor: &gcra.Model{}, now: spec.Start, free: spec.Workers * spec.Concurrency,
		markers: map[string]time.Time{}, rng: rand.New(rand.NewPCG(1, 2))}
	s.m = quotas.NewModelOn(func() time.Time { return s.now })
	if err := s.bind(); err != nil {
		return Report{}, err
	}
	end := spec.Start.Add(spec.Duration)
	for from := time.Duration(0); from < spec.Duration; from += spec.Interval {
		to := min(from+spec.Interval, spec.Duration)
		s.at(spec.Start.Add(from), func() { s.startRow(from, to) })
	}
	s.at(end, s.endRow)
	for i := 0; i < spec.Backlog; i++ {
		f := s.flows[i%len(s.flows)]
		f.stats.Waiting++
		s.ready(&task{f: f})
	}
	for len(s.q) > 0 {
		e := heap.Pop(&s.q).(event)
		if e.at.After(end) {
			break
		}
		s.now = e.at
		e.fn()
		s.dispatch()
	}
	seen := map[*flow]bool{} // a payload given twice is one flow
	for _, f := range s.flows {
		if !seen[f] {
			seen[f] = true
			s.rep.Payloads = append(s.rep.Payloads, *f.stats)
		}
	}
	return s.rep, nil
}

// bind builds a flow for each distinct payload.
func (s *sim) bind() error {
	b := s.spec.Policy.Bind(s.spec.Type, s.spec.Queue)
	if b == nil {
		return fmt.Errorf("simulate: no rule of the policy matches type %q in queue %q", s.spec.Type, s.spec.Queue)
	}
	s.horizon = s.spec.MaxReserve
	s.lim = admission.Limits{MaxHold: s.spec.MaxHold, Early: admission.EarlyBooking(paceLead, s.spec.MaxHold)}
	seen := map[string]*flow{}
	for i, p := range s.spec.Payloads {
		f := seen[string(p)]
		if f == nil {
			var err error
			if f, err = s.bindPayload(b, p); err != nil {
				if len(s.spec.Payloads) > 1 {
					return fmt.Errorf("simulate: payload %d: %w", i+1, err)
				}
				return fmt.Errorf("simulate: the payload: %w", err)
			}
			seen[string(p)] = f
		}
		s.flows = append(s.flows, f)
	}
	if s.adaptive {
		s.horizon = min(s.horizon, admission.AdaptiveReserve)
	}
	return nil
}

// bindPayload splits b's rules for payload as the middleware does.
func (s *sim) bindPayload(b *policy.Binding, payload []byte) (*flow, error) {
	req, err := b.Request(payload)
	if err != nil {
		return nil, err
	}
	b = b.ForPayload(req.Keys, payload)
	f := &flow{stats: &PayloadStats{Payload: string(payload)}, learned: -1, learnedSlots: -1}
	named := map[string]bool{}
	for _, n := range s.spec.Policy.Throttle() {
		named[n] = true
	}
	var rates, slots, scoped, adaptive []quotas.Rule
	var rateIdx, slotIdx, scopedIdx, adaptiveIdx []int
	for i, r := range b.Rules() {
		if b.Exempt(i) {
			continue // an unlimited override: the rule does not apply
		}
		if named[r.Name] {
			scoped, scopedIdx = append(scoped, r), append(scopedIdx, i)
		}
		switch r.Limit.(type) {
		case quotas.Concurrency:
			if c := r.Limit.(quotas.Concurrency); c.Adaptive && f.learnedSlots < 0 {
				f.learnedSlots = len(slots)
			}
			slots, slotIdx = append(slots, r), append(slotIdx, i)
			s.lease = max(s.lease, r.Limit.(quotas.Concurrency).Lease)
			continue
		case quotas.Adaptive:
			if f.learned < 0 {
				f.learned = len(rates)
			}
			adaptive, adaptiveIdx = append(adaptive, r), append(adaptiveIdx, i)
		}
		s.fair = s.fair || r.Fair
		rates, rateIdx = append(rates, r), append(rateIdx, i)
		f.rateNames = append(f.rateNames, r.Name)
	}
	s.adaptive = s.adaptive || len(adaptive) > 0
	switch {
	case len(scoped) > 0:
	case len(adaptive) > 0:
		scoped, scopedIdx = adaptive, adaptiveIdx
	case len(rates) > 0:
		scoped, scopedIdx = rates, rateIdx
	default:
		scoped, scopedIdx = slots, slotIdx
	}
	sub := func(idx []int) quotas.Request {
		r := quotas.Request{Critical: req.Critical, Holder: "task"}
		for _, i := range idx {
			r.Keys = append(r.Keys, req.Keys[i])
			r.Fair = append(r.Fair, req.Fair[i])
			if req.Weights != nil {
				r.Weights = append(r.Weights, req.Weights[i])
			}
			if req.Priorities != nil {
				r.Priorities = append(r.Priorities, req.Priorities[i])
			}
			if req.Costs != nil {
				r.Costs = append(r.Costs, req.Costs[i])
			}
		}
		return r
	}
	for _, x := range []struct {
		rules []quotas.Rule
		idx   []int
		set   **quotas.Set
		req   *quotas.Request
	}{{rates, rateIdx, &f.rates, &f.rateReq}, {slots, slotIdx, &f.slots, &f.slotReq}, {scoped, scopedIdx, &f.scope, &f.scopReq}} {
		if len(x.rules) == 0 {
			continue
		}
		if *x.set, err = quotas.NewSet(x.rules...); err != nil {
			return nil, err
		}
		*x.req = sub(x.idx)
	}
	return f, nil
}

func (s *sim) at(t time.Time, fn func()) {
	s.seq++
	heap.Push(&s.q, event{at: t, seq: s.seq, fn: fn})
}

func (s *sim) after(d time.Duration, fn func()) { s.at(s.now.Add(d), fn) }

// ready puts t in the queue: a worker slot takes it when one is free.
func (s *sim) ready(t *task) { s.pending = append(s.pending, t) }

func (s *sim) dispatch() {
	for s.free > 0 && len(s.pending) > 0 {
		t := s.pending[0]
		s.pending = s.pending[1:]
		s.free--
		s.start(t)
	}
}

// release frees the slot of the task it ran.
func (s *sim) release() { s.free++ }

// reschedule makes t ready again at `at`, booked for slot if set.
func (s *sim) reschedule(t *task, at, slot time.Time) {
	t.booked = slot
	if !slot.IsZero() {
		at = slot.Add(-paceLead)
	}
	s.at(at, func() { s.ready(t) })
	s.release()
}

// plan is admission.Plan at the simulated time, for a task without a
// deadline.
func (s *sim) plan(st admission.Step) admission.Action {
	st.Now, st.Left = s.now, admission.NoDeadline
	return admission.Plan(s.lim, st)
}

// outcome is what admission.Plan reads of a decision.
func outcome(d quotas.Decision) admission.Decision {
	return admission.Decision{Allowed: d.Allowed, Delay: d.Delay, RetryAfter: d.RetryAfter, Now: d.Now, Rule: d.Rule}
}

func (s *sim) start(t *task) {
	if t.booked.IsZero() || t.f.rates == nil {
		s.decide(t)
		return
	}
	a := s.plan(admission.Step{Stage: admission.Booked, Booked: t.booked})
	switch a.Verb {
	case admission.Decide:
		if a.Refund {
			s.refund(t)
		}
		s.decide(t)
	case admission.Reschedule:
		s.reschedule(t, time.Time{}, a.Booked)
	default:
		t.booked = time.Time{}
		s.after(a.Wait, func() { s.check(t) })
	}
}

func (s *sim) refund(t *task) {
	if t.f.rates != nil && t.charge.Allowed {
		s.rep.Decisions++
		_ = s.m.Refund(s.ctx, t.f.rates, t.f.rateReq, t.charge)
	}
	t.charge = quotas.Decision{}
}

func (s *sim) decide(t *task) {
	if t.f.rates == nil {
		s.call(t, s.now.Add(s.spec.MaxHold))
		return
	}
	s.rep.Decisions++
	d, err := s.m.Reserve(s.ctx, t.f.rates, t.f.rateReq, s.horizon)
	if err != nil {
		panic(err) // the request is built from a binding; it cannot be wrong
	}
	if d.Allowed {
		t.charge = d
	}
	a := s.plan(admission.Step{Stage: admission.Rates, Decision: outcome(d)})
	switch a.Verb {
	case admission.Run:
		if a.Wait == 0 {
			s.call(t, s.now.Add(s.spec.MaxHold))
			return
		}
		s.after(a.Wait, func() { s.check(t) })
	case admission.Reschedule:
		s.reschedule(t, s.now.Add(a.Wait), a.Booked)
	default: // Refuse: the task can never pass
		s.rep.Archived++
		t.f.stats.Archived++
		s.release()
		s.ready(&task{f: t.f})
	}
}

// check is what a task that waited for its turn does before the call: is
// its booking still its own, and is no rule blocked upstream?
func (s *sim) check(t *task) {
	if s.fair || s.adaptive {
		s.rep.Decisions++
		if ok, _ := s.m.Held(s.ctx, t.f.rates, t.f.rateReq, t.charge); !ok {
			s.refund(t)
			if t.taken++; t.taken <= 3 {
				s.decide(t)
				return
			}
			s.reschedule(t, s.now.Add(time.Second), time.Time{})
			return
		}
	}
	var until time.Time
	for i, n := range t.f.rateNames {
		if u := s.markers[n+"\x00"+t.f.rateReq.Keys[i]]; u.After(until) {
			until = u
		}
	}
	if a := s.plan(admission.Step{Stage: admission.Blocked, Blocked: until}); a.Verb == admission.Reschedule {
		s.refund(t)
		s.reschedule(t, s.now.Add(a.Wait), time.Time{})
		return
	}
	s.call(t, s.now.Add(s.spec.MaxHold))
}

// call takes the task's slots, if any, waiting for them in the worker
// until holdEnd, and calls the vendor.
func (s *sim) call(t *task, holdEnd time.Time) {
	var leases []quotas.Lease
	if t.f.slots != nil {
		s.rep.Decisions++
		if t.holder == "" {
			s.holders++
			t.holder = "task" + strconv.Itoa(s.holders)
		}
		req := t.f.slotReq
		req.Holder = t.holder
		d, _ := s.m.Allow(s.ctx, t.f.slots, req)
		a := s.plan(admission.Step{Stage: admission.Slots, Decision: outcome(d), Charged: t.charge.Allowed, HoldEnd: holdEnd, Lease: s.lease})
		switch a.Verb {
		case admission.Wait:
			s.after(a.Wait, func() { s.call(t, holdEnd) })
			return
		case admission.Reschedule:
			// The rate charge stays, as the booking of the task's slot then.
			s.reschedule(t, s.now.Add(a.Wait), a.Booked)
			return
		}
		leases = d.Leases
	}
	s.rep.Calls++
	t.f.stats.Calls++
	s.row.Calls++
	var jitter time.Duration
	if s.spec.Jitter > 0 {
		jitter = time.Duration(s.rng.Int64N(int64(s.spec.Jitter)))
	}
	called := s.now
	s.after(jitter, func() { s.arrive(t, leases, called) })
}

// arrive is a call, made at called, reaching the vendor, which answers
// after the latency (longer above a service's slots). The call's slots are
// released with what it showed, as the middleware releases them.
func (s *sim) arrive(t *task, leases []quotas.Lease, called time.Time) {
	limit, i := s.spec.Vendor.At(s.now.Sub(s.spec.Start))
	latency, allowed, retry := s.spec.Latency, true, time.Duration(0)
	if n := s.spec.Vendor.Phases[i].Slots; n > 0 {
		s.serve(1)
		if s.busy > n {
			latency = time.Duration(float64(latency) * (1 + 4*float64(s.busy-n)/float64(n)))
		}
		latency = time.Duration(float64(latency) * (0.9 + 0.2*s.rng.Float64()))
	} else {
		r, _ := s.vendor.AllowN(s.now, "vendor", limit, 1)
		allowed, retry = r.Allowed, r.RetryAfter
	}
	s.after(latency, func() {
		if s.spec.Vendor.Phases[i].Slots > 0 {
			s.serve(-1)
			s.latencies = append(s.latencies, latency)
		}
		took := max(s.now.Sub(called), time.Microsecond) // as the middleware reports it
		for _, l := range leases {
			s.rep.Decisions++
			_, _ = s.m.Release(s.ctx, l.Outcome(took, !allowed))
		}
		t.taken = 0
		if allowed {
			s.rep.Done++
			t.f.stats.Done++
			s.release()
			s.ready(&task{f: t.f})
			return
		}
		s.rep.Throttled++
		t.f.stats.Throttled++
		s.row.Throttled++
		s.throttled(t, s.spec.Vendor.RetryAfter.wait(retry))
	})
}

// serve changes the calls in service by d, counting the time at the
// count before.
func (s *sim) serve(d int) {
	s.busyArea += float64(s.busy) * s.now.Sub(s.busySince).Seconds()
	s.busy, s.busySince = s.busy+d, s.now
}

// throttled is the middleware's backOff: refund, block the scope, mark it
// for the tasks already charged, reschedule the task after retryAfter.
func (s *sim) throttled(t *task, retryAfter time.Duration) {
	decided := t.charge.Now // the call's, as the middleware's block reads it
	s.refund(t)
	until := s.now.Add(retryAfter)
	if t.f.scope != nil {
		s.rep.Decisions++
		_, _ = s.m.BlockCall(s.ctx, t.f.scope, t.f.scopReq, until, decided)
		for i, r := range t.f.scope.Rules() {
			k := r.Name + "\x00" + t.f.scopReq.Keys[i]
			if until.After(s.markers[k]) {
				s.markers[k] = until
			}
		}
	}
	s.reschedule(t, until, time.Time{})
}

func (s *sim) startRow(from, to time.Duration) {
	if len(s.rep.Rows) > 0 {
		s.serviceRow(s.row)
	}
	s.rep.Rows = append(s.rep.Rows, Row{From: from, To: to})
	s.row = &s.rep.Rows[len(s.rep.Rows)-1]
	s.row.Used = -float64(s.rep.Done) // completed at the row's end
	if len(s.rep.Rows) > 1 {
		s.closeRow(&s.rep.Rows[len(s.rep.Rows)-2])
	}
}

func (s *sim) endRow() {
	s.serviceRow(s.row)
	s.closeRow(s.row)
}

// serviceRow fills in what a row of a service knows at its end: the mean
// calls in service and the latencies' 99th percentile; then starts the
// next row's.
func (s *sim) serviceRow(r *Row) {
	s.serve(0)
	r.InFlight = s.busyArea / (r.To - r.From).Seconds()
	if len(s.latencies) > 0 {
		slices.Sort(s.latencies)
		r.P99 = s.latencies[(len(s.latencies)*99+99)/100-1]
	}
	s.busyArea, s.latencies = 0, s.latencies[:0]
}

// closeRow fills in what a row knows at its end.
func (s *sim) closeRow(r *Row) {
	done := float64(s.rep.Done) + r.Used
	var capacity float64
	for t := r.From; t < r.To; {
		l, i := s.spec.Vendor.At(t)
		next := r.To
		if end := s.phaseEnd(i); end > t && end < next {
			next = end
		}
		if l.Rate > 0 {
			capacity += l.Rate / l.Period.Seconds() * (next - t).Seconds()
		}
		t = next
	}
	r.Used = done / capacity
	l, i := s.spec.Vendor.At(r.To - 1)
	if r.Slots = s.spec.Vendor.Phases[i].Slots; r.Slots > 0 {
		r.Used = r.InFlight / float64(r.Slots)
	} else {
		r.Limit = l.Rate / l.Period.Seconds()
	}
	f := s.flows[0]
	if f.learned >= 0 {
		d, _ := s.m.Status(s.ctx, f.rates, f.rateReq)
		r.Learned = float64(time.Second) / float64(d.Rules[f.learned].Interval)
	}
	if f.learnedSlots >= 0 {
		d, _ := s.m.Status(s.ctx, f.slots, f.slotReq)
		r.LearnedSlots = d.Rules[f.learnedSlots].Slots
	}
}

// phaseEnd is the offset at which phase i ends (0 for the last).
func (s *sim) phaseEnd(i int) time.Duration {
	var end time.Duration
	for _, p := range s.spec.Vendor.Phases[:i+1] {
		end += p.For
	}
	if i == len(s.spec.Vendor.Phases)-1 {
		return 0
	}
	return end
}

// Phases reports, for each phase of v, the calls, the 429s and the share
// of the vendor's limit used in the rows of the report that lie between
// settle after the phase's start and its end.
func (r Report) Phases(v Vendor, duration, settle time.Duration) []PhaseStats {
	var out []PhaseStats
	var from time.Duration
	for i, p := range v.Phases {
		to := from + p.For
		if p.For == 0 || i == len(v.Phases)-1 {
			to = duration
		}
		ps := PhaseStats{From: from + settle, To: to, Limit: p.Limit.Rate / p.Limit.Period.Seconds()}
		var accepted, span float64
		for _, row := range r.Rows {
			if row.From >= ps.From && row.To <= ps.To {
				d := (row.To - row.From).Seconds()
				accepted += row.Used * ps.Limit * d
				span += d
				ps.Calls += row.Calls
				ps.Throttled += row.Throttled
			}
		}
		if span > 0 {
			ps.Used = accepted / (ps.Limit * span)
		}
		out = append(out, ps)
		from = to
	}
	return out
}

// PhaseStats is one vendor phase after settling.
type PhaseStats struct {
	From, To         time.Duration
	Limit            float64
	Calls, Throttled int
	Used             float64
}

// Write prints r as a table, for spec, which ran in took.
func (r Report) Write(w io.Writer, spec Spec, took time.Duration) error {
	spec.defaults() // as Run completed them
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "simulated %v in %v: %d workers x %d slots, backlog %d, vendor %q answering in %v, retry-after %s\n",
		spec.Duration, took.Round(time.Millisecond), spec.Workers, spec.Concurrency, spec.Backlog, spec.Vendor.String(), spec.Latency, spec.Vendor.RetryAfter)
	if spec.Vendor.service() {
		// A service that slows down: its slots against the learned ones.
		fmt.Fprintln(tw, "from\tto\tslots\tlearned\tin flight\tp99 ms\tcalls\t429\t")
		for _, row := range r.Rows {
			learned := "-"
			if row.LearnedSlots > 0 {
				learned = strconv.Itoa(row.LearnedSlots)
			}
			fmt.Fprintf(tw, "%v\t%v\t%d\t%s\t%.1f\t%.0f\t%d\t%d\t\n", row.From, row.To, row.Slots, learned, row.InFlight,
				float64(row.P99)/float64(time.Millisecond), row.Calls, row.Throttled)
		}
	} else {
		fmt.Fprintln(tw, "from\tto\tvendor/s\tlearned/s\tcalls\t429\t429 %\tused %\t")
		for _, row := range r.Rows {
			learned := "-"
			if row.Learned > 0 {
				learned = strconv.FormatFloat(row.Learned, 'f', 2, 64)
			}
			share := 0.0
			if row.Calls > 0 {
				share = 100 * float64(row.Throttled) / float64(row.Calls)
			}
			fmt.Fprintf(tw, "%v\t%v\t%.2f\t%s\t%d\t%d\t%.2f\t%.1f\t\n", row.From, row.To, row.Limit, learned, row.Calls, row.Throttled, share, 100*row.Used)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Payloads) > 1 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "waiting\tcalls\t429\tdone\tdone/s\tdone %\t  payload")
		for _, p := range r.Payloads {
			fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%.2f\t%.1f\t  %s\n", p.Waiting, p.Calls, p.Throttled, p.Done,
				float64(p.Done)/spec.Duration.Seconds(), 100*float64(p.Done)/float64(max(r.Done, 1)), p.Payload)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	perCall := 0.0
	if r.Calls > 0 {
		perCall = float64(r.Decisions) / float64(r.Calls)
	}
	_, err := fmt.Fprintf(w, "total: %d calls, %d answered 429 (%.2f%%), %d tasks done, %d archived; %.1f limiter operations per call\n",
		r.Calls, r.Throttled, 100*r.ThrottledShare(), r.Done, r.Archived, perCall)
	return err
}
