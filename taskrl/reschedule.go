package taskrl

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/asynqstore"
	"github.com/taskrl/taskrl/internal/keys"
)

// Headers the middleware keeps on a task while it waits for its limits
// (asynq's TaskInfo.Headers shows them). The middleware takes them off the
// task before its handler runs: the handler, and asynq's own record of the
// run (a retry, Retention), see the task's headers as it was enqueued.
const (
	// HeaderRound counts how often the task has waited.
	HeaderRound = "taskrl-round"
	// HeaderBooked holds the server time, in Unix microseconds, of the slot
	// booked for the task: its rate and window rules are already charged.
	HeaderBooked = "taskrl-booked"
	// HeaderWaited holds how long, in microseconds, the task has waited
	// in all, for Config.ThrottleBudget.
	HeaderWaited = "taskrl-waited"
	// HeaderCharge holds the receipt of the booked slot's charges
	// (quotas.Decision.Receipt), so that the worker that runs the task
	// can refund them when it does not happen in that slot.
	HeaderCharge = "taskrl-charge"
	// HeaderLimits identifies the limits of the rate and window rules the
	// booked slot was charged under: a task whose rules' limits have
	// changed since (a reloaded policy, an override) gives up its slot and
	// decides again.
	HeaderLimits = "taskrl-limits"
	// HeaderDue holds the server time, in Unix microseconds, a task
	// waiting without a booking (to decide again, or after an upstream
	// block) is due: the pacer moves it to pending then, and the worker
	// that picks it up earlier waits until then.
	HeaderDue = "taskrl-due"
)

// parked is what a task's headers say of its last wait (zero: it has not
// waited, or failed for real since: asynq's retry keeps no headers of
// ours).
type parked struct {
	round          int
	waited         time.Duration
	booked, due    time.Time // zero: none
	charge, limits string
}

// takeParked reads the middleware's headers of t and takes them off: asynq
// hands the handler the message's own header map, so what the handler
// sees, and what asynq writes back after the run, has none of them.
func takeParked(t *asynq.Task) parked {
	h := t.Headers()
	var p parked
	v, ok := h[HeaderRound]
	if !ok {
		return p // a task that never waited: nothing to take
	}
	p.round, _ = strconv.Atoi(v)
	p.waited = time.Duration(micros(h[HeaderWaited])) * time.Microsecond
	if us := micros(h[HeaderBooked]); us > 0 {
		p.booked = time.UnixMicro(us)
	}
	if us := micros(h[HeaderDue]); us > 0 {
		p.due = time.UnixMicro(us)
	}
	p.charge, p.limits = h[HeaderCharge], h[HeaderLimits]
	for _, k := range []string{HeaderRound, HeaderWaited, HeaderBooked, HeaderDue, HeaderCharge, HeaderLimits} {
		delete(h, k)
	}
	return p
}

// name tells this wait from the task's others: its round and its moment
// (a real failure starts the rounds again: asynq's retry keeps no headers
// of ours).
func (p parked) name() string {
	at := p.booked
	if at.IsZero() {
		at = p.due
	}
	return strconv.Itoa(p.round) + "~" + strconv.FormatInt(at.UnixMicro(), 10)
}

func micros(s string) int64 {
	if s == "" {
		return 0 // not parsed: a failed parse allocates its error
	}
	us, _ := strconv.ParseInt(s, 10, 64)
	return us
}

