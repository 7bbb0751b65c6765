package taskrl

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
)

// Headers the middleware keeps on a rescheduled copy of a task.
const (
	// HeaderOrigin holds the ID of the task a copy was rescheduled from.
	HeaderOrigin = "taskrl-origin"
	// HeaderRound counts how often the task has been rescheduled.
	HeaderRound = "taskrl-round"
	// HeaderBooked holds the server time, in Unix microseconds, of the slot
	// booked for the copy: its rate and window rules are already charged.
	HeaderBooked = "taskrl-booked"
	// HeaderWaited holds how long, in microseconds, the task has been
	// rescheduled for in total, for Config.ThrottleBudget.
	HeaderWaited = "taskrl-waited"
	// HeaderCharge holds the receipt of the booked slot's charges
	// (quotas.Decision.Receipt), so that the worker that runs the copy can
	// refund them when the task does not happen in that slot.
	HeaderCharge = "taskrl-charge"
	// HeaderLimits identifies the limits of the rate and window rules the
	// booked slot was charged under: a copy whose rules' limits have
	// changed since (a reloaded policy, an override) gives up its slot and
	// decides again.
	HeaderLimits = "taskrl-limits"
	// HeaderDue holds the server time, in Unix microseconds, a copy
	// rescheduled without a booking (to decide again, or after an upstream
	// block) is due: the pacer moves it to pending a little before, and
	// the worker that picks it up waits until then.
	HeaderDue = "taskrl-due"
)

// reschedule enqueues a copy of the task to run after delay and lets the
// original complete, so that waiting for a limit never spends a retry or
// archives the task (asynq archives a failing task whose retries are spent
// before it asks whether the error was a failure). The copy keeps the
// task's payload, headers, queue, timeout, deadline and retention, and the
// retries it had left. Its ID is derived from the original's and the round,
// so a redelivered original cannot make two copies. booked, if set, is the
// slot already charged for it (receipt: the charge's quotas receipt, for a
// refund). The pacer moves the copy to pending a lead before its slot or
// due time, and asynq itself paceSlack after it if no pacer does; a copy
// not booked and due more than paceUnbooked ahead is left to asynq.
func (j *job) reschedule(delay time.Duration, booked time.Time, receipt string) error {
	t, m := j.t, j.m
	round := 0
	if v, ok := t.Headers()[HeaderRound]; ok {
		round, _ = strconv.Atoi(v)
	}
	headers := make(map[string]string, len(t.Headers())+3)
	for k, v := range t.Headers() {
		headers[k] = v
	}
	org := origin(t, j.id)
	headers[HeaderOrigin] = org
	headers[HeaderRound] = strconv.Itoa(round + 1)
	delete(headers, HeaderBooked)
	delete(headers, HeaderCharge)
	delete(headers, HeaderLimits)
	delete(headers, HeaderDue)
	headers[HeaderWaited] = strconv.FormatInt((waited(t) + max(delay, 0)).Microseconds(), 10)
	slot, paced := booked, true
	if booked.IsZero() {
		slot = m.serverNow().Add(max(delay, 0))
		headers[HeaderDue] = strconv.FormatInt(slot.UnixMicro(), 10)
		// Far off, asynq's own forwarder is punctual enough (it looks
		// every 5 s), and a backlog pushed past MaxReserve saves a call
		// per task.
		paced = delay <= paceUnbooked
	} else {
		headers[HeaderBooked] = strconv.FormatInt(booked.UnixMicro(), 10)
		if receipt != "" {
			headers[HeaderCharge] = receipt
		}
		headers[HeaderLimits] = j.sp.digest
	}
	in := delay
	if paced {
		in += paceSlack // the pacer runs it in time
	}
	maxRetry, _ := asynq.GetMaxRetry(j.ctx)
	copyID := formatID(org, round+1)
	at := time.Now().Add(in) // asynq's own clock, once: retries of the enqueue keep it
	opts := []asynq.Option{asynq.Queue(j.queue), asynq.TaskID(copyID), asynq.MaxRetry(max(0, maxRetry-retryCount(j.ctx))), asynq.ProcessAt(at)}
	// inherit adds the original's timeout, deadline and retention, once.
	inherited := false
	inherit := func() {
		info, err := m.inspect.GetTaskInfo(j.queue, j.id)
		if err != nil {
			return
		}
		inherited = true
		if info.Timeout > 0 {
			opts = append(opts, asynq.Timeout(info.Timeout))
		}
		if !info.Deadline.IsZero() {
			opts = append(opts, asynq.Deadline(info.Deadline))
		}
		if info.Retention > 0 {
			opts = append(opts, asynq.Retention(info.Retention))
		}
	}
	wctx := context.WithoutCancel(j.ctx)
	copyTask := asynq.NewTaskWithHeaders(t.Type(), t.Payload(), headers)
	// Until the copy is enqueued the task must not end: a failed task
	// would spend a retry or, with none left, be archived. So an enqueue
	// that fails (Redis is down: asynq could not record the task's end
	// either) is tried again until it works or the task's context ends.
	for backoff := 50 * time.Millisecond; ; backoff = min(2*backoff, 2*time.Second) {
		if !inherited {
			inherit()
		}
		_, err := m.client.EnqueueContext(wctx, copyTask, opts...)
		if err == nil {
			break
		}
		if errors.Is(err, asynq.ErrTaskIDConflict) {
			return nil // a redelivery of this task already rescheduled it
		}
		m.cfg.Logger.Warn("taskrl: rescheduling failed; trying again", "task", j.id, "err", err)
		if herr := hold(j.ctx, backoff); herr != nil {
			return fmt.Errorf("taskrl: rescheduling: %w (then %w)", err, herr)
		}
	}
	if paced {
		// A booked copy is moved to pending a lead before its slot and
		// waits for it in the worker that picks it up: the slot is a
		// charge the limits hold for it. An unbooked copy only decides
		// again, so it is moved at its due time and holds no worker slot
		// meanwhile: a fleet of copies waiting for a concurrency slot or
		// beyond an adaptive rule's horizon would otherwise fill the
		// workers with copies waiting for their moment.
		at := slot
		if booked.IsZero() {
			at = slot.Add(m.pace.leadTime())
		}
		if err := m.pace.add(wctx, j.queue, copyID, at); err != nil {
			m.cfg.Logger.Warn("taskrl: pacing a rescheduled task failed; it runs a little late", "task", copyID, "err", err)
		}
	}
	if m.sweep != nil && j.sp != nil && j.sp.spacing > 0 && delay >= sweepAhead {
		m.sweep.note(j.queue, j.sp.signature(j.keys, j.rates.Costs), j.sp.costSpacing(j.rates.Costs), slot)
	}
	m.cfg.Logger.Debug("taskrl: rescheduled", "task", j.id, "copy", copyID, "in", delay, "booked", !booked.IsZero())
	return nil
}

