package taskrl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/admission"
	"github.com/taskrl/taskrl/limits"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// job is one delivery of a task through the middleware: the task, where it
// came from, the rules that govern it and the charge it runs under. Its
// methods carry out what plan decides at each step.
type job struct {
	m      *Middleware
	ctx    context.Context
	t      *asynq.Task
	queue  string
	id     string
	lim    admission.Limits // the middleware's, with the job's policy's mode
	policy *policy.Policy   // the policy the job was decided under
	sp     *split           // nil when no rule matches the task
	keys   []string         // the binding's keys, one per rule
	// flows, weights and levels are the binding's fair flows, weights
	// and priorities, one per rule (nil: none), for the fair concurrency
	// rules (slotRequest).
	flows   []string
	weights []int
	levels  []int
	rates   quotas.Request  // the request to the rate and window rules
	charge  quotas.Decision // the rate charge (or booking) the task runs under
	// slots is the slots' decision made in the call that admitted the
	// rates now (quotas.Limiter.ReserveAndAllow), for runHolding to use
	// instead of deciding them again; nil if none.
	slots      *quotas.Decision
	w          parked       // what the task's headers said of its last wait
	holderOnce string       // the holder of the task's slots (holder), once chosen
	pause      atomic.Int64 // the longest Pause the handler asked for, ns
	onHold     bool         // an operator's pause holds the task (hold)
	crowded    bool         // the task is crowded out (fairWaiters): it has no due time
}

// outcome is what admission.Plan reads of a decision.
func outcome(d quotas.Decision) admission.Decision {
	return admission.Decision{Allowed: d.Allowed, Delay: d.Delay, RetryAfter: d.RetryAfter, Now: d.Now, Rule: d.Rule}
}

func (j *job) observe(e Event) {
	if j.m.cfg.Observer == nil {
		return
	}
	e.TaskType, e.Queue = j.t.Type(), j.queue
	if j.sp != nil && j.keys != nil && e.Keys == nil {
		switch e.Outcome {
		case Admitted:
			e.Keys = j.ruleKeys(j.sp.rateIdx, j.sp.slotIdx)
		case UpstreamThrottled, Paused:
			e.Keys = j.ruleKeys(j.sp.throttleIdx)
		}
	}
	j.m.cfg.Observer.Observe(e)
}

// ruleKeys names the binding's rules at the positions idx and the task's
// keys of them (Event.Keys).
func (j *job) ruleKeys(idx ...[]int) []RuleKey {
	var out []RuleKey
	for _, ix := range idx {
		for _, i := range ix {
			out = append(out, RuleKey{Rule: j.sp.names[i], Key: j.keys[i]})
		}
	}
	return out
}

// step completes s with what every stage knows: the server's time, the
// time left before the task's deadline and how long it was rescheduled for.
func (j *job) step(s admission.Step) admission.Step {
	s.Now = j.m.serverNow()
	s.Left = admission.NoDeadline
	if dl, ok := j.ctx.Deadline(); ok {
		s.Left = time.Until(dl) // the context's deadline is on the wall clock
	}
	s.Waited = j.w.waited
	return s
}