// reschedule makes the task wait, in asynq, until delay from now, under
// its own ID: the running task becomes a scheduled task again (Park), with
// the rule it waits for and the moment in its LastErr and the middleware's
// state in its headers, and the handler returns nil, which asynq then
// records as nothing at all (its write finds the task no longer active).
// So waiting keeps the task's ID, unique lock, retry count and options,
// spends no retry, never archives, and counts as neither processed nor
// failed. booked, if set, is the slot already charged for it (receipt: the
// charge's quotas receipt, for a refund). The pacer moves it to pending a
// lead before its slot or at its due time, and asynq itself paceSlack
// after it if no pacer does; a task not booked and due more than
// paceUnbooked ahead is left to asynq.
func (j *job) reschedule(rule string, delay time.Duration, booked time.Time, receipt string) error {
	m := j.m
	delay = max(delay, 0)
	waited := j.w.waited
	if !j.onHold {
		waited += delay // a pause's hold spends no throttle budget
	}
	h := map[string]string{
		HeaderRound:  strconv.Itoa(j.w.round + 1),
		HeaderWaited: strconv.FormatInt(waited.Microseconds(), 10),
	}
	slot, paced := booked, true
	if booked.IsZero() {
		slot = m.serverNow().Add(delay)
		if !j.crowded {
			// A task crowded out may be pulled back before its time
			// (fairWaiters.pull): it then runs at once.
			h[HeaderDue] = strconv.FormatInt(slot.UnixMicro(), 10)
		}
		// Far off, asynq's own forwarder is punctual enough (it looks
		// every 5 s), and a backlog pushed past MaxReserve saves a call
		// per task.
		paced = delay <= paceUnbooked
	} else {
		h[HeaderBooked] = strconv.FormatInt(booked.UnixMicro(), 10)
		if receipt != "" {
			h[HeaderCharge] = receipt
		}
		h[HeaderLimits] = j.sp.digest
	}
	p := asynqstore.Parking{
		Queue: j.queue, ID: j.id, Reason: j.waitReason(rule, slot, !booked.IsZero()), Headers: h,
		Forward: time.Now().Add(delay), // asynq's forwarder scores the workers' clocks
		PaceKey: keys.Pace(m.prefix, j.queue), PaceAt: -1,
	}
	if paced {
		// A booked task is moved to pending a lead before its slot and
		// waits for it in the worker that picks it up: the slot is a
		// charge the limits hold for it. An unbooked one only decides
		// again, so it is moved at its due time and holds no worker slot
		// meanwhile: a fleet of tasks waiting for a concurrency slot or
		// beyond an adaptive rule's horizon would otherwise fill the
		// workers with tasks waiting for their moment.
		at := slot
		if booked.IsZero() {
			at = slot.Add(m.pace.leadTime())
		}
		p.Forward = p.Forward.Add(paceSlack) // the pacer runs it in time
		p.PaceAt = at.UnixMicro()
		p.PaceExpire = max(at.UnixMilli(), m.serverNow().UnixMilli()) + paceKeep.Milliseconds()
	}
	// Until it is parked the task must not end: asynq would record the
	// run as done and delete it. So a park that fails (Redis is down:
	// asynq could not record the task's end either) is tried again until
	// it works or the task's context ends.
	wctx := context.WithoutCancel(j.ctx)
	for backoff := 50 * time.Millisecond; ; backoff = min(2*backoff, 2*time.Second) {
		ok, err := asynqstore.Park(wctx, m.cfg.Client, p)
		if err == nil && !ok {
			// Its lease ended (the worker stalled for asynq's 30 s):
			// asynq's recoverer took it back and delivers it again.
			m.cfg.Logger.Warn("taskrl: a task to reschedule is no longer active in asynq; it runs when asynq delivers it again", "task", j.id)
			return nil
		}
		if err == nil {
			break
		}
		m.cfg.Logger.Warn("taskrl: rescheduling failed; trying again", "task", j.id, "err", err)
		if herr := hold(j.ctx, backoff); herr != nil {
			return fmt.Errorf("taskrl: rescheduling: %w (then %w)", err, herr)
		}
	}
	m.parked.add(j.id)
	m.indexWaiting(j, slot)
	if paced {
		m.pace.add(j.queue, j.id, p.PaceAt, j.ctx.Done())
	}
	if m.sweep != nil && j.sp != nil && j.sp.spacing > 0 && delay >= sweepAhead {
		m.sweep.note(j.queue, j.sp.signature(j.keys, j.rates.Costs), j.sp.costSpacing(j.rates.Costs), slot)
	}
	m.cfg.Logger.Debug("taskrl: rescheduled", "task", j.id, "in", delay, "booked", !booked.IsZero())
	return nil
}

// waitReason is a waiting task's LastErr in asynq: the rule it waits for
// (for a booking, the rate and window rules charged for its slot) and the
// moment, on the server's clock.
func (j *job) waitReason(rule string, at time.Time, booked bool) string {
	when := at.UTC().Format("2006-01-02T15:04:05.000Z07:00")
	if booked && j.sp != nil && j.sp.rates != nil {
		var names []string
		for _, r := range j.sp.rates.Rules() {
			names = append(names, strconv.Quote(r.Name))
		}
		return fmt.Sprintf("taskrl: waiting for rule %s: booked for %s", strings.Join(names, ", "), when)
	}
	if rule != "" {
		return fmt.Sprintf("taskrl: waiting for rule %q until %s", rule, when)
	}
	return "taskrl: waiting until " + when
}

// Booked returns the slot, on the Redis server's clock, that the task whose
// context is ctx was booked for when it waited: its rate and window rules
// were charged for that moment, and it runs at it. ok is false for a task
// that runs without a booking (it did not wait, or decided again after
// its wait) and for a context that is not a task's under the middleware.
// The task keeps its asynq ID (asynq.GetTaskID) however often it waits.
// Safe for concurrent use.
func Booked(ctx context.Context) (slot time.Time, ok bool) {
	j, _ := ctx.Value(jobKey{}).(*job)
	if j == nil || j.w.booked.IsZero() {
		return time.Time{}, false
	}
	return j.w.booked, true
}
