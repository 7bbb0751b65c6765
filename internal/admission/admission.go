// Package admission holds the middleware's admission plan (Plan: what a
// task does at each step of its admission) and the timing constants of
// that path, so that the middleware and the simulator that imitates it
// (cmd/internal/simulate) cannot drift apart.
//
// Foundation layer, imported by taskrl and cmd/internal/simulate.
package admission

import "time"

// TaskCheckInterval is asynq's default Config.TaskCheckInterval: an idle
// worker looks for pending tasks after sleeping between half and one and a
// half of it.
const TaskCheckInterval = time.Second

// PaceLead is how long before its slot the pacer moves a booked copy to
// pending for workers whose asynq TaskCheckInterval is check (0: asynq's
// default): longer than an idle worker sleeps between two looks, 1.5
// check, plus 100ms, so that some worker has picked the copy up by its
// slot and waits for it in the worker. A shorter check costs idle polling
// and gives a shorter lead (a copy holds a worker slot for less time).
func PaceLead(check time.Duration) time.Duration {
	if check <= 0 {
		check = TaskCheckInterval
	}
	return check*3/2 + 100*time.Millisecond
}

// EarlyBooking is how far before its slot a booked copy may arrive and
// wait for it in the worker: the pace lead and a margin, or twice the
// longest hold if that is longer. An earlier copy is rescheduled again.
func EarlyBooking(lead, maxHold time.Duration) time.Duration {
	return max(lead+250*time.Millisecond, 2*maxHold)
}

const (
	// LateBooking is how far past its slot a booked copy may start; a
	// later one gives its booking back and decides again.
	LateBooking = 25 * time.Millisecond
	// SlotRetry is how long after a busy concurrency slot a task that
	// cannot wait for it in the worker is tried again.
	SlotRetry = time.Second
	// NextPoll is how often a task whose flow gets the next slot of a fair
	// concurrency rule asks for it while it waits in the worker: the slot
	// is kept for that flow, so it must not stay free long.
	NextPoll = 20 * time.Millisecond
	// AdaptiveReserve is how far ahead a task with an adaptive rule is
	// booked at most: a booking keeps the rate it was made at, so after a
	// cut the bookings beyond it are decided again (quotas.Limiter.Held);
	// the shorter the horizon, the fewer they are.
	AdaptiveReserve = time.Second
)