// OriginID returns the ID the task had when it was first enqueued: the
// task's own ID (asynq.GetTaskID), or, for a copy the middleware
// rescheduled, the ID of the task it was copied from. It stays the same
// however often the task is rescheduled, so it is the key to deduplicate on,
// e.g. as an Idempotency-Key header. It returns "" when ctx is not a task's
// context. Safe for concurrent use.
func OriginID(ctx context.Context, t *asynq.Task) string {
	id, _ := asynq.GetTaskID(ctx)
	return origin(t, id)
}

func origin(t *asynq.Task, id string) string {
	if o, ok := t.Headers()[HeaderOrigin]; ok && o != "" {
		return o
	}
	return id
}

// waited is how long the task has been rescheduled for so far.
func waited(t *asynq.Task) time.Duration {
	v, ok := t.Headers()[HeaderWaited]
	if !ok {
		return 0 // not parsed: a failed parse allocates its error
	}
	us, _ := strconv.ParseInt(v, 10, 64)
	return time.Duration(us) * time.Microsecond
}

// bookedAt returns the booked slot of a copy (HeaderBooked).
func bookedAt(t *asynq.Task) (time.Time, bool) { return timeHeader(t, HeaderBooked) }

// dueAt returns the due time of an unbooked copy (HeaderDue).
func dueAt(t *asynq.Task) (time.Time, bool) { return timeHeader(t, HeaderDue) }

// timeHeader reads a header holding Unix microseconds.
func timeHeader(t *asynq.Task, name string) (time.Time, bool) {
	v, ok := t.Headers()[name]
	if !ok {
		return time.Time{}, false
	}
	us, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMicro(us), true
}

// formatID is the ID of round n's copy of the task whose first ID is origin.
func formatID(origin string, n int) string { return origin + "~" + strconv.Itoa(n) }