// admitRates gets the task's turn under its rate and window rules: now,
// after a wait in the worker, or, if the turn is further away, by
// rescheduling. done reports that the task was rescheduled (or failed) and
// must not run now; otherwise j.charge is the decision (or booking) the
// task runs under, for a refund if the remote side throttles it, and *admit
// the Admitted event to report once the task is sure to run.
func (j *job) admitRates(admit *Event) (done bool, err error) {
	// A retry after a failure is charged again: the booking paid for the
	// run after the wait only (asynq's retry keeps no headers of ours).
	if booked := j.w.booked; !booked.IsZero() {
		receipt := j.w.charge
		j.charge, _ = quotas.ParseReceipt(receipt) // none: nothing to refund
		stale := j.w.limits != j.sp.digest
		a := admission.Plan(j.lim, j.step(admission.Step{Stage: admission.Booked, Booked: booked, Stale: stale}))
		switch a.Verb {
		case admission.Decide:
			if a.Refund {
				j.refund(j.charge)
			}
		case admission.Reschedule:
			j.observe(Event{Outcome: Rescheduled, Wait: a.Wait})
			return true, j.reschedule(a.Rule, a.Wait, a.Booked, receipt)
		default:
			// A cancelled wait keeps the booking: the redelivered task
			// still holds it.
			if done, again, err := j.await(a.Wait, true, false); done || !again {
				if !done {
					*admit = Event{Outcome: Admitted, Wait: a.Wait}
				}
				return done, err
			}
		}
	}
	j.charge = quotas.Decision{}
	backoff := 50 * time.Millisecond
	for taken := 0; ; {
		sent := j.m.cfg.Clock.Now()
		d, err := guard(j.m, func() (quotas.Decision, error) {
			if j.sp.slots == nil {
				return j.m.limiter.Reserve(j.ctx, j.sp.rates, j.rates, j.sp.horizon)
			}
			// Admitted now, the task takes its slots in the same call.
			rd, sd, ok, err := j.m.limiter.ReserveAndAllow(j.ctx, j.sp.rates, j.rates, j.sp.horizon, j.sp.slots, j.slotRequest())
			if ok {
				j.slots = &sd
			}
			return rd, err
		})
		if err != nil && !errors.Is(err, errRedisDown) {
			j.observe(Event{Outcome: RedisError, Err: err})
		}
		if err == nil {
			j.m.learn(d.Now, sent)
		}
		a := admission.Plan(j.lim, j.step(admission.Step{Stage: admission.Rates, Decision: outcome(d), Err: err}))
		if j.slots != nil && (a.Verb != admission.Run || a.Wait > 0) {
			// Slots taken with a turn the task does not run now.
			j.releaseSlots()
		}
		switch a.Verb {
		case admission.Retry:
			// Fail closed: the task waits for Redis, which asynq needs too.
			j.m.cfg.Logger.Warn("taskrl: Redis unavailable; the task waits for it (fail closed)", "task", j.id, "err", err)
			if herr := hold(j.ctx, backoff); herr != nil {
				return true, herr
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		case admission.Unlimited:
			j.m.cfg.Logger.Warn("taskrl: Redis unavailable; running the task without limits (fail open)", "task", j.id, "err", err)
			j.observe(Event{Outcome: Unlimited})
			return false, nil
		case admission.Local:
			j.m.cfg.Logger.Warn("taskrl: Redis unavailable; limiting in this process (fail local)", "task", j.id, "err", err)
			j.observe(Event{Outcome: Local})
			err := j.localTurn()
			return err != nil, err
		case admission.Refuse:
			if a.Refund {
				j.refund(d)
			}
			j.observe(Event{Outcome: Refused, Rule: a.Rule, Wait: a.Wait, Rules: d.Rules})
			return true, fmt.Errorf("taskrl: %s: %w", a.Reason, asynq.SkipRetry)
		case admission.Reschedule:
			j.observe(Event{Outcome: Rescheduled, Rule: a.Rule, Wait: a.Wait, Rules: d.Rules})
			if a.Booked.IsZero() {
				return true, j.reschedule(a.Rule, a.Wait, time.Time{}, "")
			}
			if err := j.reschedule(a.Rule, a.Wait, a.Booked, d.Receipt()); err != nil {
				j.refund(d)
				return true, err
			}
			return true, nil
		}
		j.charge = d
		if a.Wait == 0 {
			*admit = Event{Outcome: Admitted, Rules: d.Rules}
			return false, nil
		}
		// A slot a fair rule booked, taken over meanwhile by a task with
		// less than its share, or booked at an adaptive rate cut since, is
		// decided again (a few times at most).
		taken++
		done, again, err := j.await(a.Wait, taken <= 3, true)
		if !again {
			if !done {
				*admit = Event{Outcome: Admitted, Wait: a.Wait, Rules: d.Rules}
			}
			return done, err
		}
		j.charge = quotas.Decision{}
	}
}

// await waits w in the worker for the turn of j.charge. Then a task whose
// limits changed meanwhile is rescheduled to decide again (done); if checkHeld,
// a fair rule's booking is checked to be still the task's (again: it was
// taken over and given back; decide anew), and the task is rescheduled
// (done) if the remote side throttled its rules meanwhile, and a task the
// checks made late for its turn (admission.LateBooking) gives it back and decides
// again. A cancelled wait ends the task (done), giving the charge back if
// refund is set.
func (j *job) await(w time.Duration, checkHeld, refund bool) (done, again bool, err error) {
	slot := j.m.serverNow().Add(w)
	if err := hold(j.ctx, w); err != nil {
		if refund {
			j.refund(j.charge)
		}
		return true, false, err
	}
	if j.limitsChanged() {
		// Reloaded or overridden while the task waited: its charge was
		// made under the old limits (kept, as for a stale booking,
		// admission.planBooked), and it decides again under the new ones at once.
		j.observe(Event{Outcome: Rescheduled})
		return true, false, j.reschedule("", 0, time.Time{}, "")
	}
	if checkHeld && !j.held() {
		return false, true, nil
	}
	// No marker read (Redis failed): nothing known to block.
	if until, rule, err := j.blockedUntil(); err == nil {
		a := admission.Plan(j.lim, j.step(admission.Step{Stage: admission.Blocked, Blocked: until, Rule: rule}))
		if a.Verb == admission.Reschedule {
			j.refund(j.charge)
			j.observe(Event{Outcome: Rescheduled, Rule: a.Rule, Wait: a.Wait})
			return true, false, j.reschedule(a.Rule, a.Wait, time.Time{}, "")
		}
	}
	if j.m.serverNow().Sub(slot) > admission.LateBooking {
		// The checks took the task past its turn (Redis was down or
		// slow): tasks that ran now would come in a bunch, each late for
		// its own turn. It gives the turn back and decides again.
		j.refund(j.charge)
		return false, true, nil
	}
	return false, false, nil
}

// limitsChanged reports whether the task's rate rules have other limits
// now than those it was decided under (a reload or an override since),
// which a waiting task's HeaderLimits would tell the same way.
func (j *job) limitsChanged() bool {
	cur := j.m.policy.Load()
	if cur == j.policy {
		return false // policies are replaced whole, never changed
	}
	b := cur.Bind(j.t.Type(), j.queue)
	if b == nil {
		return true
	}
	rq, err := b.Request(j.t.Payload())
	if err != nil {
		return true
	}
	sp, err := j.m.split(b.ForPayload(rq.Keys, j.t.Payload()))
	return err != nil || sp.digest != j.sp.digest
}

// held reports whether the slot booked for the task (j.charge) is still
// the task's (quotas.Limiter.Held): a task with less than its share may
// have taken a fair rule's booking over since, or an adaptive rule's rate
// was cut since the booking was made. If not, or Redis cannot tell, the
// charge is given back (of a booking taken over, only the task's own
// rules: the taker inherited the rest) and the task must be decided again.
// Without a fair or adaptive rule it is true at no cost.
func (j *job) held() bool {
	if !j.sp.fair && !j.sp.adaptive {
		return true
	}
	ok, err := j.m.limiter.Held(j.ctx, j.sp.rates, j.rates, j.charge)
	if err == nil && ok {
		return true
	}
	if err != nil {
		j.m.cfg.Logger.Warn("taskrl: checking a booking failed; deciding again", "err", err)
	} else {
		j.m.cfg.Logger.Debug("taskrl: the task's slot was taken over or booked before an adaptive rule was cut; deciding again")
	}
	j.refund(j.charge)
	return false
}

// refund gives back the rate charges of d, an admitted or booked decision
// (or one parsed from a receipt) whose task did not happen. A failure is
// logged: the charge then stays, as if the task had run.
func (j *job) refund(d quotas.Decision) {
	if !d.Allowed {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(j.ctx), 5*time.Second)
	defer cancel()
	if err := j.m.limiter.Refund(ctx, j.sp.rates, quotas.Request{Keys: j.rates.Keys, Costs: j.rates.Costs}, d); err != nil {
		j.m.cfg.Logger.Warn("taskrl: refunding an unused charge failed", "err", err)
	}
}

// localLimits is what admission.Plan reads in the policy.FailLocal mode: a task
// cannot be rescheduled without Redis, so it waits for its turn in the
// worker however far off, as long as its context allows.
var localLimits = admission.Limits{MaxHold: admission.NoDeadline}

// localTurn waits for the task's turn under its rate and window rules in
// this process alone, each at 1/LocalShare (quotas.Model on Config.Clock):
// the policy.FailLocal mode while Redis is unreachable. admission.Plan decides,
// under localLimits, as for a decision made in Redis.
func (j *job) localTurn() error {
	m := j.m
	req := j.rates
	if req.Costs != nil {
		// A cost the whole rule admits may exceed its share's burst or
		// limit: at most all of the share then.
		req.Costs = slices.Clone(req.Costs)
		for i, r := range j.sp.local[0].Rules() {
			req.Costs[i] = min(req.Costs[i], limits.Capacity(r.Limit))
		}
	}
	for {
		d, err := m.local.Reserve(j.ctx, j.sp.local[0], req, 24*time.Hour)
		if err != nil {
			return err
		}
		a := admission.Plan(localLimits, admission.Step{Stage: admission.Rates, Now: d.Now, Left: admission.NoDeadline, Decision: outcome(d)})
		switch a.Verb {
		case admission.Refuse:
			j.observe(Event{Outcome: Refused, Rule: d.Rule})
			return fmt.Errorf("taskrl: %s: %w", a.Reason, asynq.SkipRetry)
		case admission.Run:
			if err := hold(j.ctx, a.Wait); err != nil {
				// The task does not run: its turn goes back.
				_ = m.local.Refund(context.WithoutCancel(j.ctx), j.sp.local[0], req, d)
				return err
			}
			return nil
		}
		// Beyond the horizon: wait, then decide again.
		if err := hold(j.ctx, a.Wait); err != nil {
			return err
		}
	}
}

// localSlots takes the task's concurrency slots in this process alone,
// each rule at 1/LocalShare of its slots, waiting for them as long as the
// task's context allows (admission.Plan under localLimits), and returns
// the leases to release.
func (j *job) localSlots(req quotas.Request) ([]quotas.Lease, error) {
	m := j.m
	for {
		d, err := m.local.Allow(j.ctx, j.sp.local[1], req)
		if err != nil || d.Allowed {
			return d.Leases, err
		}
		a := admission.Plan(localLimits, admission.Step{Stage: admission.Slots, Now: d.Now, Left: admission.NoDeadline, Decision: outcome(d), HoldEnd: d.Now.Add(time.Hour)})
		if err := hold(j.ctx, a.Wait); err != nil {
			return nil, err
		}
	}
}

// runHolding takes the task's concurrency slots, waiting up to MaxHold for
// them (or rescheduling), reports the task admitted (admit, from its rate
// rules, or its own event when the slots are its only rules), keeps them
// renewed while next runs, and releases them when it returns, panics or is
// cancelled.
func (j *job) runHolding(admit Event, next asynq.Handler) error {
	m := j.m
	req := j.slotRequest()
	holdEnd := m.serverNow().Add(m.cfg.MaxHold)
	var held time.Duration // waiting for a slot in the worker
	var nextLast time.Time // the latest holdEnd a fair rule's next slot allows
	var waiting fairFlow   // the fair rule's flow the task counts as waiting in (fairWaiters)
	refused := false       // a decision refused the task
	defer func() { m.waiters.leave(waiting) }()
	var d quotas.Decision
	for backoff := 50 * time.Millisecond; ; {
		var err error
		if j.slots != nil {
			// Decided with the rates (admitRates).
			d, j.slots = *j.slots, nil
		} else {
			d, err = guard(m, func() (quotas.Decision, error) { return m.limiter.Allow(j.ctx, j.sp.slots, req) })
		}
		if err != nil && !errors.Is(err, errRedisDown) {
			j.observe(Event{Outcome: RedisError, Err: err})
		}
		o := outcome(d)
		refused = refused || !d.Allowed
		if o.Next = err == nil && nextSlot(d); o.Next {
			// The task's flow gets the next slot that frees: it waits
			// for it nextHold past the last such answer, until nextMax
			// after the first at most and never past its deadline less
			// a second (limits.Rule.Fair).
			now := m.serverNow()
			if nextLast.IsZero() {
				nextLast = now.Add(nextMax)
				if dl, ok := j.ctx.Deadline(); ok {
					nextLast = earlier(nextLast, now.Add(time.Until(dl)-time.Second))
				}
			}
			holdEnd = later(holdEnd, earlier(now.Add(nextHold), nextLast))
		}
		var crowded time.Duration
		if f := j.fairFlow(req, d.Rule); err == nil && !d.Allowed && f != (fairFlow{}) {
			if m.scout != nil {
				m.scout.note(j.queue, f)
			}
			if !o.Next && waiting == (fairFlow{}) {
				id := j.id
				if j.charge.Allowed {
					id = "" // booked at its return (a rate charge): not pulled back
				}
				if crowded = m.waiters.join(f, m.cfg.Clock.Now(), behindSlot(d), j.queue, id); crowded == 0 {
					waiting = f
				}
			}
		}
		a := admission.Plan(j.lim, j.step(admission.Step{Stage: admission.Slots, Decision: o, Err: err, Charged: j.charge.Allowed, HoldEnd: holdEnd, Lease: j.sp.lease, Crowded: crowded}))
		switch a.Verb {
		case admission.Unlimited:
			m.cfg.Logger.Warn("taskrl: Redis unavailable; running without a concurrency slot", "task", j.id, "err", err)
			return next.ProcessTask(j.ctx, j.t)
		case admission.Local:
			m.cfg.Logger.Warn("taskrl: Redis unavailable; taking a concurrency slot in this process (fail local)", "task", j.id, "err", err)
			if admit.Outcome == "" {
				j.observe(Event{Outcome: Local})
			}
			leases, err := j.localSlots(req)
			if err != nil {
				return err
			}
			return runReporting(j, next, func(took time.Duration, over bool) {
				for _, ls := range leases {
					_, _ = m.local.Release(context.WithoutCancel(j.ctx), ls.Outcome(took, over))
				}
			})
		case admission.Retry:
			if herr := hold(j.ctx, backoff); herr != nil {
				return herr
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		case admission.Reschedule:
			// Slots stay busy: try again later without holding the worker.
			// The rate charge already made stays, as the booking of the
			// task's slot then, so only the slots are tried again.
			j.observe(Event{Outcome: Rescheduled, Rule: a.Rule, Wait: a.Wait, Rules: d.Rules})
			j.crowded = crowded > 0
			return j.reschedule(a.Rule, a.Wait, a.Booked, j.charge.Receipt())
		case admission.Wait:
			if err := hold(j.ctx, a.Wait); err != nil {
				return err
			}
			held += a.Wait
			continue
		}
		break
	}
	m.waiters.leave(waiting)
	waiting = fairFlow{}
	j.fairStarted(req, !refused)
	switch admit.Outcome {
	case "": // the slots were the task's only decision
		j.observe(Event{Outcome: Admitted, Wait: held, Rules: d.Rules})
	case Admitted:
		admit.Wait += held
		j.observe(admit)
	}
	renewing := m.renew.add(d.Leases)
	return runReporting(j, next, func(took time.Duration, over bool) {
		m.renew.remove(renewing)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(j.ctx), 5*time.Second)
		defer cancel()
		for _, ls := range d.Leases {
			if _, rerr := m.limiter.Release(rctx, ls.Outcome(took, over)); rerr != nil {
				m.cfg.Logger.Warn("taskrl: releasing a concurrency slot failed; it frees itself when its lease ends", "rule", ls.Rule, "err", rerr)
			}
		}
	})
}

// runReporting runs the task's handler, then release with what the run
// showed (callOutcome), also when the handler panics (then nothing: 0,
// false), and returns the handler's error.
func runReporting(j *job, next asynq.Handler, release func(took time.Duration, over bool)) (err error) {
	began := time.Now()
	ran := false
	defer func() {
		var took time.Duration
		var over bool
		if ran {
			took, over = callOutcome(err, time.Since(began))
		}
		release(took, over)
	}()
	err = next.ProcessTask(j.ctx, j.t)
	ran = true
	return err
}

// callOutcome is what a handler's run under concurrency slots teaches an
// adaptive concurrency rule (quotas.Lease.Outcome): its latency when it
// succeeded or ran out of time (the task's deadline also covers its wait
// for a slot, so a timeout is a slow call, not an overload signal of its
// own); overload when the remote side throttled it (Throttled); nothing
// for another error, whose latency says nothing about load (a bad request
// answered at once).
func callOutcome(err error, took time.Duration) (time.Duration, bool) {
	var te *ThrottledError
	switch {
	case err == nil || errors.Is(err, context.DeadlineExceeded):
		return max(took, time.Microsecond), false
	case errors.As(err, &te):
		return max(took, time.Microsecond), true
	}
	return 0, false
}

// hold waits d in the worker, or until ctx ends.
func hold(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// shadowDecide decides the task's shadow rules, as an Allow charged to
// their own state, reports the verdict (WouldAdmit, WouldWait) and returns
// what gives the concurrency slots it took back when the task ends. Redis
// failures are reported and otherwise ignored: a shadow rule never holds a
// task.
func (j *job) shadowDecide(rq quotas.Request) (release func()) {
	m := j.m
	req := quotas.Request{Keys: pick(j.keys, j.sp.shadowIdx), Fair: pick(rq.Fair, j.sp.shadowIdx), Weights: pick(rq.Weights, j.sp.shadowIdx), Priorities: pick(rq.Priorities, j.sp.shadowIdx), Costs: pick(rq.Costs, j.sp.shadowIdx), Critical: j.sp.critical, Holder: j.holder()}
	d, err := guard(m, func() (quotas.Decision, error) { return m.limiter.Allow(j.ctx, j.sp.shadow, req) })
	switch {
	case err != nil:
		if !errors.Is(err, errRedisDown) {
			j.observe(Event{Outcome: RedisError, Err: err})
		}
		return func() {}
	case !d.Allowed:
		j.observe(Event{Outcome: WouldWait, Rule: d.Rule, Wait: d.RetryAfter, Rules: d.Rules})
		return func() {}
	}
	j.observe(Event{Outcome: WouldAdmit, Rules: d.Rules})
	return func() {
		for _, l := range d.Leases {
			if _, err := m.limiter.Release(context.WithoutCancel(j.ctx), l); err != nil {
				m.cfg.Logger.Debug("taskrl: releasing a shadow slot failed; it expires with its lease", "task", j.id, "err", err)
			}
		}
	}
}

// slotRequest is the request to the task's concurrency rules.
func (j *job) slotRequest() quotas.Request {
	if j.holderOnce == "" {
		j.holderOnce = j.holder()
	}
	return quotas.Request{Keys: pick(j.keys, j.sp.slotIdx), Fair: pick(j.flows, j.sp.slotIdx), Weights: pick(j.weights, j.sp.slotIdx), Priorities: pick(j.levels, j.sp.slotIdx), Waited: j.w.waited, Holder: j.holderOnce, Critical: j.sp.critical}
}

// fairFlow is the task's flow at the fair concurrency rule named rule of
// its slots (req), or the zero fairFlow if that rule is not fair.
func (j *job) fairFlow(req quotas.Request, rule string) fairFlow {
	for _, f := range j.sp.fairSlots {
		if f.name == rule && f.i < len(req.Fair) && req.Fair[f.i] != "" {
			return fairFlow{rule, req.Fair[f.i]}
		}
	}
	return fairFlow{}
}

// fairStarted notes, for each fair rule of the task's slots (req), that a
// task of its flow took its slot (fairWaiters), and pulls back the first
// of the flow's tasks crowded out here to take its place, two if the slots
// were free at the task's first ask (free): the flow has slots to spare,
// and each task pulled that finds one free pulls two more.
func (j *job) fairStarted(req quotas.Request, free bool) {
	n := 1
	if free {
		n = 2
	}
	for _, f := range j.sp.fairSlots {
		if f.i < len(req.Fair) && req.Fair[f.i] != "" {
			flow, now := fairFlow{f.name, req.Fair[f.i]}, j.m.cfg.Clock.Now()
			j.m.waiters.started(flow, now)
			pulled := map[string][]string{} // by queue
			for _, t := range j.m.waiters.pull(flow, now, n) {
				pulled[t.queue] = append(pulled[t.queue], t.id)
			}
			for q, ids := range pulled {
				j.m.pace.pull(q, ids)
			}
		}
	}
}

// releaseSlots gives back the slots decided with the rates (j.slots) when
// the task does not go on to run with them.
func (j *job) releaseSlots() {
	if j.slots == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(j.ctx), 5*time.Second)
	defer cancel()
	for _, ls := range j.slots.Leases {
		if _, err := j.m.limiter.Release(ctx, ls); err != nil {
			j.m.cfg.Logger.Warn("taskrl: releasing a concurrency slot failed; it frees itself when its lease ends", "rule", ls.Rule, "err", err)
		}
	}
	j.slots = nil
}

// holder names the task as the holder of concurrency slots: its ID, or,
// when asynq did not run it (no task ID), a random one.
func (j *job) holder() string {
	if j.id != "" {
		return j.id
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "~" + hex.EncodeToString(b[:])
}

// checkCosts returns a *policy.CostError for the first rule of set whose
// cost in costs exceeds what it admits at once; nil set or costs pass.
func checkCosts(set *quotas.Set, costs []int) error {
	if set == nil || costs == nil {
		return nil
	}
	for i, r := range set.Rules() {
		if err := policy.CheckCost(r, costs[i]); err != nil {
			return err
		}
	}
	return nil
}
